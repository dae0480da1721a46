"""Per-rank step telemetry and the straggler verdict (issue 42, items 1-2), on numbers: how a
rank's own time is told from its waits, when a rank is named, with which phase, and when not."""

from __future__ import annotations

import time

import pytest

from ddlkit.rank.control_plane import _verdict
from ddlkit.rank.telemetry import StepTelemetry, StragglerWatch, own_time, rank_table


def window(wall: float, data: float = 0.001, sync: float = 0.0, steps: int = 10) -> dict[str, float]:
    compute = wall - data - sync
    return {
        "steps": steps,
        "wall": wall,
        "data": data,
        "compute": compute,
        "sync": sync,
        "other": 0.0,
        "images_per_sec": 32 / wall,
    }


def even(n: int, wall: float = 0.1) -> list[dict[str, float]]:
    """n ranks that keep pace: each waits a little for the others."""
    return [window(wall, sync=0.01) for _ in range(n)]


def slowed(n: int, rank: int, factor: float, phase: str = "compute") -> list[dict[str, float]]:
    """rank computes (or waits for data) ``factor`` times as long as the others, which wait for it:
    every rank's step takes as long as the slow rank's (synchronous training), only the waits differ."""
    own = 0.09
    wall = own * factor + 0.002
    out = []
    for r in range(n):
        s = window(wall, sync=wall - own * (factor if r == rank else 1.0))
        if r == rank and phase == "data":
            extra = own * (factor - 1)
            s["data"] += extra
            s["compute"] -= extra
        out.append(s)
    return out


def test_a_slow_rank_is_named_once_with_the_phase_that_makes_the_difference_and_cleared_when_it_recovers() -> None:
    watch = StragglerWatch(factor=1.2, window=50, nodes=[0, 0, 1, 1])
    said: list[str] = []
    step = 0
    for _ in range(3):  # 30 steps that keep pace: too few to judge, and nothing to say
        step += 10
        said += watch.observe(step, even(4))
    assert said == []
    for _ in range(6):
        step += 10
        said += watch.observe(step, slowed(4, 2, 1.1, phase="data"))
    for _ in range(3):  # 30 % slower, waiting for its data: named once, within the window
        step += 10
        said += watch.observe(step, slowed(4, 2, 1.1 + 0.2 * 1.5, phase="data"))
    assert len(said) == 1, said
    assert said[0].startswith("ddlkit: rank 2 on node 1 is "), said
    assert "data wait is" in said[0], said
    assert watch.current.keys() == {2}
    for _ in range(8):  # it keeps pace again
        step += 10
        said += watch.observe(step, even(4))
    assert said[-1] == f"ddlkit: rank 2 keeps pace with the others again (step {watch.episodes[0].until})", said
    assert watch.current == {}
    (episode,) = watch.record()
    assert episode["rank"] == 2 and episode["node"] == 1 and episode["phase"] == "data"
    assert episode["slower_pct"] >= 20 and episode["until"] is not None


def test_ranks_that_only_differ_in_how_long_they_wait_are_not_stragglers() -> None:
    """The ranks that wait for a slow one have long steps too: only their own time counts."""
    watch = StragglerWatch(factor=1.2, window=20)
    said = []
    for step in range(10, 200, 10):
        said += watch.observe(step, slowed(3, 0, 1.15))  # 15 % slower: under the factor
    assert said == [] and watch.record() == []


def test_a_slow_compute_rank_is_named_with_compute_and_two_ranks_compare_with_each_other() -> None:
    watch = StragglerWatch(factor=1.2, window=20)
    said = []
    for step in range(10, 60, 10):
        said += watch.observe(step, slowed(2, 1, 1.5))
    assert len(said) == 1 and "rank 1 on node 0 is 50 % slower" in said[0] and "compute is" in said[0], said


def test_step_telemetry_splits_a_step_into_its_own_time_and_its_waits() -> None:
    class Plane:
        wait_s = 0.0

    plane = Plane()
    clock = StepTelemetry(local_batch=8, sync_clock=plane)
    clock.tick()  # the first step of a start has no wall time to share
    for _ in range(4):
        with clock.phase("data"):
            time.sleep(0.01)
        with clock.phase("step"):
            time.sleep(0.02)
            with clock.waiting():
                time.sleep(0.01)
        plane.wait_s += 0.005  # a control-plane collective in step_end
        clock.tick()
    s = clock.summary()
    assert s["steps"] == 4
    assert s["data"] == pytest.approx(0.01, abs=0.008)
    assert s["sync"] == pytest.approx(0.015, abs=0.008)
    assert s["compute"] == pytest.approx(0.02, abs=0.008)
    assert own_time(s) == pytest.approx(s["wall"] - s["sync"])
    assert s["images_per_sec"] == pytest.approx(8 / s["wall"], rel=0.01)
    assert clock.summary()["steps"] == 0  # the counters start again
    (row,) = rank_table([{"t": s, "node": 0, "host": "h"}])
    assert row["data_wait"] == pytest.approx(s["data"] / s["wall"], abs=1e-4)


def test_a_hang_report_names_the_rank_that_is_not_where_the_others_wait() -> None:
    step_ = "the training step"
    answers = {
        0: {"step": 121, "where": step_, "op": "`any` #130", "file": "hang/rank-0.txt"},
        1: {"step": 121, "where": step_, "op": "`any` #130", "file": "hang/rank-1.txt"},
        3: {"step": 120, "where": "waiting for the next batch", "op": "", "file": "hang/rank-3.txt"},
    }
    lines = _verdict(answers, [2], {2: (0.0, 120)}, [1, 3], took=0.4)
    assert lines[0] == "ddlkit: stacks of rank(s) 0, 1, 3 written to hang/ in 0.4 s"
    assert lines[1] == "ddlkit: rank(s) 0, 1 wait in the training step (`any` #130) at step 121"
    assert lines[2].startswith("ddlkit: rank 2 does not answer (at step 120 when last heard from;")
    assert lines[3] == (
        "ddlkit: rank 3 is not where the others wait: it is in waiting for the next batch at step 120 "
        "(its stacks: hang/rank-3.txt)"
    )
