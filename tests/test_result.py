"""ddlkit.result: its table is what Run.result writes, key for key, in order and type."""

from __future__ import annotations

import time

from ddlkit.result import FIELDS

SMALL = ("data.length=320", "data.val_length=64", "data.num_classes=10", "trainer.log_every=5")


def test_the_table_is_what_run_result_writes(run_inprocess) -> None:
    out = run_inprocess(*SMALL)
    result = out.result  # as result.json holds it: its values' types are what readers get
    written, table = list(out.run.result("completed")), [f.name for f in FIELDS]  # result.json sorts its keys
    assert set(written) - set(table) == set(), "Run.result writes keys that ddlkit.result.FIELDS lacks"
    assert set(table) - set(written) == set(), "ddlkit.result.FIELDS names keys that Run.result does not write"
    assert written == table, "ddlkit.result.FIELDS is not in the order Run.result writes"
    wrong = {
        f.name: type(result[f.name]).__name__
        for f in FIELDS
        if result[f.name] is not None and not isinstance(result[f.name], f.type)
    }
    assert wrong == {}, "values of another type than the table says"


def test_startup_says_when_the_rank_started_and_reached_each_phase(run_factory) -> None:
    # a real rank process (a worker in the test's own process would count from pytest's start)
    before = time.time()
    out = run_factory(*SMALL, "trainer.max_steps=2").assert_success()
    startup = out.result["startup_s"]
    assert before <= startup.pop("started_at") <= time.time()
    phases = ["worker started", "ranks connected", "plugins loaded", "first step done"]
    assert [startup[p] for p in phases] == sorted(startup[p] for p in phases), startup  # in the order reached
    assert 0 < startup["worker started"] and startup["first step done"] < out.result["wall_time_s"] + 60, startup


def test_peak_memory_is_the_rank_process_peak_resident_set(run_factory) -> None:
    # real rank processes: the second holds 200 MiB more while it trains, which its peak RSS shows
    small = ("framework=fake", *SMALL, "trainer.max_steps=2", "trainer.validate=false")
    plain = run_factory(*small).assert_success().result
    holding = run_factory(*small, "framework.hold_mib=200").assert_success().result
    assert (plain["peak_memory"], holding["peak_memory"]) == ("rss", "rss")
    assert 0 < plain["peak_memory_mib"] and round(plain["peak_memory_mib"], 1) == plain["peak_memory_mib"]
    assert holding["peak_memory_mib"] - plain["peak_memory_mib"] > 190, (plain, holding)


class _Ranks:
    """A DistView's allgather as a job of several ranks answers it: these ranks' values, this rank's first."""

    def __init__(self, *others: list[float | None]) -> None:
        self.others = others

    def allgather(self, obj: list[float | None]) -> list[list[float | None]]:
        return [obj, *self.others]


def test_the_peak_memory_is_the_largest_over_the_ranks_and_the_device_s_where_every_rank_reports_one(
    monkeypatch, capsys
) -> None:
    from ddlkit.rank import memory

    assert (memory.rss_peak_mib() or 0) > 0  # this process's, in MiB
    monkeypatch.setattr(memory, "rss_peak_mib", lambda: 100.04)
    peak = memory.peak_over_ranks
    assert peak(_Ranks([1000.06, None]), None) == (1000.1, "rss")
    assert peak(_Ranks([1.0, None]), None) == (100.0, "rss")
    # a GPU framework's number, on every rank: the device's peak, not the process's
    assert peak(_Ranks([1.0, 5000.0]), lambda: 3000.0) == (5000.0, "device")
    assert peak(_Ranks([1.0, 2000.0]), 3000.04) == (3000.0, "device")
    # a rank without one: the ranks' peaks compare only as RSS
    assert peak(_Ranks([1.0, None]), lambda: 3000.0) == (100.0, "rss")

    def broken() -> float:
        raise RuntimeError("no CUDA context")

    assert peak(_Ranks(), broken) == (100.0, "rss")
    assert "peak device memory could not be read (RuntimeError: no CUDA context)" in capsys.readouterr().err
