"""compute=azureml end to end: the real ``ddlkit`` CLI submits through the real azure-ai-ml SDK to
the loopback workspace (HTTPS on 127.0.0.1, storage in Azurite), which runs the job on this
machine; the result, the logs and the model come back into the local job directory.

No Azure service is contacted: the SDK's ARM and run-history calls go to the loopback server,
its blob calls through the intercepting proxy to Azurite (asserted: every CONNECT was to the
workspace's storage host)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ddlkit.compute.containers import image_context
from ddlkit.testing import interruptible, rank_rows, wait_for
from ddlkit.testing.registry import LoopbackRegistry
from ddlkit_azure.testing import Azurite
from ddlkit_azure.testing.azureml import BLOB_HOST, DEFAULT_DATASTORE, MANAGED_IDENTITY_CLAIMS, LoopbackWorkspace
from ddlkit_azure.testing.loopback import TOKEN_CLAIMS, LoopbackServer

if TYPE_CHECKING:
    from conftest import UserProject

pytestmark = pytest.mark.slow

TINY = (
    "data=synthetic",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=64",
    "data.val_length=16",
    "trainer.batch_size=16",
    "trainer.epochs=1",
)
#: the fake framework (ddlkit.testing.fakes, loaded on the ranks through DDLKIT_PLUGINS): jobs that last
#: (with ``fake_image``: ddlkit builds no image for it)
FAKE = (
    "framework=fake",
    "data=synthetic",
    "data.image_size=8",
    "data.num_classes=4",
    "data.val_length=8",
    "trainer.batch_size=4",
    "trainer.epochs=1",
)


def workspace_args(workspace: LoopbackWorkspace, *more: str) -> list[str]:
    return [
        "compute=azureml",
        f"compute.subscription_id={workspace.subscription}",
        f"compute.resource_group={workspace.resource_group}",
        f"compute.workspace={workspace.workspace}",
        "compute.cluster=gpu-cluster",
        "compute.poll_interval_s=0.3",
        *more,
    ]


def ddlkit(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


@pytest.fixture
def fake_image(oci_registry: LoopbackRegistry) -> str:
    """``compute.image=`` an image for framework=fake, in the loopback registry for anyone to pull."""
    oci_registry.public.add("ddlkit/fake")
    return "compute.image=" + oci_registry.push("ddlkit/fake", "test-cpu")


def job_put(server: LoopbackServer) -> dict:
    (put,) = server.requests("PUT", r".*/workspaces/[^/]+/jobs/[^/]+")
    return put.body["properties"]


def test_a_training_run_end_to_end(
    azureml_workspace: LoopbackWorkspace, azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = azureml_workspace.server
    sas = azurite.sas_token()
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_URL", azurite.account_url)
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", sas)
    job_dir = tmp_path / "runs" / "r18"
    run = ddlkit(
        *workspace_args(azureml_workspace, "compute.gpu=false"),
        "framework=pytorch",
        "model=resnet18",
        *TINY,
        "storage=azure",
        "storage.container=results",
        f"hydra.run.dir={job_dir}",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    # the result, the model, the metrics, a checkpoint and rank 0's log came back
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["status"], result["framework"], result["steps"], result["world_size"]) == (
        "completed",
        "pytorch",
        4,
        1,
    )
    for name in ("model.pt", "metrics.jsonl", "checkpoints/latest", "rank-0.log"):
        assert (job_dir / name).is_file(), name
    assert "train epoch 1/1" in (job_dir / "rank-0.log").read_text()
    # progress streamed from the job's log file, as it ran
    assert "train epoch 1/1 step 4/4" in run.stdout and f"ddlkit: done; result in {job_dir}" in run.stdout

    # the request the SDK sent: the job, its code and its environment
    job = job_put(server)
    name = job["displayName"]
    (azureml_name,) = azureml_workspace.jobs
    assert job["jobType"] == "Command" and job["experimentName"] == "ddlkit"
    assert job["resources"]["instanceCount"] == 1 and not job.get("distribution")
    assert job["command"].endswith("exec python -m ddlkit_azure.rank -- python -m ddlkit.rank.worker job.json")
    assert job["computeId"].endswith("/workspaces/ws-ddlkit/computes/gpu-cluster")
    assert job["outputs"]["job_dir"] == {
        "jobOutputType": "uri_folder",
        "mode": "ReadWriteMount",
        "uri": f"azureml://datastores/workspaceblobstore/paths/ddlkit/{name}/",
    }
    # ddlkit's image, built by the workspace from the checkout's docker/Dockerfile, CPU
    (environment,) = server.requests("PUT", r".*/environments/[^/]+/versions/.*")
    assert environment.path.endswith(
        f"/environments/ddlkit-pytorch-cpu/versions/{image_context('pytorch', gpu=False).digest[:16]}"
    )
    assert environment.body["properties"]["build"]["dockerfilePath"] == "docker/Dockerfile"
    assert job["environmentId"].endswith(environment.path.split("/workspaces/ws-ddlkit")[1])
    (code,) = server.requests("PUT", r".*/codes/[^/]+/versions/[^/]+")
    assert job["codeId"].endswith(code.path.split("/workspaces/ws-ddlkit")[1])
    # the secret went to the workspace's key vault, not into the job's definition: the job names the vault
    # and the secret (no value) and runs as the cluster's managed identity, with which its rank read it:
    # the results were published with it
    variables = job["environmentVariables"]
    vault = azureml_workspace.key_vault
    assert "AZURE_STORAGE_SAS_TOKEN" not in variables and variables["PYTHONUNBUFFERED"] == "1"
    assert variables["DDLKIT_AZURE_KEY_VAULT"] == vault.url
    names = json.loads(variables["DDLKIT_AZURE_SECRETS"])
    assert list(names) == ["AZURE_STORAGE_SAS_TOKEN"]
    secret = names["AZURE_STORAGE_SAS_TOKEN"]
    assert secret.startswith(azureml_name.replace("_", "-")) and re.fullmatch(r"[0-9A-Za-z-]{1,127}", secret)
    assert job["identity"] == {"identityType": "Managed"}
    published = (
        azureml_workspace._service().get_container_client("results").list_blobs(name_starts_with=f"results/{name}/")
    )
    assert "result.json" in {blob.name.rsplit("/", 1)[1] for blob in published}
    # stored by the launcher, tagged with the job and expiring in 7 days; read by the job's identity (each
    # read the vault's challenge first: no token, then the cluster identity's); deleted once the job was collected
    (stored,) = [r for r in vault.server.requests("PUT", f"/secrets/{secret}") if r.auth_scheme]
    assert stored.body["value"] == sas and stored.body["tags"]["ddlkit_job"] == azureml_name
    assert 6.9 * 86400 < stored.body["attributes"]["exp"] - stored.time <= 7 * 86400
    assert stored.principal == TOKEN_CLAIMS["oid"]
    reads = [r for r in vault.server.requests("GET", f"/secrets/{secret}/?") if r.auth_scheme]
    assert reads and {r.principal for r in reads} == {MANAGED_IDENTITY_CLAIMS["oid"]}
    assert vault.secrets[secret].deleted is not None and not vault.live()
    assert [r.principal for r in vault.server.requests("DELETE") if r.auth_scheme] == [TOKEN_CLAIMS["oid"]]
    # ... and nowhere else: not in the job's definition the workspace keeps (any Reader's), any request to
    # Azure ML, a file, the console or the jobs index
    assert sas not in json.dumps(azureml_workspace.jobs[azureml_name].spec)
    assert not [r.path for r in server.requests() if sas in r.data.decode(errors="replace") or sas in str(r.query)]
    assert not files_holding(tmp_path, sas), "the SAS token was written to a file"
    assert sas not in run.stdout + run.stderr

    # the job went through Azure ML's states, and nothing but the workspace's storage host was proxied
    assert azureml_workspace.jobs[azureml_name].states == [
        "NotStarted",
        "Queued",
        "Preparing",
        "Running",
        "Finalizing",
        "Completed",
    ]
    assert {host for host, _ in azureml_workspace.proxy.connects} == {BLOB_HOST, vault.host}
    assert all(r.auth_scheme == "Bearer" for r in server.requests() if "/subscriptions/" in r.path)

    # ddlkit jobs finds it and reads it from Azure ML
    status = ddlkit("jobs", "status", name, cwd=tmp_path)
    assert status.returncode == 0 and "state:     succeeded" in status.stdout, status.stdout + status.stderr
    assert f"compute=azureml, id {azureml_name}" in status.stdout
    logs = ddlkit("jobs", "logs", name, cwd=tmp_path)
    assert "train epoch 1/1 step 4/4" in logs.stdout


def test_detach_then_status_logs_attach_and_cancel(
    azureml_workspace: LoopbackWorkspace, fake_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A detached 2-rank job: `jobs status` says it runs and shows each rank's rate and waits, read
    from rank 0's telemetry.json in the job's output on its datastore (issue 42); `jobs attach`
    follows it and Ctrl-C leaves it running; `jobs cancel` stops it after a checkpoint."""
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes")
    job_dir = tmp_path / "long"
    submit = ddlkit(
        "--detach",
        *workspace_args(azureml_workspace, "compute.nodes=2"),
        *FAKE,
        fake_image,
        "dist=native",
        "framework.step_delay_s=0.2",
        "data.length=2000",
        "trainer.log_every=1",
        f"hydra.run.dir={job_dir}",
        cwd=tmp_path,
    )
    assert submit.returncode == 0, submit.stdout + submit.stderr
    name = json.loads((job_dir / ".ddlkit" / "submission.json").read_text())["name"]
    (azureml_name,) = azureml_workspace.jobs
    job = azureml_workspace.jobs[azureml_name]
    wait_for(
        lambda: job.state == "Running",
        "the Azure ML job to run",
        timeout=120,
        pace=0.2,
        detail=lambda: f"its states: {job.states}",
    )

    status = ddlkit("jobs", "status", name, cwd=tmp_path)
    assert "state:     running" in status.stdout, status.stdout + status.stderr
    rows = wait_for(
        lambda: rank_rows(ddlkit("jobs", "status", name, cwd=tmp_path).stdout),
        "a rank table in `ddlkit jobs status` of the running job",
        timeout=120,
        pace=1,
    )
    assert [row[0] for row in rows] == ["0", "1"], rows  # the loopback's two nodes are this machine
    assert not (job_dir / "result.json").exists() and job.state == "Running"
    # attach streams the job from its start; Ctrl-C (SIGINT) detaches, the job runs on
    attach = subprocess.Popen(
        [sys.executable, "-m", "ddlkit", "jobs", "attach", name],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,
    )
    seen = ""
    while "train epoch 1/1" not in seen and (line := attach.stdout.readline()):
        seen += line
    attach.send_signal(signal.SIGINT)
    out, _ = attach.communicate(timeout=60)
    assert "train epoch 1/1" in seen and "ddlkit: detached" in out, seen + out
    assert job.state == "Running"
    logs = ddlkit("jobs", "logs", name, cwd=tmp_path)
    assert "train epoch 1/1" in logs.stdout

    cancel = ddlkit("jobs", "cancel", name, cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert f"ddlkit: job {name} cancelled (exit status 75); resume with:" in cancel.stdout
    assert job.states[-3:] == ["Running", "CancelRequested", "Canceled"]
    # the job checkpointed on the way out, in its output, which came back
    assert (job_dir / "checkpoints" / "latest").is_file()
    assert "checkpoint saved, resumable" in (job_dir / "rank-0.log").read_text()
    again = ddlkit("jobs", "cancel", name, cwd=tmp_path)
    assert again.returncode == 0 and "already ended (cancelled)" in again.stdout


@pytest.mark.parametrize(
    ("framework", "layout", "kind"),
    [
        (("framework=fake",), ("compute.nodes=2",), "Mpi"),
        (("framework=pytorch", "model=resnet18", "compute.gpu=false"), ("compute.procs_per_node=2",), "PyTorch"),
    ],
)
def test_every_rank_finds_its_place(
    azureml_workspace: LoopbackWorkspace,
    fake_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    framework: tuple,
    layout: tuple,
    kind: str,
) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes")
    if framework == ("framework=fake",):
        framework = (*framework, fake_image)
    job_dir = tmp_path / "two"
    run = ddlkit(
        *workspace_args(azureml_workspace, *layout),
        *framework,
        "dist=native",
        *TINY[:4],
        "trainer.batch_size=8",
        "trainer.epochs=1",
        f"hydra.run.dir={job_dir}",
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert job_put(azureml_workspace.server)["distribution"]["distributionType"] == kind
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["world_size"], result["global_batch_size"]) == (2, 16)
    # each process's Azure ML log came back as its rank log
    assert (job_dir / "rank-0.log").is_file() and (job_dir / "rank-1.log").is_file()


def test_a_horovod_job_trains_on_2_ranks_in_the_image_with_horovod(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path
) -> None:
    """dist=horovod through the CLI: Azure ML's MPI starts 2 Horovod ranks (the loopback's nodes run
    this machine's Python, standing for the image's), in the environment built with HOROVOD=1."""
    pytest.importorskip("horovod.torch", reason="Horovod is not installed (scripts/install_horovod.sh)")
    job_dir = tmp_path / "hvd"
    run = ddlkit(
        *workspace_args(azureml_workspace, "compute.procs_per_node=2", "compute.gpu=false"),
        "framework=pytorch",
        "model=resnet18",
        "dist=horovod",
        *TINY[:4],
        "trainer.batch_size=8",
        "trainer.epochs=1",
        "framework.num_threads=1",
        f"hydra.run.dir={job_dir}",
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    job = job_put(azureml_workspace.server)
    assert job["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 2}
    version = image_context("pytorch", gpu=False, horovod=True).digest[:16]
    assert job["environmentId"].endswith(f"/environments/ddlkit-pytorch-cpu-horovod/versions/{version}")
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["status"], result["world_size"], result["global_batch_size"]) == ("completed", 2, 16)
    assert (job_dir / "rank-1.log").is_file()


def test_a_preempted_job_resumes_from_its_checkpoint_and_a_sweep_counts_it_once(
    azureml_workspace: LoopbackWorkspace, fake_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes")
    sweep_dir = tmp_path / "sweep"
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "-m",
            *workspace_args(azureml_workspace, "compute.spot=true"),
            *FAKE,
            fake_image,
            "framework.step_delay_s=0.1",
            "data.length=160",
            "trainer.checkpoint_every=5",
            "optimizer.lr=0.1",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: azureml_workspace.jobs, "the sweep to submit its job", timeout=120, pace=0.2, process=sweep)
        (azureml_name,) = azureml_workspace.jobs
        job = azureml_workspace.jobs[azureml_name]
        checkpoints = job.workdir / "attempt-1" / "outputs" / "job_dir" / "checkpoints"

        def last_checkpoint() -> int:
            """The step of the job's newest checkpoint (the rotation deletes older ones), 0 before the first."""
            return max((int(p.stem.removeprefix("step-")) for p in checkpoints.glob("step-*.ckpt")), default=0)

        wait_for(
            lambda: last_checkpoint() >= 10,
            "a checkpoint at step 10 or later",
            timeout=120,
            pace=0.1,
            process=sweep,
            detail=lambda: f"the job's states: {job.states}",
        )
        azureml_workspace.preempt(azureml_name, hard=True)  # SIGKILL: no checkpoint on the way out
        out, _ = sweep.communicate(timeout=300)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 0, out[-3000:]
    assert job_put(azureml_workspace.server)["queueSettings"] == {"jobTier": "Spot"}
    assert job.attempts == 2 and job.states.count("Running") == 2 and job.states[-1] == "Completed"
    ledger = json.loads((sweep_dir / "ledger.json").read_text())
    (entry,) = ledger["jobs"].values()
    assert (entry["status"], entry["attempts"]) == ("completed", 1)
    (result_file,) = sweep_dir.glob("*/result.json")
    result = json.loads(result_file.read_text())
    assert result["resumed_from_step"] >= 10 and result["resumed_from_step"] % 5 == 0
    assert result["steps"] == 40


def test_running_the_same_job_directory_again_resumes_from_its_output(
    azureml_workspace: LoopbackWorkspace, fake_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes")
    job_dir = tmp_path / "again"
    args = (*workspace_args(azureml_workspace), *FAKE, fake_image, "data.length=64", f"hydra.run.dir={job_dir}")
    first = ddlkit(*args, "trainer.max_steps=6", cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert json.loads((job_dir / "result.json").read_text())["steps"] == 6
    second = ddlkit(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["resumed_from_step"], result["steps"]) == (6, 16)
    # two Azure ML jobs (names are unique in a workspace), one output: the job directory's
    first_job, second_job = (r.body["properties"] for r in azureml_workspace.server.requests("PUT", r".*/jobs/[^/]+"))
    assert first_job["outputs"] == second_job["outputs"]
    assert len(azureml_workspace.jobs) == 2


def test_a_halving_sweep_promotes_a_trial_by_resuming_it_from_its_output(
    azureml_workspace: LoopbackWorkspace, fake_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sweep.early_stopping=asha on Azure ML (rungs at 1 of 2 epochs, the better half goes on): each
    segment is an Azure ML job of its own on the job directory's output, and the promoted trial's
    second one resumes from the checkpoint its first one wrote there."""
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes")
    sweep_dir = tmp_path / "sweep"
    run = ddlkit(
        "-m",
        *workspace_args(azureml_workspace),
        *FAKE[:-1],
        fake_image,
        "data.length=64",
        "trainer.epochs=2",
        "optimizer.lr=0.1,0.001",
        "sweep.early_stopping.scheduler=asha",
        "sweep.early_stopping.metric=loss",
        "sweep.early_stopping.reduction_factor=2",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    jobs = json.loads((sweep_dir / "ledger.json").read_text())["jobs"]
    assert sorted(j["status"] for j in jobs.values()) == ["completed", "paused"], run.stdout[-3000:]
    best = next(j for j in jobs.values() if j["status"] == "completed")
    assert [(s["from"], s["to"]) for s in best["segments"]] == [(0, 1), (1, 2)]
    result = json.loads((Path(best["job_dir"]) / "result.json").read_text())
    assert (result["resumed_from_step"], result["steps"]) == (16, 32)
    assert len(azureml_workspace.jobs) == 3  # two first segments and the promoted one


def snapshot_blobs(workspace: LoopbackWorkspace) -> dict[str, str]:
    """Every blob under the code snapshots' folder of the default datastore, with its ETag (which
    each upload of the blob changes)."""
    container = workspace._service().get_container_client(workspace.datastores[DEFAULT_DATASTORE])
    return {blob.name: blob.etag for blob in container.list_blobs(name_starts_with="ddlkit-code/")}


def test_a_package_only_in_the_launch_directory_reaches_the_job_as_a_snapshot_uploaded_once(
    azureml_workspace: LoopbackWorkspace,
    user_project: UserProject,
    fake_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes")

    def train(job_dir: Path, *more: str) -> dict:
        run = ddlkit(
            *workspace_args(azureml_workspace, *more),
            *FAKE[:1],
            fake_image,
            *user_project.overrides,
            f"hydra.run.dir={job_dir}",
            cwd=user_project.root,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return json.loads((job_dir / "result.json").read_text())

    first = tmp_path / "runs" / "first"
    assert train(first)["steps"] == 4
    digest = json.loads((first / "code.json").read_text())["digest"]
    where = f"ddlkit-code/{digest}"
    # the snapshot went to the datastore, at its digest, and the job read it from there as an input
    uploaded = snapshot_blobs(azureml_workspace)
    assert sorted(uploaded) == [
        f"{where}/code.json",
        f"{where}/code/my_pkg/__init__.py",
        f"{where}/code/my_pkg/data.py",
    ]
    job = job_put(azureml_workspace.server)
    assert job["inputs"]["code"] == {
        "jobInputType": "uri_folder",
        "mode": "Download",
        "uri": f"azureml://datastores/workspaceblobstore/paths/{where}/",
    }
    assert "DDLKIT_LAUNCH_DIR" not in job["environmentVariables"]
    # on the service's side, the job's directory held the snapshot beside job.json
    (ran,) = azureml_workspace.jobs.values()
    remote = ran.workdir / "attempt-1" / "outputs" / "job_dir"
    assert (remote / "code" / "my_pkg" / "data.py").read_text() == user_project.data_module(32)
    assert json.loads((remote / "code.json").read_text())["digest"] == digest

    # the same tree again, on two nodes (two processes put it into the job's directory at once):
    # nothing of the snapshot is uploaded (every blob keeps its ETag)
    second = train(tmp_path / "runs" / "second", "compute.nodes=2", "dist=native")
    assert (second["world_size"], second["steps"]) == (2, 2)
    assert snapshot_blobs(azureml_workspace) == uploaded

    # changed code is a new snapshot, uploaded, and it is what the job runs
    user_project.write(n=48)
    third = tmp_path / "runs" / "third"
    assert train(third)["steps"] == 6
    changed = json.loads((third / "code.json").read_text())["digest"]
    now = snapshot_blobs(azureml_workspace)
    assert {name: tag for name, tag in now.items() if name.startswith(where)} == uploaded
    assert sorted(name for name in now if not name.startswith(where)) == [
        f"ddlkit-code/{changed}/code.json",
        f"ddlkit-code/{changed}/code/my_pkg/__init__.py",
        f"ddlkit-code/{changed}/code/my_pkg/data.py",
    ]


@pytest.fixture
def run_with_a_secret(
    azureml_workspace: LoopbackWorkspace,
    azurite: Azurite,
    fake_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[Path], tuple[subprocess.CompletedProcess, str]]:
    """``run(job_dir)``: a fake job whose results go to Azurite with a SAS token, the run's one secret;
    the finished ``ddlkit`` process and the token."""
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_URL", azurite.account_url)
    sas = azurite.sas_token()
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", sas)

    def run(job_dir: Path) -> tuple[subprocess.CompletedProcess, str]:
        args = (*workspace_args(azureml_workspace), *FAKE, fake_image, "storage=azure", "storage.container=results")
        return ddlkit(*args, f"hydra.run.dir={job_dir}", cwd=tmp_path), sas

    return run


def test_a_key_vault_that_refuses_the_jobs_identity_is_one_line_and_the_secrets_go(
    azureml_workspace: LoopbackWorkspace, run_with_a_secret: Callable, tmp_path: Path
) -> None:
    """The cluster's identity has no role on the vault: each rank says so in one line (the vault, the
    secret, the role to grant) and exits 2 before the worker starts; the launcher still deletes the
    job's secrets once it has collected the job."""
    vault = azureml_workspace.key_vault
    vault.refuse(MANAGED_IDENTITY_CLAIMS["oid"])
    job_dir = tmp_path / "runs" / "refused"
    run, sas = run_with_a_secret(job_dir)
    out = run.stdout + run.stderr
    assert run.returncode == 2 and "not restarted: a config error" in out, out[-3000:]
    (secret,) = vault.secrets
    lines = [ln for ln in (job_dir / "rank-0.log").read_text().splitlines() if "key vault" in ln]
    assert lines == [
        f"ddlkit_azure: rank 0: reading the job's secret AZURE_STORAGE_SAS_TOKEN (key vault secret {secret}) from key "
        f"vault {vault.url}: refused (403: Caller is not authorized to perform action on resource. If role assignments "
        "were recently changed, please wait several minutes for role assignments to become effective. Caller: "
        f"oid={MANAGED_IDENTITY_CLAIMS['oid']};Action: 'Microsoft.KeyVault/vaults/secrets/getSecret/action';resource: "
        f"'{vault.arm_id}/secrets/{secret}';Assignment: (not found);Vault: {vault.name};location=westeurope); the "
        "job's identity (the compute cluster's managed identity) needs the 'Key Vault Secrets User' role on the "
        'vault (az role assignment create --role "Key Vault Secrets User" --assignee <its principal id> --scope '
        "<the vault's id>)."
    ], (job_dir / "rank-0.log").read_text()[-3000:]
    assert "Traceback" not in (job_dir / "rank-0.log").read_text()
    assert lines[0] in out
    assert not vault.live() and vault.secrets[secret].deleted is not None
    assert sas not in out and not files_holding(tmp_path, sas)


def test_secrets_the_vault_will_not_delete_are_one_warning_line(
    azureml_workspace: LoopbackWorkspace, run_with_a_secret: Callable, tmp_path: Path
) -> None:
    """Deleting the job's secrets once it is collected is best effort: a vault that refuses the
    launcher's delete is one warning line (they expire anyway), and the run succeeds."""
    vault = azureml_workspace.key_vault
    vault.refuse(TOKEN_CLAIMS["oid"], "DELETE")
    run, _ = run_with_a_secret(tmp_path / "runs" / "kept")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (secret,) = vault.live()
    (azureml_name,) = azureml_workspace.jobs
    warnings = [ln for ln in run.stderr.splitlines() if "secrets" in ln]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"ddlkit: warning: could not delete job {azureml_name}'s secrets from key vault {vault.url}: {secret} "
        "(Caller is not authorized to perform action on resource."
    ), run.stderr[-3000:]
    assert warnings[0].endswith(
        "they expire 7 days after the job was submitted (delete them with `az keyvault secret delete "
        "--vault-name <vault> --name <secret>`)"
    )
