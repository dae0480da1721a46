"""The sweep launcher's settings (``hydra.launcher.*``, which ddlkit's config fills from ``sweep.*``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...config import SweepConfig, SweepEarlyStoppingConfig
from ...errors import ConfigError
from ...result import HEADLINE, LEDGER, MAXIMIZE, MINIMIZE

#: report sort keys -> whether larger is better (sorted first): the report's result columns, by
#: name, and how long a job ran
SORT_KEYS: dict[str, bool] = {
    **{f.name: f.direction == MAXIMIZE for f in sorted(HEADLINE, key=lambda f: f.name)},
    "duration_s": False,
}
#: result fields a search sweeper can optimize (``sweep.objective``), each with its natural direction
#: (``sweep.direction=auto``); the other fields a sweep's ledger keeps need ``sweep.direction`` set
OBJECTIVE_DIRECTIONS: dict[str, str] = {f.name: f.direction for f in LEDGER if f.direction is not None}
DIRECTIONS = (MAXIMIZE, MINIMIZE)
#: Hydra's own sweeper, which enumerates values and optimizes nothing
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"

#: Optuna's sweeper with a pruner (hydra_plugins/ddlkit_optuna)
PRUNING_SWEEPER = "optuna_pruning"

_RETRY = re.compile(r"^retry:(\d+)$")


@dataclass(frozen=True)
class FailurePolicy:
    """What a job's failure does to the rest of the sweep."""

    #: keep-going: the other jobs run on; fail-fast: cancel the running jobs and start no other
    stop_on_failure: bool = False
    #: re-runs of a failed job (in its own directory, so it resumes from its checkpoint) before it counts as failed
    retries: int = 0

    @classmethod
    def parse(cls, text: str) -> FailurePolicy:
        if text == "keep-going":
            return cls()
        if text == "fail-fast":
            return cls(stop_on_failure=True)
        if match := _RETRY.match(text):
            return cls(retries=int(match.group(1)))
        raise ValueError("keep-going, fail-fast or retry:N (N a whole number, e.g. retry:2)")

    def __str__(self) -> str:
        if self.retries:
            return f"retry:{self.retries}"
        return "fail-fast" if self.stop_on_failure else "keep-going"


@dataclass
class SweepSettings(SweepConfig):
    """The launcher's settings: ``sweep.*`` (:class:`ddlkit.config.SweepConfig`, whose defaults
    are the only ones: the Hydra launcher's conf leaves every setting it is not given null), and
    what only the launcher has."""

    #: seconds between two looks at the status of a running job whose compute target sets no pace
    status_interval_s: float = 0.05
    #: expand, compose and validate every job and print them, run nothing (what `ddlkit plan` sets)
    dry_run: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.early_stopping, SweepEarlyStoppingConfig):  # the launcher's conf: a DictConfig
            from omegaconf import DictConfig, OmegaConf

            given = self.early_stopping
            values = OmegaConf.to_container(given, resolve=True) if isinstance(given, DictConfig) else given
            self.early_stopping = SweepEarlyStoppingConfig(**(values or {}))  # type: ignore[arg-type]

    def stopping_options(self, sweeper_name: str) -> SweepEarlyStoppingConfig | None:
        """``sweep.early_stopping`` when it stops trials (None: every trial runs to its end)."""
        options = self.early_stopping
        if sweeper_name == PRUNING_SWEEPER and options.scheduler != "optuna":
            raise ConfigError(
                f"hydra/sweeper={PRUNING_SWEEPER} prunes the trials its study asks for: set "
                "sweep.early_stopping.scheduler=optuna (and its metric, grace: the trials report at every grace)."
            )
        if options.scheduler == "none":
            return None
        if options.scheduler == "optuna" and sweeper_name != PRUNING_SWEEPER:
            raise ConfigError(
                f"sweep.early_stopping.scheduler=optuna lets an Optuna study's pruner stop trials: select "
                f"hydra/sweeper={PRUNING_SWEEPER} (Optuna's sweeper with hydra.sweeper.pruner)."
            )
        if options.scheduler != "optuna" and sweeper_name != "basic":
            raise ConfigError(
                f"sweep.early_stopping.scheduler={options.scheduler} stops the trials of a grid (the basic "
                f"sweeper); hydra/sweeper={sweeper_name} chooses its own trials. Use its pruners instead: "
                f"hydra/sweeper={PRUNING_SWEEPER} sweep.early_stopping.scheduler=optuna."
            )
        return options

    def policy(self, prefix: str) -> FailurePolicy:
        """Check every setting; errors name the keys as the user set them (``prefix``: sweep or hydra.launcher)."""
        if self.max_parallel < 1:
            raise ConfigError(f"{prefix}.max_parallel={self.max_parallel} is invalid: it must be a positive integer.")
        if self.sort_by not in SORT_KEYS:
            raise ConfigError(f"{prefix}.sort_by={self.sort_by} is invalid: it must be one of {', '.join(SORT_KEYS)}.")
        if not self.status_interval_s > 0:
            raise ConfigError(
                f"hydra.launcher.status_interval_s={self.status_interval_s} is invalid: it must be positive."
            )
        try:
            return FailurePolicy.parse(self.on_failure)
        except ValueError as err:
            raise ConfigError(f"{prefix}.on_failure={self.on_failure} is invalid: it must be {err}.") from None

    def objective_for(self, sweeper: Any, sweeper_name: str) -> str | None:
        """Check ``sweep.objective`` and ``sweep.direction`` against the sweeper (``hydra.sweeper``,
        selected as ``hydra/sweeper=<sweeper_name>``); the objective, or None for the basic sweeper
        without one."""
        from .ledger import RESULT_FIELDS

        search = sweeper is not None and sweeper.get("_target_") != BASIC_SWEEPER
        fields = ", ".join(RESULT_FIELDS)
        if self.objective is None:
            if search:
                raise ConfigError(
                    f"hydra/sweeper={sweeper_name} searches for the best value of one number: name "
                    f"it with sweep.objective=<a result field> ({fields})."
                )
            return None
        if self.objective not in RESULT_FIELDS:
            raise ConfigError(
                f"sweep.objective={self.objective} is no field of a job's result: choose one of {fields}."
            )
        direction = OBJECTIVE_DIRECTIONS.get(self.objective) if self.direction == "auto" else self.direction
        if direction not in DIRECTIONS:
            raise ConfigError(
                f"sweep.direction={self.direction} is invalid for sweep.objective={self.objective}: it "
                "must be maximize or minimize"
                + (" (auto knows no direction for that field)." if self.direction == "auto" else ".")
            )
        wanted = _sweeper_direction(sweeper) if search else None
        if wanted is not None and wanted != direction:
            raise ConfigError(
                f"hydra/sweeper={sweeper_name} will {wanted} sweep.objective={self.objective}, "
                f"which is to be {direction}d: add hydra.sweeper.direction={direction}, or set "
                f"sweep.direction={wanted}."
            )
        return self.objective


def check_sweeper(sweeper: Any) -> None:
    """A search sweeper's own settings that would end the search with no trial run (Optuna then
    fails with "No trials are completed yet")."""
    from omegaconf import OmegaConf

    trials = OmegaConf.select(sweeper, "n_trials", default=None) if sweeper is not None else None
    if isinstance(trials, int) and trials < 1:
        raise ConfigError(f"hydra.sweeper.n_trials={trials} is invalid: it must be at least 1 (the trials to run).")


def _sweeper_direction(sweeper: Any) -> str | None:
    """The direction a search sweeper's config asks for: Optuna's ``direction``, Nevergrad's
    ``optim.maximize``, Ax's ``ax_config.experiment.minimize``; None when it says none."""
    from omegaconf import OmegaConf

    direction = OmegaConf.select(sweeper, "direction", default=None)
    if direction is not None:
        return str(getattr(direction, "name", direction))
    for key, meaning in (
        ("optim.maximize", ("minimize", "maximize")),
        ("ax_config.experiment.minimize", ("maximize", "minimize")),
    ):
        flag = OmegaConf.select(sweeper, key, default=None)
        if flag is not None:
            return meaning[bool(flag)]
    return None
