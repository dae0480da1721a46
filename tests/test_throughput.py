"""Images/sec as tf_cnn_benchmarks measures it: warm-up steps and paused time excluded."""

from __future__ import annotations

import pytest

from ddlkit.rank import throughput
from ddlkit.rank.throughput import ThroughputMeter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(throughput.time, "perf_counter", fake)
    return fake


def ticks(meter: ThroughputMeter, clock: Clock, *times: float) -> None:
    for t in times:
        clock.now = t
        meter.tick()


def test_warmup_steps_are_excluded(clock: Clock) -> None:
    meter = ThroughputMeter(global_batch=64, warmup_steps=3)
    ticks(meter, clock, 1.0, 11.0, 21.0)  # slow first steps: compilation, cache warm-up
    assert (meter.measured_steps, meter.images_per_sec) == (0, 0.0)
    ticks(meter, clock, 21.5, 22.0, 22.5, 23.0)
    assert meter.measured_steps == 4
    assert meter.images_per_sec == pytest.approx(4 * 64 / 2.0)


def test_paused_time_is_excluded_without_a_second_warmup(clock: Clock) -> None:
    meter = ThroughputMeter(global_batch=10, warmup_steps=1)
    ticks(meter, clock, 0.0, 1.0, 2.0)  # warm-up, then 2 steps in 2 s
    meter.pause()  # validation and a checkpoint take 100 s
    ticks(meter, clock, 102.0)  # restarts the clock: its duration includes the pause, so it is not counted
    ticks(meter, clock, 103.0, 104.0)
    assert meter.measured_steps == 4
    assert meter.measured_time == pytest.approx(4.0)
    assert meter.images_per_sec == pytest.approx(10.0)


def test_pause_during_warmup_ends_the_warmup(clock: Clock) -> None:
    meter = ThroughputMeter(global_batch=10, warmup_steps=5)
    ticks(meter, clock, 0.0, 1.0)
    meter.pause()
    ticks(meter, clock, 50.0, 50.5)
    assert meter.measured_steps == 1 and meter.images_per_sec == pytest.approx(20.0)


def test_recent_rate_covers_the_steps_since_the_last_call(clock: Clock) -> None:
    meter = ThroughputMeter(global_batch=10, warmup_steps=0)
    ticks(meter, clock, 0.0, 1.0)
    assert meter.recent_rate() == pytest.approx(10.0)  # first call: since the first step
    ticks(meter, clock, 1.25, 1.5, 1.75, 2.0)
    assert meter.recent_rate() == pytest.approx(40.0)
    assert meter.images_per_sec == pytest.approx(5 * 10 / 2.0)


def test_the_first_progress_line_has_a_rate_during_warmup(clock: Clock) -> None:
    """Issue 22, item 8: a resumed run (a fresh meter) showed img/s 0.0 until its warm-up ended."""
    meter = ThroughputMeter(global_batch=10, warmup_steps=5)
    ticks(meter, clock, 0.0)
    assert meter.recent_rate() is None  # one step: nothing to time yet
    ticks(meter, clock, 1.0, 2.0)
    assert meter.recent_rate() == pytest.approx(10.0)
    meter.pause()
    ticks(meter, clock, 100.0, 100.5)
    assert meter.recent_rate() == pytest.approx(20.0)  # the pause is not in the window
