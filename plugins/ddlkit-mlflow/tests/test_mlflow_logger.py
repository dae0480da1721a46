"""logger=mlflow: registration and config checks, the launcher's reachability check, and real jobs
logging to a real MLflow tracking server (conftest's ``mlflow_server``), read back through MLflow's
client: params without secrets, steps once each across a restart and a resume, one parent run per
sweep with a child per job, one run for a two-rank job."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import ddlkit
import ddlkit_mlflow.plugin
from ddlkit.testing import FAKES_MODULE, RunFactory, add_plugin, compose, fakes, make_run
from ddlkit.testing.contracts import LoggerContract
from ddlkit.testing.core import DdlkitPluginManager, Registry, job_name, validate
from ddlkit_mlflow.logger import (
    MAX_PARAM_VALUE,
    PARENT_TAG,
    RUN_FILE,
    MlflowConfig,
    MlflowLogger,
    _flatten,
    _param_value,
    shown_uri,
)
from ddlkit_mlflow.testing import runs_of, steps

TOKEN = "sv=2026&sig=mlflow-must-not-see-this"
#: an account URL carrying a SAS: the params get it without the SAS
URL_SAS = "sv=2026&se=2030-01-01&sp=racwdl&sig=mlflow-must-not-see-this-either"
ACCOUNT = "http://127.0.0.1:10000/devstoreaccount1"
#: a key in the launcher's environment (as a storage plugin reads it): no param, tag or artifact has it
ENV_KEY = "mlflow-must-not-see-this-env-key-" + "k" * 12


def client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment() -> str:
    """A fresh experiment per test: the server is the session's."""
    return f"t-{uuid.uuid4().hex[:10]}"


def kept_run_id(job_dir: Path) -> str:
    return str(json.loads((job_dir / RUN_FILE).read_text())["run_id"])


# ---------------------------------------------------------------------------- no server needed
def test_the_plugin_module_imports_no_mlflow(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, ddlkit_mlflow.plugin; print('mlflow' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.stdout.strip() == "False", proc.stderr


def configured(ddlkit_pm: DdlkitPluginManager, *overrides: str) -> dict[str, Any]:
    add_plugin(ddlkit_pm, fakes, name=FAKES_MODULE)
    add_plugin(ddlkit_pm, ddlkit_mlflow.plugin, name="mlflow", distribution="ddlkit-mlflow")
    registry = Registry.collect(ddlkit_pm)
    return validate(compose(registry, ["framework=fake", *overrides]), registry, ddlkit_pm)


def test_logger_mlflow_is_registered_with_its_options(ddlkit_pm: DdlkitPluginManager) -> None:
    cfg = configured(
        ddlkit_pm, "logger=[jsonl,mlflow]", "logger.mlflow.experiment=e", "+logger.mlflow.tags.team=vision"
    )
    assert cfg["logger"]["mlflow"] == {
        "name": "mlflow",
        "tracking_uri": None,
        "experiment": "e",
        "run_name": None,
        "tags": {"team": "vision"},
        "nest_sweeps": True,
        "log_model": False,
        "async_logging": True,
        "send_every_s": 2.0,
    }


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["logger.mlflow.log_model=true", "trainer.save_model=false"],
            "logger.mlflow.log_model=true uploads the trained model, which trainer.save_model=false does not write; "
            "set one of them differently.",
        ),
        (
            ["logger.mlflow.send_every_s=-1"],
            "logger.mlflow.send_every_s=-1.0 is invalid: seconds between sends, 0 or more.",
        ),
        (
            ["logger.mlflow.experiment=' '"],
            "logger.mlflow.experiment is empty: name an MLflow experiment (default ddlkit).",
        ),
    ],
)
def test_bad_settings_are_reported_before_anything_runs(
    ddlkit_pm: DdlkitPluginManager, overrides: list[str], message: str
) -> None:
    with pytest.raises(ddlkit.ConfigError) as info:
        configured(ddlkit_pm, "logger=[mlflow]", *overrides)
    assert str(info.value) == message


def test_params_are_flat_and_within_mlflow_s_limits() -> None:
    flat = dict(_flatten({"a": {"b": 1, "c": [1, 2], "d": {}}, "e": None, "f": "x" * 2000}, ""))
    assert flat == {"a.b": 1, "a.c": [1, 2], "a.d": {}, "e": None, "f": "x" * 2000}
    assert [_param_value(v) for v in flat.values()] == ["1", "[1, 2]", "{}", "null", "x" * 497 + "..."]
    assert len(_param_value("y" * 10_000)) == MAX_PARAM_VALUE


def test_a_uri_is_printed_without_its_password() -> None:
    assert shown_uri("https://user:pa55@mlflow.example.com:8443/x") == "https://***@mlflow.example.com:8443/x"
    assert shown_uri(f"https://mlflow.example.com/?{TOKEN}") == "https://mlflow.example.com/?***"
    assert shown_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_the_ranks_get_the_mlflow_environment_the_password_as_a_secret(
    ddlkit_pm: DdlkitPluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlkit.testing.core import job_environment

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "me")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw" * 10)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tk" * 10)
    add_plugin(ddlkit_pm, fakes, name=FAKES_MODULE)
    add_plugin(ddlkit_pm, ddlkit_mlflow.plugin, name="mlflow", distribution="ddlkit-mlflow")
    registry = Registry.collect(ddlkit_pm)
    env, secret_env = job_environment(compose(registry, ["framework=fake", "logger=[mlflow]"]), ddlkit_pm)
    assert (env["MLFLOW_TRACKING_URI"], env["MLFLOW_TRACKING_USERNAME"]) == ("http://127.0.0.1:1", "me")
    assert (secret_env["MLFLOW_TRACKING_PASSWORD"], secret_env["MLFLOW_TRACKING_TOKEN"]) == ("pw" * 10, "tk" * 10)
    assert "MLFLOW_TRACKING_PASSWORD" not in env and "MLFLOW_TRACKING_TOKEN" not in env
    env, secret_env = job_environment(compose(registry, ["framework=fake", "logger=[console]"]), ddlkit_pm)
    assert "MLFLOW_TRACKING_URI" not in env and "MLFLOW_TRACKING_PASSWORD" not in secret_env


# ---------------------------------------------------------------------------- (d) a server that is not there
@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung server, a firewall's black hole)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_an_unreachable_tracking_server_fails_fast_with_one_line(run_factory: RunFactory, silent_port: int) -> None:
    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    started = time.monotonic()
    line = run_factory(
        "logger=[console,mlflow]", f"logger.mlflow.tracking_uri=http://127.0.0.1:{closed}"
    ).assert_one_line_error()
    assert line.startswith(f"ddlkit: error: logger.mlflow: the MLflow tracking server at http://127.0.0.1:{closed} ")
    assert "does not answer" in line and "start it, or fix logger.mlflow.tracking_uri" in line, line
    # from the environment, and a server that accepts but does not answer: the check's timeout
    outcome = run_factory(
        "logger=[console,mlflow]", env={"MLFLOW_TRACKING_URI": f"http://u:pw@127.0.0.1:{silent_port}"}
    )
    line = outcome.assert_one_line_error(
        f"the MLflow tracking server at http://***@127.0.0.1:{silent_port} does not answer", "fix MLFLOW_TRACKING_URI"
    )
    assert "pw" not in outcome.stdout + outcome.stderr.replace("plugin", "")
    assert time.monotonic() - started < 60, "the check must not wait for MLflow's retries"
    assert not (run_factory.base_dir / "run-1").exists() or not (run_factory.base_dir / "run-1" / RUN_FILE).exists()


# ---------------------------------------------------------------------------- (a) one job
@pytest.mark.slow
def test_a_job_logs_params_without_secrets_its_steps_result_and_status(
    run_factory: RunFactory, mlflow_server: str
) -> None:
    name = experiment()
    job_dir = run_factory.base_dir / "job"
    run_factory(
        "logger=[console,jsonl,mlflow]",
        f"logger.mlflow.tracking_uri={mlflow_server}",
        f"logger.mlflow.experiment={name}",
        "+logger.mlflow.tags.team=vision",
        "logger.mlflow.log_model=true",
        "storage=memory",
        f"storage.sas_token='{TOKEN}'",
        f"storage.account_url='{ACCOUNT}?{URL_SAS}'",
        "data.length=320",
        "data.num_classes=10",
        "trainer.log_every=1",
        "trainer.max_steps=6",
        job_dir=job_dir,
        env={"AZURE_STORAGE_KEY": ENV_KEY},
    ).assert_success()
    (run,) = runs_of(mlflow_server, name)
    assert run.info.run_id == kept_run_id(job_dir)
    assert (run.info.status, run.info.run_name) == ("FINISHED", job_name(job_dir))
    assert not (job_dir / "mlflow.db").exists()  # the server's run, no local store beside it
    params, tags = run.data.params, run.data.tags
    assert params["storage.sas_token"] == "***" and params["storage.account_url"] == f"{ACCOUNT}?***"
    assert (params["optimizer.lr"], params["trainer.max_steps"], params["framework.name"]) == ("0.1", "6", "fake")
    assert all(len(v) <= MAX_PARAM_VALUE for v in params.values())
    for marker in (TOKEN, URL_SAS, ENV_KEY, "sig="):
        assert not any(marker in f"{k}={v}" for k, v in {**params, **tags}.items()), marker
    assert {k: tags[k] for k in ("ddlkit.job", "ddlkit.compute", "ddlkit.framework", "ddlkit.world_size", "team")} == {
        "ddlkit.job": job_name(job_dir),
        "ddlkit.compute": "local",
        "ddlkit.framework": "fake",
        "ddlkit.world_size": "1",
        "team": "vision",
    }
    environment = json.loads((job_dir / "environment.json").read_text())
    if environment.get("git"):  # the launch directory is a git checkout
        assert tags["mlflow.source.git.commit"] == environment["git"]["commit"]
    metrics = [json.loads(ln) for ln in (job_dir / "metrics.jsonl").read_text().splitlines()]
    train = [(m["step"], m["loss"]) for m in metrics if m["split"] == "train"]
    assert [s for s, _ in train] == list(range(1, 7))
    assert [(s, round(v, 6)) for s, v in steps(mlflow_server, run.info.run_id)] == [(s, round(v, 6)) for s, v in train]
    result = json.loads((job_dir / "result.json").read_text())
    assert run.data.metrics["result/steps"] == result["steps"] == 6
    artifacts = {a.path for a in client(mlflow_server).list_artifacts(run.info.run_id)}
    assert artifacts == {"result.json", "model"}
    assert [a.path for a in client(mlflow_server).list_artifacts(run.info.run_id, "model")] == ["model/model.npy"]
    local = Path(client(mlflow_server).download_artifacts(run.info.run_id, "result.json", str(job_dir.parent)))
    assert json.loads(local.read_text()) == result


@pytest.mark.slow
def test_without_a_tracking_uri_the_job_logs_to_a_sqlite_store_in_its_directory(run_factory: RunFactory) -> None:
    job_dir = run_factory.base_dir / "job"
    outcome = run_factory("logger=[console,mlflow]", "trainer.log_every=1", "trainer.max_steps=3", job_dir=job_dir)
    outcome.assert_success()
    uri = f"sqlite:///{job_dir / 'mlflow.db'}"
    (run,) = runs_of(uri, "ddlkit")
    assert run.info.status == "FINISHED" and [s for s, _ in steps(uri, run.info.run_id)] == [1, 2, 3]
    assert run.info.artifact_uri.startswith((job_dir / "mlartifacts").as_uri())
    assert (job_dir / "mlartifacts").is_dir() and any((job_dir / "mlartifacts").rglob("result.json"))


# ---------------------------------------------------------------------------- (b) restart and resume
@pytest.mark.slow
def test_a_restart_and_a_resume_continue_one_run_each_step_once(run_factory: RunFactory, mlflow_server: str) -> None:
    """A rank killed in step 7 (checkpoint every 4): the job restarts from step 4, and the same run goes
    on. Then the job fails at step 11 and is run again (a resume from step 8): still the same run.
    Steps 1..12 appear once each, in order; statuses FAILED, then FINISHED."""
    name = experiment()
    job_dir = run_factory.base_dir / "job"
    common = [
        "logger=[console,jsonl,mlflow]",
        f"logger.mlflow.tracking_uri={mlflow_server}",
        f"logger.mlflow.experiment={name}",
        "data.length=384",
        "data.num_classes=10",
        "trainer.batch_size=32",
        "trainer.log_every=1",
        "trainer.max_steps=12",
        "trainer.checkpoint_every=4",
        "trainer.deterministic=true",
        "trainer.checkpoint_async=false",  # the kill in step 7 finds step 4's checkpoint complete
        "restart.backoff_s=0",
        "restart.max_restarts=1",  # the kill is restarted; the failure, after it, ends the job
    ]
    first = run_factory(*common, "framework.kill_at_step=7", "framework.fail_at_step=11", job_dir=job_dir)
    first.assert_returncode(1)
    assert "ddlkit: restart 1/" in first.stdout and "resuming from step 4" in first.stdout, first.output
    (run,) = runs_of(mlflow_server, name)
    run_id = run.info.run_id
    assert run.info.status == "FAILED"
    assert [s for s, _ in steps(mlflow_server, run_id)] == list(range(1, 11))
    # a target that copies the job directory to its nodes leaves .ddlkit/ behind: the run is found by its tag
    (job_dir / RUN_FILE).unlink()
    again = run_factory(*common, job_dir=job_dir).assert_success()
    assert "step-00000008.ckpt at epoch 1, step 8" in again.stdout, again.output
    (run,) = runs_of(mlflow_server, name)
    assert (run.info.run_id, run.info.status, kept_run_id(job_dir)) == (run_id, "FINISHED", run_id)
    logged = steps(mlflow_server, run_id)
    assert [s for s, _ in logged] == list(range(1, 13))
    # the killed attempt reached step 6 and the failed one step 10: MLflow keeps those points (it cannot
    # delete them), the resumed attempts log what comes after them, and say so
    assert "this attempt logs from step 11 on" in again.stdout, again.output
    jsonl = [json.loads(ln) for ln in (job_dir / "metrics.jsonl").read_text().splitlines()]
    train = {m["step"]: m["loss"] for m in jsonl if m["split"] == "train"}
    # deterministic training: the attempts agree on the steps they share
    assert [round(v, 5) for _, v in logged] == [round(train[s], 5) for s in range(1, 13)]
    result = json.loads((job_dir / "result.json").read_text())
    assert run.data.metrics["result/restarts"] == result["restarts"]


# ---------------------------------------------------------------------------- (c) a sweep
@pytest.mark.slow
def test_a_sweep_is_one_parent_run_with_a_child_per_job(run_factory: RunFactory, mlflow_server: str) -> None:
    name = experiment()
    sweep = run_factory.base_dir / "sweep"
    run_factory.cli(
        "-m",
        "framework=fake",
        "logger=[jsonl,mlflow]",
        f"logger.mlflow.tracking_uri={mlflow_server}",
        f"logger.mlflow.experiment={name}",
        "sweep.max_parallel=4",  # all at once: the jobs race to create the parent
        "data.length=320",
        "data.num_classes=10",
        "trainer.log_every=1",
        "trainer.max_steps=3",
        "optimizer.lr=0.1,0.2,0.3,0.4",
        f"hydra.sweep.dir={sweep}",
        timeout=300,
    ).assert_success()
    runs = runs_of(mlflow_server, name)
    parents = [r for r in runs if r.data.tags.get("ddlkit.role") == "sweep"]
    assert len(parents) == 1, [(r.info.run_name, r.data.tags) for r in runs]
    (parent,) = parents
    children = [r for r in runs if r is not parent]
    assert parent.info.run_name == f"{sweep.parent.name}_sweep" and parent.info.status == "FINISHED"
    assert len(children) == 4 and {c.data.tags.get(PARENT_TAG) for c in children} == {parent.info.run_id}
    assert sorted(c.data.params["optimizer.lr"] for c in children) == ["0.1", "0.2", "0.3", "0.4"]
    assert sorted(c.data.tags["ddlkit.sweep_job"] for c in children) == ["0", "1", "2", "3"]
    for child in children:
        job_dir = sweep / child.data.tags["ddlkit.sweep_job"]
        assert (child.info.run_id, child.info.status) == (kept_run_id(job_dir), "FINISHED")
        assert [s for s, _ in steps(mlflow_server, child.info.run_id)] == [1, 2, 3]


# ---------------------------------------------------------------------------- (e) two ranks
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs OpenMPI's mpirun (compute=local_mpi)")
def test_two_ranks_log_one_run(run_factory: RunFactory, mlflow_server: str) -> None:
    name = experiment()
    job_dir = run_factory.base_dir / "job"
    run_factory(
        "compute=local_mpi",
        "compute.procs_per_node=2",
        "dist=native",
        "logger=[console,mlflow]",
        f"logger.mlflow.tracking_uri={mlflow_server}",
        f"logger.mlflow.experiment={name}",
        "data.length=256",
        "data.num_classes=4",
        "trainer.batch_size=16",
        "trainer.log_every=1",
        "trainer.max_steps=4",
        job_dir=job_dir,
        timeout=240,
    ).assert_success()
    (run,) = runs_of(mlflow_server, name)
    assert (run.info.status, run.data.tags["ddlkit.world_size"], run.data.tags["ddlkit.compute"]) == (
        "FINISHED",
        "2",
        "local_mpi",
    )
    assert [s for s, _ in steps(mlflow_server, run.info.run_id)] == [1, 2, 3, 4]


# ---------------------------------------------------------------------------- a server that goes away
@pytest.mark.slow
def test_metrics_that_do_not_reach_a_server_gone_away_are_reported_not_fatal(
    own_mlflow_server: Any,
    ddlkit_pm: DdlkitPluginManager,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server stops while the job trains: the metrics sent in the background fail (MLflow's client
    retries are cut to none here), the checkpoint's flush says so in one line, training goes on."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    run = make_run(ddlkit_pm, tmp_path / "job", "trainer.epochs=1", "data.length=320")
    logger = MlflowLogger(OmegaConf.structured(MlflowConfig(tracking_uri=own_mlflow_server.uri, experiment="e")))
    logger.start(run)
    logger.log_metrics(1, {"loss": 1.0}, split="train")
    logger.flush()
    own_mlflow_server.stop()
    logger.log_metrics(2, {"loss": 0.5}, split="train")
    logger.flush()  # as ddlkit_checkpoint_saved calls it
    out = capsys.readouterr().out
    reported = f"1 of the metric batches sent in the background did not reach MLflow run {logger.run_id}"
    assert f"ddlkit: logger.mlflow: {reported}" in out, out


# ---------------------------------------------------------------------------- the test kit's contract
@pytest.mark.slow  # the session's MLflow server starts once (seconds)
class TestMlflowLogger(LoggerContract):
    """Runs on the real server, read back through MLflow's client."""

    @pytest.fixture
    def logger(self, mlflow_server: str) -> ddlkit.Logger:
        return MlflowLogger(OmegaConf.structured(MlflowConfig(tracking_uri=mlflow_server, experiment=experiment())))

    def read_back(self, logger: ddlkit.Logger, run: ddlkit.Run) -> list[tuple[int, str]]:
        """(step, split) of every point of each split's first metric, in step order (train before val)."""
        assert isinstance(logger, MlflowLogger)
        mlflow_run = client(logger.cfg.tracking_uri).get_run(kept_run_id(Path(run.job_dir)))
        kept = []
        for split in ("train", "val"):
            keys = sorted(k for k in mlflow_run.data.metrics if k.startswith(f"{split}/"))
            if keys:
                kept += [(s, split) for s, _ in steps(logger.cfg.tracking_uri, mlflow_run.info.run_id, keys[0])]
        return sorted(kept, key=lambda r: (r[0], r[1] == "val"))
