"""``trainer.profile`` (issue 42, item 4), the core's side (:mod:`ddlkit.rank.profiling`): when the
run makes, steps and stops a framework's :class:`ddlkit.Profiler`, what it says, and the checks at
launch. The real profilers are tested in their plugins (``test_profiling.py`` of ddlkit-pytorch,
ddlkit-tensorflow and ddlkit-keras); here a profiler that records what the window asks of it, and
the fake framework, which has none."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import open_dict

import ddlkit
from ddlkit import ConfigError
from ddlkit.launch.validate import validate
from ddlkit.plugins import DdlkitPluginManager
from ddlkit.profiling import PROFILE_DIR
from ddlkit.rank.profiling import ProfileWindow
from ddlkit.registry import Registry
from ddlkit.testing import RunFactory, add_plugin, compose, fakes, make_run, with_default_framework

#: 320 images in global batches of 32: 10 steps per epoch
SMALL = ("data.length=320", "data.val_length=32", "trainer.batch_size=32", "logger=[]")


class Recording(ddlkit.Profiler):
    """What the window asked, with the run's step count at each call."""

    def __init__(self, run: ddlkit.Run, *, fail_stop: bool = False) -> None:
        self.run, self.fail_stop = run, fail_stop
        self.calls: list[tuple] = []

    def start(self, steps: range) -> None:
        self.calls.append(("start", steps, self.run.state.step))

    def step(self, step: int) -> None:
        self.calls.append(("step", step, self.run.state.step))

    def stop(self) -> None:
        self.calls.append(("stop", self.run.state.step))
        if self.fail_stop:
            raise OSError("disk full")


def _recorded(run: ddlkit.Run, first: int, last: int, **kwargs: bool) -> Recording:
    """Give ``run`` the window of steps ``first``-``last`` that ``trainer.profile`` makes, whose
    framework's profiler records."""
    profiler = Recording(run, **kwargs)
    with open_dict(run.cfg.trainer):
        run.cfg.trainer.profile.start_step, run.cfg.trainer.profile.num_steps = first, last - first + 1
    window = ProfileWindow.of(run)
    assert window is not None
    window._make = lambda r, d: profiler  # the fake framework has no profiler
    run.profile = window
    return profiler


def test_off_by_default_there_is_no_window(ddlkit_pm: DdlkitPluginManager, tmp_path: Path) -> None:
    assert make_run(ddlkit_pm, tmp_path / "a", *SMALL).profile is None
    assert make_run(ddlkit_pm, tmp_path / "b", *SMALL, "trainer.profile.start_step=0").profile is None


def test_the_window_starts_before_its_first_step_and_stops_after_its_last(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(ddlkit_pm, tmp_path / "job", *SMALL, "trainer.profile.start_step=3", "trainer.profile.num_steps=3")
    assert run.profile is not None and (run.profile.first, run.profile.last) == (3, 5)
    profiler = _recorded(run, 3, 5)
    run.start()
    for _ in range(8):
        run.step_end(loss=1.0, lr=0.1)
    # made and started once step 2 is done; marked between 3|4 and 4|5; stopped once step 5 is done
    assert profiler.calls == [("start", range(3, 6), 2), ("step", 3, 3), ("step", 4, 4), ("stop", 5)]
    out = capsys.readouterr().out
    assert (
        "ddlkit: profile of steps 3-5 written to profile/ (open with TensorBoard's profile plugin or "
        "https://ui.perfetto.dev)" in out
    )
    # the window's steps, and the one after it (the trace was written then), are not the run's speed:
    # the clock restarts after step 5, so steps 7 and 8 are measured
    assert run.meter.measured_steps == 2


def test_a_window_from_the_first_step_starts_with_the_run(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(ddlkit_pm, tmp_path / "job", *SMALL)
    profiler = _recorded(run, 1, 2)
    run.start()
    assert profiler.calls == [("start", range(1, 3), 0)]
    run.step_end(loss=1.0, lr=0.1)
    run.step_end(loss=1.0, lr=0.1)
    assert profiler.calls[1:] == [("step", 1, 1), ("stop", 2)]
    # the clock had not started: the meter's first tick was still the run's first step
    assert "first step done" in capsys.readouterr().out


def test_a_run_that_ends_inside_the_window_writes_what_it_recorded(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(ddlkit_pm, tmp_path / "job", *SMALL)
    profiler = _recorded(run, 2, 6)
    run.start()
    for _ in range(3):
        run.step_end(loss=1.0, lr=0.1)
    run.finish("failed")
    assert profiler.calls[-1] == ("stop", 3)
    assert "ddlkit: profile of steps 2-3 written to profile/" in capsys.readouterr().out


def test_a_run_resumed_past_the_window_start_profiles_nothing(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(ddlkit_pm, tmp_path / "job", *SMALL)
    profiler = _recorded(run, 3, 4)
    run.state.step = 3  # what a checkpoint of step 3 restores
    run.start()
    for _ in range(3):
        run.step_end(loss=1.0, lr=0.1)
    assert profiler.calls == []
    assert "ddlkit: resumed after step 3: trainer.profile's steps 3-4 are not profiled" in capsys.readouterr().out


def test_a_profiler_that_fails_to_write_does_not_stop_the_training(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(ddlkit_pm, tmp_path / "job", *SMALL)
    profiler = _recorded(run, 1, 1, fail_stop=True)
    run.start()
    for _ in range(3):
        run.step_end(loss=1.0, lr=0.1)
    assert profiler.calls == [("start", range(1, 2), 0), ("stop", 1)] and run.state.step == 3
    err = capsys.readouterr().err
    assert "ddlkit: warning: rank 0: the profile of steps 1-1 was not written (OSError: disk full)" in err


def _checked(pm: DdlkitPluginManager, *overrides: str) -> dict:
    add_plugin(pm, fakes, name=fakes.__name__)
    registry = Registry.collect(pm)
    return validate(compose(registry, with_default_framework(overrides)), registry, pm)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.epochs=2", "trainer.profile.start_step=19", "trainer.profile.num_steps=3"],
            "trainer.profile.start_step=19 with trainer.profile.num_steps=3 profiles steps 19-21, past the run's "
            "last step 20 (2 epochs x 10 steps): lower trainer.profile.start_step or trainer.profile.num_steps.",
        ),
        (
            ["trainer.max_steps=6", "trainer.profile.start_step=6", "trainer.profile.num_steps=2"],
            "trainer.profile.start_step=6 with trainer.profile.num_steps=2 profiles steps 6-7, past the run's "
            "last step 6 (trainer.max_steps): lower trainer.profile.start_step or trainer.profile.num_steps.",
        ),
        (
            ["trainer.profile.start_step=-1"],
            "trainer.profile.start_step=-1 is invalid: it must be null, 0 (off) or a step number >= 1.",
        ),
        (
            ["trainer.profile.start_step=2", "trainer.profile.num_steps=0"],
            "trainer.profile.num_steps=0 is invalid: it must be a positive integer.",
        ),
    ],
)
def test_a_window_the_run_cannot_hold_is_refused_at_launch(
    ddlkit_pm: DdlkitPluginManager, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _checked(ddlkit_pm, *SMALL, *overrides)
    assert str(info.value) == message


def test_a_window_that_fits_exactly_passes(ddlkit_pm: DdlkitPluginManager) -> None:
    _checked(ddlkit_pm, *SMALL, "trainer.epochs=2", "trainer.profile.start_step=16", "trainer.profile.num_steps=5")


def test_the_ranks_check_the_window_against_the_steps_they_count(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path
) -> None:
    """Where the data source states no length, only the ranks know the run's steps."""
    run = make_run(ddlkit_pm, tmp_path / "job", *SMALL, "trainer.profile.start_step=8", "trainer.profile.num_steps=3")
    run.total_steps = 9  # a data set of 9 steps per epoch, read by the rank
    with pytest.raises(ConfigError, match=r"profiles steps 8-10, past the run's last step 9:"):
        ProfileWindow.of(run)


def test_the_fake_framework_has_no_profiler_and_the_run_goes_on(tmp_path: Path) -> None:
    outcome = RunFactory(tmp_path)(
        *SMALL, "trainer.max_steps=5", "trainer.profile.start_step=2", "trainer.profile.num_steps=2"
    ).assert_success()
    assert "ddlkit: framework=fake has no profiler: trainer.profile (steps 2-3) is ignored" in outcome.stdout
    assert outcome.result["steps"] == 5
    assert outcome.job_dir is not None and not (outcome.job_dir / PROFILE_DIR).exists()


def test_a_window_past_the_end_is_one_line_and_exit_2(tmp_path: Path) -> None:
    RunFactory(tmp_path)(
        *SMALL, "trainer.max_steps=5", "trainer.profile.start_step=5", "trainer.profile.num_steps=2"
    ).assert_one_line_error("profiles steps 5-6, past the run's last step 5 (trainer.max_steps)")
