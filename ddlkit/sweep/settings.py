"""The sweep launcher's settings (``hydra.launcher.*``, which ddlkit's config fills from ``sweep.*``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

#: report sort keys -> whether larger is better (sorted first)
SORT_KEYS: dict[str, bool] = {"best_top1": True, "final_loss": False, "images_per_sec": True, "duration_s": False}

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


@dataclass(frozen=True)
class SweepSettings:
    max_parallel: int = 2
    on_failure: str = "keep-going"
    sort_by: str = "best_top1"
    poll_interval_s: float = 0.05
    dry_run: bool = False

    def policy(self, prefix: str) -> FailurePolicy:
        """Check every setting; errors name the keys as the user set them (``prefix``: sweep or hydra.launcher)."""
        if self.max_parallel < 1:
            raise ConfigError(f"{prefix}.max_parallel={self.max_parallel} is invalid: it must be a positive integer.")
        if self.sort_by not in SORT_KEYS:
            raise ConfigError(f"{prefix}.sort_by={self.sort_by} is invalid: it must be one of "
                              f"{', '.join(SORT_KEYS)}.")
        if not self.poll_interval_s > 0:
            raise ConfigError(f"hydra.launcher.poll_interval_s={self.poll_interval_s} is invalid: it must be positive.")
        try:
            return FailurePolicy.parse(self.on_failure)
        except ValueError as err:
            raise ConfigError(f"{prefix}.on_failure={self.on_failure} is invalid: it must be {err}.") from None
