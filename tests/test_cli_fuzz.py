"""Fuzzing the command line (issue 17, item 23): whatever overrides a user types -- any key of any
group, unknown keys, wrong types, numbers out of range, strings with the shell's and Hydra's
special characters, added with ``+``/``++`` or deleted with ``~`` -- ``ddlkit`` ends with exit
status 0, or 2 and one line ``ddlkit: error: ...``: never a traceback, never a file written.

Each case runs ``ddlkit plan OVERRIDES`` in this process: the whole composition and validation
of a job, nothing run. The default budget is small, for every test run; CI runs it with
200 cases (about 100 s; hypothesis draws new ones each run), and a longer search is:

    DDLKIT_FUZZ_EXAMPLES=2000 python -m pytest tests/test_cli_fuzz.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlkit.launch.cli import main
from ddlkit.testing import FAKES_MODULE

#: cases per run: small by default (CI); set DDLKIT_FUZZ_EXAMPLES for a longer search
EXAMPLES = int(os.environ.get("DDLKIT_FUZZ_EXAMPLES", "30"))

#: keys of every group of the default config (with the fake framework), options of the groups, and near misses
KEYS = [
    "trainer.epochs",
    "trainer.batch_size",
    "trainer.max_steps",
    "trainer.log_every",
    "trainer.warmup_steps",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoints",
    "trainer.resume",
    "trainer.precision",
    "trainer.seed",
    "trainer.deterministic",
    "trainer.validate",
    "trainer.save_model",
    "optimizer.lr",
    "optimizer.momentum",
    "optimizer.weight_decay",
    "optimizer.nesterov",
    "optimizer.warmup_epochs",
    "optimizer.decay_epochs",
    "optimizer.label_smoothing",
    "data.image_size",
    "data.num_classes",
    "data.length",
    "data.val_length",
    "dist.timeout_s",
    "dist.warn_after_s",
    "dist.stop_check_every",
    "compute.grace_period_s",
    "storage.root",
    "framework.side",
    "framework.fail_at_step",
    "sweep.max_parallel",
    "sweep.on_failure",
    "sweep.sort_by",
    "sweep.objective",
    "model.name",
    "logger.console.summary",
    "trainer.batchsize",
    "data.lenght",
    "modle",
    "trainer",
    "optimizer.foo",
    "storage.sas_token",
    "hydra.run.dir",
    "hydra.job.chdir",
    "dist",
    "compute",
    "data",
    "sweep",
]
GROUPS = {
    "framework": ["fake", "pytorch", "nope"],
    "data": ["synthetic", "imagefolder", "x"],
    "compute": ["local", "elsewhere", "mycluster"],
    "storage": ["local", "memory", "s4"],
    "dist": ["none", "native", "horovod", "mpi"],
    "model": ["resnet18", "resnet50", "vgg"],
    "logger": ["[console]", "[]", "[console,nope]"],
    "experiment": ["smoke", "nope"],
}
VALUES = st.one_of(
    st.integers(min_value=-(10**13), max_value=10**13).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "false", "null", "fp8", "bf16", "[]", "[1,2]", "{a:1}", "''", "auto", "keep-going"]),
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
        | st.sampled_from(list("$();&'\"[]{},=\\ ")),
        max_size=12,
    ),
)
OVERRIDE = st.one_of(
    # "~" deletes a key ("~trainer"), "~=" a key of that value ("~data=1")
    st.tuples(st.sampled_from(["", "", "+", "++", "~", "~="]), st.sampled_from(KEYS), VALUES).map(
        lambda t: f"~{t[1]}" if t[0] == "~" else f"~{t[1]}={t[2]}" if t[0] == "~=" else f"{t[0]}{t[1]}={t[2]}"
    ),
    st.sampled_from(sorted(GROUPS)).flatmap(
        lambda g: st.sampled_from(GROUPS[g]).map(lambda o: f"{'+' if g == 'experiment' else ''}{g}={o}")
    ),
)


@pytest.fixture(autouse=True)
def _fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", FAKES_MODULE)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if ".ddlkit-state" not in p.parts}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(overrides=st.lists(OVERRIDE, min_size=1, max_size=3))
def test_every_command_line_ends_cleanly(
    overrides: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "smoke.yaml").write_text("# @package _global_\ntrainer:\n  epochs: 1\n")
    before = files_under(tmp_path)
    code = main(["plan", "framework=fake", *overrides])
    out = capsys.readouterr()
    assert code in (0, 2), f"{overrides}: exit {code}\n{out.err}"
    if code == 2:
        assert out.err.startswith("ddlkit: error: ") and out.err.count("\n") == 1, f"{overrides}:\n{out.err}"
    assert "Traceback" not in out.err + out.out
    assert files_under(tmp_path) == before, f"{overrides} left {files_under(tmp_path) - before}"
