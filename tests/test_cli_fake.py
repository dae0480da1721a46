"""`ddlkit` end to end through the real CLI (launcher, child worker, job directory) with the
fake framework: seconds per run and no deep-learning library needed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ddlkit.jobdir import EXIT_PREEMPTED
from ddlkit.launch.prepare import job_name
from ddlkit.plugins import BUILTIN_PLUGINS
from ddlkit.testing import FAKES_MODULE, RESULT_KEYS, RunFactory, RunOutcome, interruptible
from ddlkit.testing.fakes import MODEL_FILE

TOKEN = "sv=2026-01-01&sig=do-not-leak-me"
# 20 steps per epoch, 2 epochs; a credential that must stay out of every file and every log
COMMON = (
    "data.length=640",
    "data.val_length=64",
    "data.num_classes=10",
    "trainer.log_every=5",
    "storage=memory",
    f"storage.sas_token='{TOKEN}'",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunOutcome]:
    """One uninterrupted run, and one stopped after 3 steps then re-run in the same directory."""
    factory = RunFactory(tmp_path_factory.mktemp("cli"))
    resumed_dir = factory.base_dir / "resumed"
    return {
        "straight": factory(*COMMON).assert_success(),
        "first": factory(*COMMON, "trainer.max_steps=3", job_dir=resumed_dir).assert_success(),
        "resumed": factory(*COMMON, job_dir=resumed_dir).assert_success(),
    }


def test_a_run_writes_the_job_directory(runs: dict[str, RunOutcome]) -> None:
    out = runs["straight"]
    assert sorted(p.name for p in out.job_dir.iterdir()) == [
        ".ddlkit",
        "checkpoints",
        "config.yaml",
        "environment.json",
        "job.json",
        "metrics.jsonl",
        MODEL_FILE,
        "overrides.yaml",
        "rank-0.log",
        "result.json",
    ]
    assert sorted(p.name for p in (out.job_dir / "checkpoints").iterdir()) == [
        "latest",
        "step-00000020.ckpt",
        "step-00000020.ckpt.manifest.json",
        "step-00000040.ckpt",
        "step-00000040.ckpt.manifest.json",
    ]
    assert (out.job_dir / "checkpoints" / "latest").read_text() == "step-00000040.ckpt\n"
    assert out.stdout.startswith(f"ddlkit: job {job_name(out.job_dir)} -> {out.job_dir}\n")
    assert job_name(out.job_dir).startswith(f"{out.job_dir.parent.name}_{out.job_dir.name}-")
    assert out.stdout.endswith(f"ddlkit: done; result in {out.job_dir}/result.json\n")
    # the worker's output reaches the launcher's stdout and the rank log alike
    assert "train epoch 2/2 step 40/40 loss" in out.stdout
    assert "train epoch 2/2 step 40/40 loss" in (out.job_dir / "rank-0.log").read_text()


def test_result_json(runs: dict[str, RunOutcome]) -> None:
    result = runs["straight"].result
    assert RESULT_KEYS <= result.keys()
    assert {
        k: result[k] for k in ("framework", "model", "world_size", "global_batch_size", "epochs", "steps", "status")
    } == {
        "framework": "fake",
        "model": "resnet18",
        "world_size": 1,
        "global_batch_size": 32,
        "epochs": 2,
        "steps": 40,
        "status": "completed",
    }
    assert result["images_per_sec"] > 0 and result["wall_time_s"] > 0
    assert 0 <= result["top1"] <= result["top5"] <= 1
    assert result["final_loss"] < np.log(10)  # below chance: the fake memorised its batch


def test_metrics_jsonl(runs: dict[str, RunOutcome]) -> None:
    metrics = runs["straight"].metrics
    assert [m["step"] for m in metrics if m["split"] == "train"] == list(range(5, 41, 5))
    assert [(m["step"], m["epoch"]) for m in metrics if m["split"] == "val"] == [(20, 1.0), (40, 2.0)]
    assert metrics[-2]["loss"] == runs["straight"].result["final_loss"]


def test_secrets_stay_out_of_files_and_output(runs: dict[str, RunOutcome]) -> None:
    out = runs["straight"]
    for path in out.job_dir.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in out.stdout + out.stderr
    assert "sas_token: '***'" in (out.job_dir / "config.yaml").read_text()
    assert "storage.sas_token=***" in json.loads((out.job_dir / "environment.json").read_text())["argv"]


def test_a_resumed_run_ends_with_the_same_weights(runs: dict[str, RunOutcome]) -> None:
    first, resumed, straight = runs["first"], runs["resumed"], runs["straight"]
    assert first.result["steps"] == 3
    assert (resumed.result["resumed_from_step"], resumed.result["steps"]) == (3, 40)
    assert "resumed from " in resumed.stdout and "at epoch 1, step 3" in resumed.stdout
    assert (resumed.job_dir / MODEL_FILE).read_bytes() == (straight.job_dir / MODEL_FILE).read_bytes()
    assert resumed.result["final_loss"] == straight.result["final_loss"]


def test_ctrl_c_checkpoints_the_job_and_says_how_to_resume(run_factory: RunFactory, tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    args = ["framework=fake", "data.length=640", "trainer.epochs=500", "trainer.log_every=5"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlkit", *args, f"hydra.run.dir={job_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
        preexec_fn=interruptible,
    )
    try:
        for line in proc.stdout:
            if line.startswith("train epoch"):  # the worker is training
                proc.send_signal(signal.SIGINT)
                break
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, stdout + stderr
    assert "ddlkit: interrupted; asking the job to checkpoint and stop..." in stdout
    assert "stopped on request at step" in stdout  # the worker's own last words, streamed
    # a stop asked for is no error (issue 37, item 15)
    assert re.search(
        r"^ddlkit: job \S+ stopped after saving a checkpoint; resume with: ddlkit framework=fake .* "
        rf"hydra.run.dir={job_dir}$",
        stderr.strip(),
        re.MULTILINE,
    ), stderr
    assert "error" not in stderr
    stopped_at = int((job_dir / "checkpoints" / "latest").read_text().split("-")[1].split(".")[0])
    assert stopped_at > 0
    resumed = run_factory(*args, f"trainer.max_steps={stopped_at + 5}", job_dir=job_dir).assert_success()
    assert (resumed.result["resumed_from_step"], resumed.result["steps"]) == (stopped_at, stopped_at + 5)


def test_a_typo_in_a_name_lists_the_choices(run_factory: RunFactory) -> None:
    out = run_factory("framework=fakee").assert_returncode(2)
    assert re.fullmatch(
        r"ddlkit: error: unknown framework 'fakee' \(config key `framework`\)\. "
        r"Choose one of: (\S+, )*fake(, \S+)*\.\n",
        out.stderr,
    ), out.stderr
    assert out.stdout == ""


def test_a_wrong_type_exits_2(run_factory: RunFactory) -> None:
    out = run_factory("trainer.batch_size=abc").assert_returncode(2)
    assert out.stderr == (
        "ddlkit: error: `trainer.batch_size=abc` is invalid: 'abc' is not an integer. Give an "
        "integer, e.g. trainer.batch_size=32.\n"
    )


def test_an_invalid_value_exits_2_before_anything_runs(run_factory: RunFactory, tmp_path: Path) -> None:
    out = run_factory("trainer.epochs=0", job_dir=tmp_path / "never").assert_returncode(2)
    assert out.stderr == "ddlkit: error: trainer.epochs=0 is invalid: it must be a positive integer.\n"
    assert not (tmp_path / "never").exists()  # Hydra made the directory; ddlkit wrote nothing, and removed it


def test_an_unknown_experiment_exits_2(run_factory: RunFactory) -> None:
    out = run_factory("+experiment=nope").assert_returncode(2)
    assert out.stderr.startswith("ddlkit: error: unknown experiment 'nope' (`+experiment`).")


def test_a_failing_framework_exits_1_with_its_error_once_and_a_resume_hint(run_factory: RunFactory) -> None:
    out = run_factory("data.length=640", "framework.fail_at_step=7", "trainer.checkpoint_every=5")
    out.assert_returncode(1)
    assert "RuntimeError: fake framework failure at step 7" in out.stdout  # streamed from the worker
    assert "ddlkit: error: job " in out.stderr and " failed: rank 0 ended with exit status 1" in out.stderr
    # the error says the rank's error in one line and names the log, without repeating its last lines
    (error,) = [line for line in out.stderr.splitlines() if line.startswith("ddlkit: error: ")]
    assert error.endswith(
        f": RuntimeError: fake framework failure at step 7 (the whole log: {out.job_dir / 'rank-0.log'})"
    )
    assert "Traceback" not in out.stderr
    assert re.search(
        r"resume with: ddlkit framework=fake data.length=640 framework.fail_at_step=7 "
        r"trainer.checkpoint_every=5 hydra.run.dir=\S+",
        out.stderr,
    ), out.stderr
    assert (out.job_dir / "checkpoints" / "step-00000005.ckpt").is_file()
    assert not (out.job_dir / "result.json").exists()


def table_rows(text: str) -> dict[str, str]:
    """A Rich table's rows by their first cell, wrapped lines joined."""
    rows: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if line.startswith("│"):
            first = line.split("│")[1].strip()
            last = first or last
            rows[last] = rows.get(last, "") + line
    return rows


def test_plugins_lists_the_builtins_and_the_fakes(run_factory: RunFactory) -> None:
    rows = table_rows(run_factory.cli("plugins", env={"COLUMNS": "200"}).assert_success().stdout)
    for module in BUILTIN_PLUGINS:
        assert re.match(rf"│ {re.escape(module)}\s+│ ddlkit\s+│ 0\.1\.0\s+│", rows[module]), rows[module]
    assert "│ ddlkit_run_loop" in rows["ddlkit.builtin.run_loop"]
    assert "storage=local" in rows["ddlkit.builtin.local_storage"]
    assert "logger=console" in rows["ddlkit.builtin.console_logger"]
    fakes = rows["ddlkit.testing.fakes"]
    for text in (
        "│ DDLKIT_PLUGINS ",
        "framework=fake",
        "model=resnet101,resnet152,resnet18,resnet34,resnet50,softmax (framework=fake)",
        "optimizer=sgd (framework=fake)",
        "storage=memory",
        "logger=recording",
    ):
        assert text in fakes, fakes


@pytest.mark.plugins  # ddlkit --help composes the default config: framework=pytorch
def test_help_names_every_subcommand_and_detach(run_factory: RunFactory) -> None:
    header = run_factory.cli("--help").assert_success().stdout.split("== Configuration groups ==")[0]
    for command in (
        "ddlkit plan",
        "ddlkit jobs",
        "ddlkit data",
        "ddlkit plugins",
        "ddlkit compute down",
        "--detach",
        "-m ",
    ):
        assert command in header, header
    # where experiments and presets are found, and where ddlkit's own examples live (issue 37, item 17)
    assert "+experiment=NAME reads NAME.yaml in ./experiments, $DDLKIT_EXPERIMENTS or ./conf/experiment/" in header
    assert "experiments/ and conf/ directories of its source repository" in header


@pytest.mark.plugins  # ddlkit --help composes the default config: framework=pytorch
def test_help_lists_the_options_plugins_registered(run_factory: RunFactory) -> None:
    out = run_factory.cli("--help").assert_success()
    groups = dict(
        line.split(": ", 1)
        for line in out.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0].splitlines()
        if ": " in line
    )
    assert "fake" in groups["framework"].split(", ")
    # built-ins and the fakes always; installed first-party plugins (azure, wandb, ...) may add more
    assert {"local", "local_ssd", "memory", "nfs"} <= set(groups["storage"].split(", "))
    assert {"console", "jsonl", "recording"} <= set(groups["logger"].split(", "))


#: modules that only the implementations of unchosen options import: TLS and HTTP (the container
#: registry client of compute=batchai), tar (compute=ray), MPI's host lists, TensorFlow's runtime,
#: an image folder's index; and what only running a job or a sweep needs
NOT_FOR_COMPOSING = {
    "ssl",
    "http.client",
    "urllib.request",
    "tarfile",
    "ddlkit.compute.containers",
    "ddlkit_mpi.hosts",
    "ddlkit_tensorflow.runtime",
    "ddlkit.builtin.imagefolder.index",
    "ddlkit.launch.prepare",
    "ddlkit.launch.sweep.sweep",
}


@pytest.mark.parametrize(
    "args",
    [
        pytest.param((), id="default", marks=pytest.mark.plugins),  # the default framework: pytorch
        pytest.param(("framework=fake",), id="fake"),
    ],
)
def test_composing_imports_no_deep_learning_library(run_factory: RunFactory, args: tuple[str, ...]) -> None:
    out = run_factory.cli(*args, "--cfg", "job", python_args=("-X", "importtime")).assert_success()
    assert out.stdout.startswith("compute:\n") and "\nframework:\n" in out.stdout and "\ntrainer:\n" in out.stdout
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    imported = {m.split(".")[0] for m in modules}
    assert {"hydra", "omegaconf", "ddlkit"} <= imported  # the check sees imports at all
    assert not imported & {"torch", "tensorflow", "keras", "jax"}
    # nor the implementations of the options it does not choose, which the plugins name by "module:attr"
    # (issue 29, item 3); -X importtime shows what they import (not the modules the registry imports by name)
    assert not modules & NOT_FOR_COMPOSING


@pytest.mark.parametrize("override", ["hydra.run.dir=", "hydra.run.dir=''", "hydra.sweep.dir="])
def test_an_empty_job_directory_is_refused(run_factory: RunFactory, override: str) -> None:
    """Issue 17, item 17: `hydra.run.dir=` wrote a checkpoint into the current directory."""
    args = ["-m", override, "optimizer.lr=0.1"] if "sweep" in override else [override]
    out = run_factory.cli("framework=fake", *args).assert_returncode(2)
    key = override.partition("=")[0]
    assert out.stderr.startswith(f"ddlkit: error: {key} is empty: give the job a directory of its own")
    assert sorted(p.name for p in run_factory.base_dir.iterdir()) == []
