"""Weights & Biases: one W&B run per job, logged from rank 0.

    ddlkit 'logger=[console,jsonl,wandb]' logger.wandb.project=resnets
    ddlkit -m 'logger=[console,wandb]' optimizer.lr=0.1,0.05          # one run per job, grouped by sweep

- **One W&B run per job**, its files in `<job dir>/wandb/`. The run id is kept in
  `<job dir>/wandb/ddlkit-run-id`, so a resumed, restarted or retried job continues the same run.
- **Rewound on resume**: a job that resumes from a checkpoint rewinds the run to the checkpoint's
  step (`wandb.init(resume_from="<id>?_step=<step>")`). W&B refuses a step below its run's latest,
  so without it the run would keep the interrupted attempt's records after the checkpoint and
  ignore the ones the resumed job logs for those steps. Offline, the rewind is recorded in the
  attempt's `.wandb` file and `wandb sync` applies it. Rewinding is a W&B preview feature: where
  the server refuses it, the run continues where it stands and the job says so
  (`logger.wandb.rewind=false`: never ask). W&B's summary gets `restarts` and `steps_lost` with
  the rest of `result.json`.
- **Grouped by sweep**: under `ddlkit -m`, `group` defaults to the sweep's name (from
  `DDLKIT_SWEEP_NAME`, which the sweep launcher sets for every job); the run's name is the job's.
- **Config**: the job's resolved config with every secret replaced by `***`, plus
  `ddlkit.environment` (Python, platform, packages, git commit from the job's
  `environment.json`), the job name, world size and sweep job number. W&B adds its own system
  information and system metrics.
- **Metrics**: `train/*` at every logging step, `val/*` after each validation; `result.json`'s
  fields in the run summary.
- **Model**: `logger.wandb.log_model=true` uploads `model.*` (the trained weights the framework
  saved, so `trainer.save_model=true`) as an artifact of type `model` when the job completed.
- **Always finished**: also when the job fails (exit code 1) or is interrupted (75).
- **Online or offline**: `logger.wandb.mode=auto` (the default) is online when an API key is
  configured (`WANDB_API_KEY`, `wandb login`'s `~/.netrc` entry, or `logger.wandb.api_key`, which
  ddlkit keeps out of job files and passes to the rank in its secret environment) and offline
  otherwise; `wandb sync <job dir>/wandb/offline-run-*` uploads an offline run later.
  `WANDB_MODE` in the environment wins over `auto`.

Keeping the key out of a remote job altogether (log offline, sync later) is discussed for each
target that has no secret channel of its own ([compute=azureml](../compute/azureml.md#secrets)).

## How it works

`wandb` is imported when a run starts, never when ddlkit composes a config or lists plugins. The
config is redacted by ddlkit's `split_secrets`. Offline, the rewind is the run record's
`branch_point` in the `.wandb` file. The plugin's tests (`cd plugins/ddlkit-wandb && python -m
pytest`) run a sweep offline and read the `.wandb` files back: one run per job, grouped, redacted,
finished.
"""

from __future__ import annotations

import json
import netrc
import os
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from omegaconf import OmegaConf

import ddlkit
from ddlkit.atomic import write_text
from ddlkit.jobdir import ENVIRONMENT_FILE, EXIT_COMPLETED, EXIT_PREEMPTED, SWEEP_JOB_ENV, SWEEP_NAME_ENV
from ddlkit.redact import split_secrets

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ddlkit import RunContext

MODES = ("auto", "online", "offline", "disabled")
#: where the job's W&B run id is kept, inside the job directory
RUN_ID_FILE = Path("wandb") / "ddlkit-run-id"
_EXIT_CODES = {"completed": EXIT_COMPLETED, "interrupted": EXIT_PREEMPTED}


@dataclass
class WandbConfig:
    # the W&B project
    project: str = "ddlkit"
    # team or user; null = your default entity
    entity: str | None = None
    # runs with the same group are shown together; null = the sweep's name under `ddlkit -m`, else none
    group: str | None = None
    # the run's display name; null = the job's name (`name` itself is ddlkit's: the option's name, wandb)
    run_name: str | None = None
    # the run's tags
    tags: list[str] = field(default_factory=list)
    # auto (online when an API key is configured, else offline), online, offline or disabled
    mode: str = "auto"
    # upload the trained model (model.* in the job directory) as a W&B artifact of type "model"
    log_model: bool = False
    # an API key, if not in WANDB_API_KEY or ~/.netrc; kept out of every file ddlkit writes
    api_key: str | None = None
    # a resumed job rewinds its W&B run to the checkpoint's step (a W&B preview feature: where the
    # server refuses it, the run continues where it stands, with a warning); false: never rewind
    rewind: bool = True


class WandbLogger(ddlkit.Logger):
    def configure(self, config: DictConfig) -> None:
        if find_spec("wandb") is None:
            raise ddlkit.ConfigError(
                "logger=wandb needs the wandb package: pip install wandb (or drop wandb from logger)."
            )
        if self.cfg.mode not in MODES:
            raise ddlkit.ConfigError(
                f"logger.wandb.mode={self.cfg.mode} is invalid: it must be one of {', '.join(MODES)}."
            )
        if self.cfg.log_model and not config.trainer.save_model:
            raise ddlkit.ConfigError(
                "logger.wandb.log_model=true uploads the trained model, which "
                "trainer.save_model=false does not write; set one of them differently."
            )

    def start(self, run: RunContext) -> None:
        import wandb

        self.job_dir = run.job_dir
        config, _ = split_secrets(OmegaConf.to_container(run.cfg, resolve=True, enum_to_str=True))
        config["ddlkit"] = {
            "job": run.name,
            "job_dir": str(run.job_dir),
            "world_size": run.dist.world_size,
            "sweep": os.environ.get(SWEEP_NAME_ENV),
            "sweep_job": os.environ.get(SWEEP_JOB_ENV),
            "environment": _read_json(run.job_dir / ENVIRONMENT_FILE),
        }
        settings = wandb.Settings(api_key=self.cfg.api_key) if self.cfg.api_key else None
        options = dict(
            project=self.cfg.project,
            entity=self.cfg.entity,
            group=self.cfg.group or os.environ.get(SWEEP_NAME_ENV),
            name=self.cfg.run_name or run.name,
            tags=list(self.cfg.tags),
            job_type="train",
            config=config,
            dir=str(run.job_dir),
            mode=self._mode(),
            settings=settings,
        )
        # a resumed job whose earlier attempt started the run rewinds it to the step it resumes from:
        # W&B refuses a step below the run's latest, so merely resuming the run would keep the
        # interrupted attempt's records past the checkpoint and ignore this attempt's
        started = (run.job_dir / RUN_ID_FILE).is_file()
        run_id = self._run_id(run.job_dir)
        if started and run.resumed_at is not None and self.cfg.rewind:
            step = run.resumed_at.step
            try:
                self.wb = wandb.init(**options, resume_from=f"{run_id}?_step={step}")
                return
            except wandb.errors.Error as err:
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
                print(
                    f"ddlkit: logger.wandb: W&B did not rewind run {run_id} to step {step} ({reason}); it continues "
                    f"where it stands, with the interrupted attempt's records after step {step} (rewinding is a W&B "
                    "preview feature; logger.wandb.rewind=false skips asking)",
                    flush=True,
                )
        self.wb = wandb.init(**options, id=run_id, resume="allow")

    def _mode(self) -> str | None:
        """auto: None (wandb reads WANDB_MODE) when that is set, else online with a key, offline without."""
        if self.cfg.mode != "auto":
            return self.cfg.mode
        if os.environ.get("WANDB_MODE"):
            return None
        return "online" if self.cfg.api_key or os.environ.get("WANDB_API_KEY") or _netrc_has_key() else "offline"

    @staticmethod
    def _run_id(job_dir: Path) -> str:
        path = job_dir / RUN_ID_FILE
        if path.is_file():
            return path.read_text(encoding="utf-8").strip()
        run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
        write_text(path, run_id + "\n")
        return run_id

    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: str) -> None:
        self.wb.log({f"{split}/{key}": value for key, value in metrics.items()}, step=step)

    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        try:
            if result is not None:
                self.wb.summary.update(dict(result))
            if self.cfg.log_model and status == "completed":
                self._log_model()
        finally:
            self.wb.finish(exit_code=_EXIT_CODES.get(status, 1))

    def _log_model(self) -> None:
        import wandb

        models = sorted(p for p in self.job_dir.glob("model.*") if p.is_file())
        if not models:
            print(f"ddlkit: logger.wandb.log_model: the framework saved no model.* in {self.job_dir}", flush=True)
            return
        artifact = wandb.Artifact(
            re.sub(r"[^A-Za-z0-9._-]", "-", f"model-{self.wb.name}"),
            type="model",
            metadata={"job_dir": str(self.job_dir)},
        )
        for path in models:
            artifact.add_file(str(path))
        self.wb.log_artifact(artifact)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _netrc_has_key() -> bool:
    """Whether ``wandb login`` stored a key for the W&B host (in ~/.netrc, where it keeps it)."""
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
