"""logger=wandb: registration and config checks, the online/offline choice, and a real sweep whose
offline W&B runs are read back from the files wandb wrote (one per job, grouped, redacted, finished)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

import ddlkit
import ddlkit_wandb.plugin
from ddlkit.testing import FAKES_MODULE, RunFactory, add_plugin, compose, fakes
from ddlkit.testing.contracts import LoggerContract
from ddlkit.testing.core import DdlkitPluginManager, Registry, job_name, validate
from ddlkit_wandb.logger import RUN_ID_FILE, WandbConfig, WandbLogger

TOKEN = "sv=2026&sig=wandb-must-not-see-this"
#: an account URL carrying a SAS (issue 17, item 10): the W&B config gets it without the SAS
URL_SAS = "sv=2026&se=2030-01-01&sp=racwdl&sig=wandb-must-not-see-this-either"
ACCOUNT = "http://127.0.0.1:10000/devstoreaccount1"
#: an API key given on the command line (item 9); the runs stay offline (WANDB_MODE=offline)
API_KEY = "wandb-must-not-see-this-key-" + "k" * 12


def test_the_plugin_module_imports_no_wandb(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, ddlkit_wandb.plugin; print('wandb' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.stdout.strip() == "False", proc.stderr


def configured(ddlkit_pm: DdlkitPluginManager, *overrides: str) -> dict[str, Any]:
    add_plugin(ddlkit_pm, fakes, name=FAKES_MODULE)
    add_plugin(ddlkit_pm, ddlkit_wandb.plugin, name="wandb", distribution="ddlkit-wandb")
    registry = Registry.collect(ddlkit_pm)
    return validate(compose(registry, ["framework=fake", *overrides]), registry, ddlkit_pm)


def test_logger_wandb_is_registered_with_its_options(ddlkit_pm: DdlkitPluginManager) -> None:
    cfg = configured(ddlkit_pm, "logger=[jsonl,wandb]", "logger.wandb.project=p", "logger.wandb.tags=[a,b]")
    assert cfg["logger"]["wandb"] == {
        "name": "wandb",
        "run_name": None,
        "project": "p",
        "entity": None,
        "group": None,
        "tags": ["a", "b"],
        "mode": "auto",
        "log_model": False,
        "api_key": None,
        "rewind": True,
    }


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["logger.wandb.mode=sometimes"],
            "logger.wandb.mode=sometimes is invalid: it must be one of auto, online, offline, disabled.",
        ),
        (
            ["logger.wandb.log_model=true", "trainer.save_model=false"],
            "logger.wandb.log_model=true uploads the trained model, which trainer.save_model=false does not write; "
            "set one "
            "of them differently.",
        ),
    ],
)
def test_bad_settings_are_reported_before_anything_runs(
    ddlkit_pm: DdlkitPluginManager, overrides: list[str], message: str
) -> None:
    with pytest.raises(ddlkit.ConfigError) as info:
        configured(ddlkit_pm, "logger=[wandb]", *overrides)
    assert str(info.value) == message


def mode_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], **cfg: Any) -> str | None:
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text(env.pop("netrc", ""))
    monkeypatch.setenv("NETRC", str(netrc))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return WandbLogger(SimpleNamespace(**{**vars(WandbConfig()), **cfg}))._mode()


def test_auto_mode_is_offline_without_an_api_key_and_online_with_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert mode_of(monkeypatch, tmp_path, {}) == "offline"
    assert mode_of(monkeypatch, tmp_path, {"WANDB_API_KEY": "k" * 40}) == "online"
    assert mode_of(monkeypatch, tmp_path, {}, api_key="k" * 40) == "online"
    assert mode_of(monkeypatch, tmp_path, {"netrc": "machine api.wandb.ai login user password " + "k" * 40}) == "online"
    # WANDB_MODE wins: wandb reads it itself
    assert mode_of(monkeypatch, tmp_path, {"WANDB_MODE": "disabled", "WANDB_API_KEY": "k" * 40}) is None
    assert mode_of(monkeypatch, tmp_path, {"WANDB_API_KEY": "k" * 40}, mode="offline") == "offline"


# ---------------------------------------------------------------------------- reading a .wandb file
def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a .wandb file: W&B's header, then LevelDB-log framing (32 KiB blocks; each record
    7 header bytes: crc32c, length, type full/first/middle/last) around protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", "not a .wandb file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += block - pos % block
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(job_dir: Path) -> list[dict[str, Any]]:
    """The history of a job's offline W&B run as W&B builds it from the attempts' .wandb files (what
    ``wandb sync`` uploads), each row with ``_attempt``: the attempt (0, 1, ...) that logged it.
    One row per step (a train and a validation record at the same step share it); an attempt that
    rewinds the run (``resume_from``: its run record's ``branch_point``) drops the rows after the
    step it names; a row whose step is not above the run's latest is ignored (W&B's steps must
    increase)."""
    kept: list[dict[str, Any]] = []
    for attempt, file in enumerate(sorted(job_dir.glob("wandb/offline-run-*/run-*.wandb"))):  # in order
        for record in wandb_records(file):
            kind = record.WhichOneof("record_type")
            if kind == "run" and record.run.HasField("branch_point"):
                assert record.run.branch_point.metric == "_step"
                kept = [row for row in kept if row["_step"] <= record.run.branch_point.value]
            if kind != "history":
                continue
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            if kept and row["_step"] <= kept[-1]["_step"]:
                continue
            kept.append({**row, "_attempt": attempt})
    return kept


def offline_run(job_dir: Path) -> dict[str, Any]:
    runs = list((job_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    (file,) = runs[0].glob("run-*.wandb")
    out: dict[str, Any] = {"history": [], "artifacts": []}
    for record in wandb_records(file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"] = {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "history":
            out["history"].append(
                {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            )
        elif kind in ("exit", "environment"):
            out[kind] = getattr(record, kind)
        elif kind == "artifact":
            out["artifacts"].append(record.artifact)
    return out


@pytest.mark.slow
def test_a_sweep_logs_one_finished_redacted_offline_run_per_job(
    run_factory: RunFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    home = run_factory.base_dir / "wandb-home"  # wandb's own caches and settings, kept out of $HOME
    env = {
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "NETRC": str(home / "no-netrc"),
        "WANDB_MODE": "offline",
    }
    sweep = run_factory.base_dir / "sweep"
    # job 0 completes after 3 steps; job 1 fails at step 5
    launcher = run_factory.cli(
        "-m",
        "framework=fake",
        "logger=[jsonl,wandb]",
        "logger.wandb.log_model=true",
        "storage=memory",
        f"storage.sas_token='{TOKEN}'",
        f"storage.account_url='{ACCOUNT}?{URL_SAS}'",
        f"logger.wandb.api_key={API_KEY}",
        "data.length=320",
        "data.num_classes=10",
        "trainer.log_every=1",
        "trainer.max_steps=3,6",
        "framework.fail_at_step=5",
        f"hydra.sweep.dir={sweep}",
        env=env,
    ).assert_returncode(1)
    for marker in (TOKEN, URL_SAS, API_KEY):
        assert marker not in launcher.stdout + launcher.stderr
        for path in run_factory.base_dir.rglob("*"):
            assert not path.is_file() or marker.encode() not in path.read_bytes(), path

    runs = {num: offline_run(sweep / str(num)) for num in (0, 1)}
    for num, wb in runs.items():
        job_dir = sweep / str(num)
        assert wb["run"].run_id == (job_dir / RUN_ID_FILE).read_text().strip()
        # grouped by the sweep's name (`<parent>_<name>` of its directory), named after the job
        assert (wb["run"].run_group, wb["run"].display_name) == (f"{sweep.parent.name}_sweep", job_name(job_dir))
        assert wb["config"]["storage"] == {
            "name": "memory",
            "sas_token": "***",
            "account_url": f"{ACCOUNT}?***",
            "expect_sha256": "",
        }
        assert wb["config"]["logger"]["wandb"]["api_key"] == "***"
        assert wb["config"]["ddlkit"]["sweep_job"] == str(num)
        assert wb["config"]["ddlkit"]["environment"]["python"] == sys.version.split()[0]
        assert wb["environment"].cpu_count > 0  # W&B's own system information
        for path in job_dir.rglob("*"):
            assert not path.is_file() or TOKEN.encode() not in path.read_bytes(), path
    assert runs[0]["exit"].exit_code == 0 and runs[1]["exit"].exit_code == 1  # both finished
    assert [h["_step"] for h in runs[0]["history"] if "train/loss" in h] == [1, 2, 3]
    assert [h["_step"] for h in runs[1]["history"] if "train/loss" in h] == [1, 2, 3, 4]
    assert [(a.type, a.name) for a in runs[0]["artifacts"]] == [("model", f"model-{job_name(sweep / '0')}")]
    assert [c.path for c in runs[0]["artifacts"][0].manifest.contents] == ["model.npy"]
    assert runs[1]["artifacts"] == []  # a failed job has no final model


@pytest.mark.parametrize("command", [("--cfg", "job"), ("--info", "config"), ("--help",), ("plan", "-m")], ids=" ".join)
def test_the_api_key_is_not_printed(run_factory: RunFactory, command: tuple[str, ...]) -> None:
    """Issue 17, item 9: ``ddlkit --cfg job logger.wandb.api_key=KEY`` printed the key."""
    plan = command[0] == "plan"
    args = [*command[:1]] if plan else []
    args += ["-m"] if plan else []
    args += ["framework=fake", "logger=[console,wandb]", f"logger.wandb.api_key={API_KEY}"]
    args += [] if plan else list(command)
    out = run_factory.cli(*args).assert_success()
    assert API_KEY not in out.stdout + out.stderr
    if command != ("--help",):
        assert "api_key: '***'" in out.stdout or "api_key: ***" in out.stdout or "api_key=***" in out.stdout, out.output
    for path in run_factory.base_dir.rglob("*"):
        assert not path.is_file() or API_KEY.encode() not in path.read_bytes(), path


def test_the_ranks_get_the_wandb_environment_the_key_as_a_secret(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 may run on another machine: the launcher's W&B variables go with the job, the key
    in the secret environment (a target's secret channel), and only when logger=wandb is chosen."""
    from ddlkit.testing.core import job_environment

    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_MODE", "offline")
    add_plugin(ddlkit_pm, fakes, name=FAKES_MODULE)
    add_plugin(ddlkit_pm, ddlkit_wandb.plugin, name="wandb", distribution="ddlkit-wandb")
    registry = Registry.collect(ddlkit_pm)
    env, secret_env = job_environment(compose(registry, ["framework=fake", "logger=[wandb]"]), ddlkit_pm)
    assert (env.get("WANDB_MODE"), secret_env.get("WANDB_API_KEY")) == ("offline", "k" * 40)
    assert "WANDB_API_KEY" not in env
    env, secret_env = job_environment(compose(registry, ["framework=fake", "logger=[console]"]), ddlkit_pm)
    assert "WANDB_MODE" not in env and "WANDB_API_KEY" not in secret_env


# ---------------------------------------------------------------------------- the test kit's contract
@pytest.mark.slow  # wandb starts its service process for the first run of a session (seconds)
class TestWandbLogger(LoggerContract):
    """Offline W&B runs (no account, no network), read back from the .wandb files wandb wrote."""

    @pytest.fixture
    def logger(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ddlkit.Logger]:
        import wandb

        for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
            monkeypatch.delenv(name, raising=False)
        home = tmp_path / "wandb-home"  # wandb's own caches and settings, kept out of $HOME
        for name, where in (
            ("WANDB_CACHE_DIR", "cache"),
            ("WANDB_DATA_DIR", "data"),
            ("WANDB_CONFIG_DIR", "config"),
            ("NETRC", "no-netrc"),
        ):
            monkeypatch.setenv(name, str(home / where))
        yield WandbLogger(OmegaConf.structured(WandbConfig(mode="offline")))
        wandb.teardown()  # the service process the test's runs started

    def read_back(self, logger: ddlkit.Logger, run: ddlkit.Run) -> list[tuple[int, str]]:
        """The records of the job's W&B run as W&B keeps them (:func:`wandb_history`)."""
        import wandb

        wandb.teardown()  # the service writes the .wandb files: all of them, now
        # wandb names a run's directory after the second it started in, and the contract may start
        # the next attempt at once: in the same second it would overwrite this attempt's file
        time.sleep(1 - time.time() % 1)
        return [
            (row["_step"], split)
            for row in wandb_history(Path(run.job_dir))
            for split in ("train", "val")
            if any(key.startswith(f"{split}/") for key in row)
        ]

    def test_a_resumed_run_rewinds_to_its_checkpoint(self, logger: ddlkit.Logger, logger_run: ddlkit.Run) -> None:
        """A job that reached step 6 and resumes from its checkpoint at step 4 continues the same W&B
        run, and the run keeps what this attempt logged for steps 5 and 6, not the interrupted one's
        (W&B would otherwise ignore this attempt's steps up to 6: its steps must increase)."""
        from ddlkit.interfaces.run import RunState

        logger.start(logger_run)
        for step in range(1, 7):
            logger.log_metrics(step, {"loss": float(step)}, split="train")
        logger.finish("interrupted", None)
        self.read_back(logger, logger_run)  # its files written, and the next attempt in a later second
        logger_run.state = logger_run.resumed_at = RunState(epoch=0, step=4, batch=4)
        resumed = type(logger)(logger.cfg)
        resumed.start(logger_run)
        for step in range(5, 9):
            resumed.log_metrics(step, {"loss": 10.0 * step}, split="train")
        resumed.finish("completed", logger_run.result("completed"))
        self.read_back(resumed, logger_run)
        history = wandb_history(Path(logger_run.job_dir))
        assert [(row["_step"], row["train/loss"], row["_attempt"]) for row in history] == [
            (1, 1.0, 0),
            (2, 2.0, 0),
            (3, 3.0, 0),
            (4, 4.0, 0),
            (5, 50.0, 1),
            (6, 60.0, 1),
            (7, 70.0, 1),
            (8, 80.0, 1),
        ]
        assert {path.name.rsplit("-", 1)[1] for path in Path(logger_run.job_dir, "wandb").glob("offline-run-*")} == {
            (Path(logger_run.job_dir) / RUN_ID_FILE).read_text().strip()
        }  # one W&B run, two attempts

    def test_rewind_false_continues_the_run_where_it_stands(
        self, logger: ddlkit.Logger, logger_run: ddlkit.Run
    ) -> None:
        """logger.wandb.rewind=false (for a W&B server without rewinding): the same run, resumed as it
        stands, so W&B keeps the interrupted attempt's records up to its latest step."""
        from ddlkit.interfaces.run import RunState

        logger.start(logger_run)
        for step in range(1, 7):
            logger.log_metrics(step, {"loss": float(step)}, split="train")
        logger.finish("interrupted", None)
        self.read_back(logger, logger_run)
        logger_run.state = logger_run.resumed_at = RunState(epoch=0, step=4, batch=4)
        resumed = type(logger)(OmegaConf.merge(logger.cfg, {"rewind": False}))
        resumed.start(logger_run)
        for step in range(5, 9):
            resumed.log_metrics(step, {"loss": 10.0 * step}, split="train")
        resumed.finish("completed", logger_run.result("completed"))
        self.read_back(resumed, logger_run)
        assert [(row["_step"], row["train/loss"]) for row in wandb_history(Path(logger_run.job_dir))] == [
            (1, 1.0),
            (2, 2.0),
            (3, 3.0),
            (4, 4.0),
            (5, 5.0),
            (6, 6.0),
            (7, 70.0),
            (8, 80.0),
        ]


# ---------------------------------------------------------------------------- a real restart
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs OpenMPI's mpirun")
def test_a_restarted_job_continues_its_w_and_b_run_and_every_step_axis_stays_monotone(
    tmp_path: Path, event_accumulator: type
) -> None:
    """compute=local_mpi, 2 ranks, 16 steps, a checkpoint every 4: rank 1 is killed (SIGKILL) in
    step 7, the job restarts and resumes from step 4. One W&B run (rewound to step 4), TensorBoard's
    step axis and metrics.jsonl each hold steps 1..16 once, in order, with the values of the attempt
    that completed (metrics.jsonl's), and the result says 1 restart, 2 steps lost."""
    home = tmp_path / "wandb-home"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_DIR")},
        "DDLKIT_PLUGINS": "ddlkit.testing.fakes",
        "WANDB_MODE": "offline",
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "NETRC": str(home / "no-netrc"),
    }
    job_dir = tmp_path / "job"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=fake",
            "compute=local_mpi",
            "compute.procs_per_node=2",
            "dist=native",
            "data.image_size=8",
            "data.num_classes=4",
            "data.length=256",
            "data.val_length=32",
            "trainer.batch_size=16",
            "trainer.epochs=2",
            "trainer.log_every=1",
            "trainer.checkpoint_every=4",
            "trainer.deterministic=true",
            "restart.backoff_s=0",
            "framework.kill_at_step=7",
            "framework.kill_rank=1",
            "logger=[console,jsonl,tensorboard,wandb]",
            f"hydra.run.dir={job_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ddlkit: restart 1/3: " in proc.stdout and "resuming from step 4" in proc.stdout
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["steps"], result["restarts"], result["steps_lost"], result["resumed_from_step"]) == (16, 1, 2, 4)
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [(m["step"], round(m["loss"], 4)) for m in metrics if m["split"] == "train"]
    assert [step for step, _ in losses] == list(range(1, 17))
    # W&B: one run, its history as W&B builds it from the two attempts' files
    history = wandb_history(job_dir)
    assert [row["_step"] for row in history] == list(range(1, 17))
    assert [row["_attempt"] for row in history] == [0] * 4 + [1] * 12  # steps 5 and 6: the restart's
    assert [(row["_step"], round(row["train/loss"], 4)) for row in history] == losses
    runs = sorted((job_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and {run.name.rsplit("-", 1)[1] for run in runs} == {
        (job_dir / RUN_ID_FILE).read_text().strip()
    }
    summary = {}
    for record in wandb_records(next(runs[1].glob("run-*.wandb"))):
        if record.WhichOneof("record_type") == "summary":
            summary.update({i.key: json.loads(i.value_json) for i in record.summary.update})
    assert (summary["restarts"], summary["steps_lost"]) == (1, 2)
    # TensorBoard: the restart's session marker drops what the killed attempt logged after step 4
    events = event_accumulator(str(job_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("train/loss")] == losses
