"""``trainer.profile``'s window of optimizer steps, as the launcher checks it and the ranks run it
(:mod:`ddlkit.rank.profiling`): which steps it holds, and that the run reaches its last one."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

#: the job directory's folder of traces
PROFILE_DIR = "profile"


def window(profile: Any) -> tuple[int, int] | None:
    """``trainer.profile``'s first and last step, or None when it is off (start_step null or 0)."""
    if not profile.start_step:
        return None
    return profile.start_step, profile.start_step + profile.num_steps - 1


def check_window(profile: Any, total_steps: int, why: str = "") -> None:
    """A ConfigError when ``trainer.profile``'s window ends past the run's ``total_steps``
    (``why``: how that number comes about, for the message)."""
    steps = window(profile)
    if steps is None or steps[1] <= total_steps:
        return
    first, last = steps
    because = f" ({why})" if why else ""
    raise ConfigError(
        f"trainer.profile.start_step={first} with trainer.profile.num_steps={profile.num_steps} profiles "
        f"steps {first}-{last}, past the run's last step {total_steps}{because}: lower "
        "trainer.profile.start_step or trainer.profile.num_steps."
    )
