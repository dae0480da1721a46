"""ddlkit.result: its table is what Run.result writes, key for key, in order and type."""

from __future__ import annotations

from ddlkit.result import FIELDS

SMALL = ("data.length=320", "data.val_length=64", "data.num_classes=10", "trainer.log_every=5")


def test_the_table_is_what_run_result_writes(run_inprocess) -> None:
    out = run_inprocess(*SMALL)
    result = out.result  # as result.json holds it: its values' types are what readers get
    written, table = list(out.run.result("completed")), [f.name for f in FIELDS]  # result.json sorts its keys
    assert set(written) - set(table) == set(), "Run.result writes keys that ddlkit.result.FIELDS lacks"
    assert set(table) - set(written) == set(), "ddlkit.result.FIELDS names keys that Run.result does not write"
    assert written == table, "ddlkit.result.FIELDS is not in the order Run.result writes"
    wrong = {f.name: type(result[f.name]).__name__ for f in FIELDS
             if result[f.name] is not None and not isinstance(result[f.name], f.type)}
    assert wrong == {}, "values of another type than the table says"
