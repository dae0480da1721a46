"""``trainer.profile``: the framework's profiler over a window of optimizer steps.

``trainer.profile.start_step=20 trainer.profile.num_steps=5`` profiles steps 20-24 on every rank:
the run calls :meth:`ProfileWindow.step` once per optimizer step, which makes the framework's
:class:`~ddlkit.Profiler` (:meth:`ddlkit.Framework.profiler`) right before step 20, marks the steps
between, and stops it after step 24, when each rank writes its trace into the job directory's
``profile/``. A run that ends inside the window (a stop on request, a failure) still writes the
steps it recorded (:meth:`ProfileWindow.close`).

Off (the default) there is no window at all: the run holds None, and nothing is created. Outside
the window no profiler object exists; the window's steps, and the one after it (the trace is
written then), are left out of images/sec.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..profiling import PROFILE_DIR, check_window, window

if TYPE_CHECKING:
    from ..interfaces import Profiler, RunContext


def _pause(meter: Any) -> None:
    """Stop the images/sec clock, once it runs: before the first step there is nothing to stop, and
    the meter's first tick must still be the run's first step."""
    if meter.steps_seen:
        meter.pause()


class ProfileWindow:
    """The run's side of ``trainer.profile``: when to make, step and stop the framework's profiler."""

    def __init__(
        self,
        first: int,
        last: int,
        *,
        run: RunContext,
        make: Callable[[RunContext, Path], Profiler | None],
        out_dir: Path,
        pause: Callable[[], None],
    ) -> None:
        self.first, self.last = first, last
        self.run = run
        self._make = make
        self.out_dir = out_dir
        #: stops the images/sec clock: the window's steps are not the run's speed
        self._pause = pause
        self._profiler: Profiler | None = None
        #: the window is behind the run: recorded, skipped or not profiled at all
        self._over = False
        self._seen = False

    @classmethod
    def of(cls, run: Any) -> ProfileWindow | None:
        """The window of ``run.cfg.trainer.profile``, or None when it is off; a ConfigError when it
        ends past ``run.total_steps``."""
        profile = run.cfg.trainer.get("profile")
        steps = window(profile) if profile is not None else None
        if steps is None:
            return None
        check_window(profile, run.total_steps)
        return cls(
            *steps,
            run=run,
            make=run.framework.profiler,
            out_dir=Path(run.job_dir) / PROFILE_DIR,
            pause=functools.partial(_pause, run.meter),
        )

    @property
    def active(self) -> bool:
        return self._profiler is not None

    def step(self, done: int) -> None:
        """Optimizer step ``done`` has ended (0: training is about to start)."""
        if not self._seen:
            self._seen = True
            if done >= self.first:  # resumed past the window's start
                self._over = True
                self._say(f"resumed after step {done}: trainer.profile's steps {self._steps()} are not profiled")
                return
        if self._over:
            return
        if self._profiler is None:
            if done == self.first - 1:
                self._begin()
        elif done >= self.last:
            self._end(done)
        else:
            self._profiler.step(done)
            self._pause()

    def close(self) -> None:
        """The run ends: a window it is inside of is written with the steps done so far."""
        if self._profiler is not None:
            self._end(self.run.state.step)

    def _begin(self) -> None:
        framework = self.run.cfg.framework.name
        try:
            profiler = self._make(self.run, self.out_dir)
            if profiler is not None:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                profiler.start(range(self.first, self.last + 1))
        except Exception as exc:  # a diagnostic: it never stops the training
            self._over = True
            self._warn(f"the profiler of framework={framework} did not start ({type(exc).__name__}: {exc})")
            return
        if profiler is None:
            self._over = True
            self._say(f"framework={framework} has no profiler: trainer.profile (steps {self._steps()}) is ignored")
            return
        self._profiler = profiler
        self._pause()

    def _end(self, done: int) -> None:
        profiler, self._profiler = self._profiler, None
        self._over = True
        assert profiler is not None
        try:
            profiler.stop()
        except Exception as exc:  # a diagnostic: it never fails the run
            self._warn(f"the profile of steps {self._steps(done)} was not written ({type(exc).__name__}: {exc})")
            return
        finally:
            self._pause()
        if done >= self.first:
            self._say(
                f"profile of steps {self._steps(done)} written to {PROFILE_DIR}/ "
                "(open with TensorBoard's profile plugin or https://ui.perfetto.dev)"
            )

    def _steps(self, last: int | None = None) -> str:
        return f"{self.first}-{self.last if last is None else last}"

    def _say(self, text: str) -> None:
        if self.run.dist.is_main:
            print(f"ddlkit: {text}", flush=True)

    def _warn(self, text: str) -> None:
        print(f"ddlkit: warning: rank {self.run.dist.rank}: {text}", file=sys.stderr, flush=True)
