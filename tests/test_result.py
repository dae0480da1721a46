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
