"""compute=batchai: the real ``azure-mgmt-batchai`` 7.0.0 client (and ``azure-storage-file-share``)
over real HTTPS against the loopback Batch AI service (:mod:`ddlkit_azure.testing.batchai`), whose
jobs really run here under ``mpirun``; ``DefaultAzureCredential`` signs in through the stand-in ``az``.

The compute-target contract, ``ddlkit plan`` (every request, in order, secrets redacted, nothing
sent), training runs through the CLI that get ``result.json`` back, idempotent re-runs, request
bodies against the published schema, job states, log streaming, cancel, ``ddlkit jobs``,
staging onto the file server (with Azurite), ``ddlkit compute down``, and the one-line errors.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import ddlkit
from ddlkit import ConfigError, JobState
from ddlkit.compute.containers import default_image, release_frameworks
from ddlkit.compute.ports import free_ports
from ddlkit.compute.snapshot import CodeSnapshot
from ddlkit.testing import RunFactory, rank_rows, wait_for
from ddlkit.testing.contracts import ComputeTargetContract
from ddlkit.testing.registry import LoopbackRegistry
from ddlkit_azure.batchai import (
    BatchAIConfig,
    BatchAITarget,
    ClusterSettings,
    FileServerSettings,
    FileShareSettings,
    vm_gpus,
    vm_has_local_disk,
)
from ddlkit_azure.batchai_client import ACCOUNT_KEY_ENV, Service
from ddlkit_azure.testing.batchai import FILES_ACCOUNT, FILES_KEY, BatchAILoopback, schema_errors
from ddlkit_azure.testing.loopback import COUNTING_JOB, LoopbackServer, follow_while_dropping

if TYPE_CHECKING:
    from conftest import UserProject

SUB, RG, WS = "00000000-0000-0000-0000-0000000000c1", "ddlkit-rg", "ddlkit-ws"
ARM = rf"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft\.BatchAI/workspaces/{WS}"
#: the request a secret must never appear in besides the job's create: marker values
SECRET = "batchai-secret-marker-5f3c9a"


@pytest.fixture
def ssh_key(tmp_path: Path) -> Path:
    path = tmp_path / "id_test.pub"
    path.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDdkbGtpdC1sb29wYmFjay10ZXN0LWtleQ ddlkit@test\n")
    return path


@pytest.fixture
def batchai(
    https_loopback: LoopbackServer,
    azure_cli_login: Path,
    oci_registry: LoopbackRegistry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> BatchAILoopback:
    """The service, its nodes pulling from ``oci_registry``, which has ddlkit's images (in
    ``<registry>/ddlkit``) and :data:`FAKE` for anyone to pull."""
    monkeypatch.setenv(ACCOUNT_KEY_ENV, FILES_KEY)
    for framework in release_frameworks():
        for variant in ("cpu", "cuda", "cpu-horovod"):
            oci_registry.push(f"ddlkit/{framework}", f"{ddlkit.__version__}-{variant}")
            oci_registry.public.add(f"ddlkit/{framework}")
    oci_registry.push(*FAKE.split(":"))
    oci_registry.public.add(FAKE.split(":")[0])
    service = BatchAILoopback(https_loopback, tmp_path / "batchai", registry=oci_registry)
    yield service
    service.stop()
    assert not service.invalid, f"request bodies that do not fit the published schema: {service.invalid}"


def config(service: BatchAILoopback, ssh_key: Path, **options) -> BatchAIConfig:
    cluster = options.pop("cluster", {})
    file_server = options.pop("file_server", {})
    return BatchAIConfig(
        **{
            "subscription_id": SUB,
            "resource_group": RG,
            "workspace": WS,
            "endpoint": service.server.url,
            "gpu": False,
            "poll_interval_s": 0.2,
            "framework": "pytorch",
            "dist": "none",
            "storage": "local",
            "data_root": None,
            "registry": f"{service.registry.host}/ddlkit",
            "master_port": free_ports(2)[0],  # and the next one for the control plane
            "cluster": ClusterSettings(**{"vm_size": "Standard_D4_v2", "ssh_public_key_file": str(ssh_key), **cluster}),
            "file_server": FileServerSettings(**file_server),
            "file_share": FileShareSettings(url=service.share_url),
            **options,
        }
    )


def cli_args(service: BatchAILoopback, ssh_key: Path, *more: str) -> list[str]:
    return [
        "compute=batchai",
        f"compute.subscription_id={SUB}",
        f"compute.resource_group={RG}",
        f"compute.workspace={WS}",
        f"compute.endpoint={service.server.url}",
        f"compute.file_share.url={service.share_url}",
        f"compute.cluster.ssh_public_key_file={ssh_key}",
        "compute.cluster.vm_size=Standard_D4_v2",
        "compute.gpu=false",
        "compute.poll_interval_s=0.2",
        f"compute.registry={service.registry.host}/ddlkit",
        f"compute.master_port={free_ports(2)[0]}",
        *more,
    ]


#: framework=fake (the test kit's) has no image of ddlkit's: one in the registry stands for it
FAKE = "ddlkit-fake:test"


def fake_image(service: BatchAILoopback) -> str:
    return f"compute.image={service.registry.host}/{FAKE}"


def creates(service: BatchAILoopback) -> list[str]:
    """The kinds of resource created, in order (workspaces, experiments, fileServers, clusters, jobs)."""
    return [
        r.path.split("/")[-2] if "/experiments/" not in r.path or "/jobs/" in r.path else "experiments"
        for r in service.server.requests("PUT", ARM + r".*")
    ]


# ---------------------------------------------------------------------------- the contract
@pytest.mark.slow
class TestBatchAIContract(ComputeTargetContract):
    """The loopback's jobs run on this machine (under mpirun): their processes can be checked after a cancel."""

    timeout_s = 90.0
    cancel_timeout_s = 25.0

    @pytest.fixture
    def target(self, batchai: BatchAILoopback, ssh_key: Path) -> BatchAITarget:
        batchai.terminate_grace_s = 5.0
        return BatchAITarget(config(batchai, ssh_key))

    @pytest.fixture
    def multi_rank_target(self, batchai: BatchAILoopback, ssh_key: Path) -> BatchAITarget:
        batchai.terminate_grace_s = 5.0
        return BatchAITarget(config(batchai, ssh_key, procs_per_node=2))


# ---------------------------------------------------------------------------- the schema, VM sizes
def test_the_schema_check_can_fail() -> None:
    assert schema_errors(
        "ClusterCreateParameters", {"properties": {"vmSize": "x", "vmPriority": "cheap", "nodes": 3}}
    ) == [
        "properties.userAccountSettings: required by ClusterBaseProperties",
        "properties.vmPriority: 'cheap' is not one of dedicated, lowpriority",
        "properties.nodes: not a property of ClusterBaseProperties",
    ]


def test_vm_sizes() -> None:
    assert (vm_gpus("Standard_NC24rs_v3"), vm_gpus("STANDARD_NC6"), vm_gpus("Standard_D4_v2")) == (4, 1, 0)
    assert vm_gpus("Standard_NC96ads_A100_v4") is None  # a GPU family ddlkit does not list: not refused
    assert vm_has_local_disk("Standard_NC24rs_v3") and vm_has_local_disk("Standard_D4ds_v4")
    assert not vm_has_local_disk("Standard_D4s_v4") and not vm_has_local_disk("Standard_E8_v5")


# ---------------------------------------------------------------------------- plan
def test_plan_prints_every_request_in_order_and_sends_nothing(
    batchai: BatchAILoopback,
    ssh_key: Path,
    run_factory: RunFactory,
    azure_cli_login: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ACCOUNT_KEY_ENV, SECRET + "-filekey")
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", f"sv=2024&sig={SECRET}")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_URL", "https://acct.blob.core.windows.net")
    out = run_factory.cli(
        "plan",
        *cli_args(
            batchai,
            ssh_key,
            "compute.nodes=2",
            "compute.procs_per_node=2",
            "storage=nfs",
            "storage.root=$AZ_BATCHAI_MOUNT_ROOT/nfs",
            "dist=native",
            "compute.stage_from=blob://datasets/tiny",
            "data=imagefolder",
            "data.root=datasets/tiny",
        ),
    )
    out.assert_success()
    text = out.stdout
    sent = re.findall(r"^\s*\d+\. (GET|PUT|POST|DELETE) https://[^/\s]+(/subscriptions/\S+)", text, re.MULTILINE)
    kinds = [(method, url.split("?")[0].rsplit("/", 2)[-2]) for method, url in sent]
    assert kinds == [
        ("GET", "workspaces"),
        ("PUT", "workspaces"),
        ("GET", "experiments"),
        ("PUT", "experiments"),
        ("GET", WS),
        ("PUT", "fileServers"),
        ("GET", "clusters"),
        ("PUT", "clusters"),
        ("GET", "jobs"),
        ("PUT", "jobs"),
        ("GET", "jobs"),
        ("GET", "jobs"),
        ("PUT", "jobs"),
    ], text
    assert '"processCount": 4' in text and '"nodeCount": 2' in text and "--node-sizes 2,2" in text
    assert '"accountKey": "***"' in text and '"name": "AZURE_STORAGE_SAS_TOKEN"' in text
    assert SECRET not in text + out.stderr
    assert batchai.server.requests() == [], "ddlkit plan sent a request"
    assert not (azure_cli_login / "az.log").exists(), "ddlkit plan asked for a credential"


def test_the_mpi_command_line_is_a_shell_that_runs_the_rank_script(batchai: BatchAILoopback, ssh_key: Path) -> None:
    """Batch AI's MPI runtime starts the command line on every rank, its first word the program: the
    script (shell syntax) runs under an explicit ``bash -c``, byte for byte as rendered."""
    service = Service(config(batchai, ssh_key, nodes=2, procs_per_node=2, master_port=29500), planning=True)
    service.run_job(ddlkit.JobSpec(name="n", job_dir=Path("/nonexistent/job")))
    (mpi,) = [
        r.body["properties"]["customMpiSettings"]
        for r in service.recorded
        if r.method == "PUT" and "customMpiSettings" in (r.body or {}).get("properties", {})
    ]
    script = (
        'export MASTER_ADDR="$(awk \'NF && $1 !~ /^#/ {print $1; exit}\' "$AZ_BATCHAI_MPI_HOST_FILE")" '
        'MASTER_PORT=29500 PYTHONUNBUFFERED=1; export DDLKIT_CONTROL_ADDR="$MASTER_ADDR:29501"; '
        'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}"; '
        'cd "$AZ_BATCHAI_OUTPUT_JOB" && export OMPI_MCA_initial_wdir="$PWD" && exec python -m ddlkit_mpi.rank '
        '--job-dir . --node-sizes 2,2 --scratch "$AZ_BATCHAI_JOB_TEMP/ddlkit" --cancel-file .ddlkit/cancel-requested '
        "-- python -m ddlkit.rank.worker job.json"
    )
    assert mpi["commandLine"] == "bash -c " + shlex.quote(script)
    assert shlex.split(mpi["commandLine"]) == ["bash", "-c", script]
    assert mpi["processCount"] == 4


#: the seed's Batch AI cluster: 2 nodes of 4 V100s (conf/compute/batchai_nc24.yaml)
SHIPPED_CONF = Path(__file__).resolve().parents[3] / "conf"


def test_the_seeds_horovod_job_is_planned_on_a_machine_without_horovod(
    tmp_path: Path, run_factory: RunFactory, azure_cli_login: Path
) -> None:
    """The reference architecture's job (TensorFlow with Horovod on 2 x 4 GPUs) from a launcher whose
    Python cannot import Horovod: the plan names the image that brings it and starts 8 ranks."""
    hide = tmp_path / "no-horovod"
    hide.mkdir()
    # `import horovod` fails and importlib finds no installed Horovod, as where it was never installed
    (hide / "sitecustomize.py").write_text(
        "import importlib.machinery, sys\n"
        "class _NoHorovod:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        return importlib.machinery.ModuleSpec(name, None) if name.split('.')[0] == 'horovod' else None\n"
        "sys.meta_path.insert(0, _NoHorovod)\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])}
    out = run_factory.cli(
        "plan",
        f"hydra.searchpath=[file://{SHIPPED_CONF}]",
        "compute=batchai_nc24",
        f"compute.subscription_id={SUB}",
        f"compute.resource_group={RG}",
        f"compute.workspace={WS}",
        "compute.file_share.url=https://acct.file.core.windows.net/share",
        "storage=nfs",
        "storage.root=$AZ_BATCHAI_MOUNT_ROOT/nfs",
        "dist=horovod",
        "framework=tensorflow",
        f"compute.cluster.ssh_public_key_file={tmp_path / 'id.pub'}",
        env=env,
    )
    out.assert_success()
    image = default_image("tensorflow", gpu=True, horovod=True)
    assert image.endswith(f"/tensorflow:{ddlkit.__version__}-cuda-horovod")
    assert f"the ranks run in image {image}; dist=horovod: Horovod comes from the image" in out.stdout, out.output
    assert "the launcher needs no Horovod" in out.stdout
    assert f'"image": "{image}"' in out.stdout
    assert '"processCount": 8' in out.stdout and '"nodeCount": 2' in out.stdout and "--node-sizes 4,4" in out.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import horovod"], env={**os.environ, **env}, capture_output=True, check=False
    )
    assert probe.returncode != 0, "the launcher could import Horovod"


@pytest.mark.slow
def test_a_horovod_job_runs_in_ddlkits_image_with_horovod(
    batchai: BatchAILoopback, ssh_key: Path, tmp_path: Path
) -> None:
    """What the service receives for dist=horovod: the image with Horovod built in (asked of its
    registry first, as the nodes pull it), and custom MPI settings for every rank of the job."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text("{}\n")
    code = "import os; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], 'of', os.environ['OMPI_COMM_WORLD_SIZE'])"
    handle = BatchAITarget(config(batchai, ssh_key, dist="horovod", procs_per_node=2)).submit(
        ddlkit.JobSpec(name="hvd", job_dir=job_dir, args=("-c", code))
    )
    assert handle.wait(timeout=120).state is JobState.SUCCEEDED
    (put,) = batchai.server.requests("PUT", ARM + r"/experiments/ddlkit/jobs/.*")
    props = put.body["properties"]
    image = default_image("pytorch", gpu=False, registry=f"{batchai.registry.host}/ddlkit", horovod=True)
    assert props["containerSettings"]["imageSourceRegistry"]["image"] == image
    assert props["customMpiSettings"]["processCount"] == 2 and props["nodeCount"] == 1
    assert ("HEAD", f"/v2/ddlkit/pytorch/manifests/{ddlkit.__version__}-cpu-horovod") in [
        (r.method, r.path) for r in batchai.registry.requests
    ]
    assert "rank 0 of 2" in "".join(handle.logs(follow=False))


# ---------------------------------------------------------------------------- through the CLI
@pytest.mark.slow
def test_a_job_runs_and_a_second_reuses_everything(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path
) -> None:
    args = cli_args(
        batchai,
        ssh_key,
        fake_image(batchai),
        "compute.nodes=2",
        "compute.procs_per_node=1",
        "dist=native",
        "storage=nfs",
        "storage.root=$AZ_BATCHAI_MOUNT_ROOT/nfs",
        "trainer.epochs=1",
    )
    first = run_factory(*args, job_dir=tmp_path / "first")
    first.assert_success()
    assert first.result["world_size"] == 2
    assert creates(batchai) == ["workspaces", "experiments", "fileServers", "clusters", "jobs"]
    job_put = batchai.server.requests("PUT", ARM + r"/experiments/ddlkit/jobs/.*")[0].body["properties"]
    assert job_put["customMpiSettings"]["processCount"] == 2 and job_put["nodeCount"] == 2
    assert job_put["containerSettings"]["imageSourceRegistry"]["image"] == f"{batchai.registry.host}/{FAKE}"
    # rank 0's output streamed from stdout.txt, through listOutputFiles and the file's download URL
    last = [ln for ln in (tmp_path / "first" / "rank-0.log").read_text().splitlines() if ln.strip()][-1]
    assert last in first.stdout and "ddlkit: done" in first.stdout, first.output
    assert batchai.server.requests("POST", ARM + r".*/listOutputFiles")
    assert [r for r in batchai.server.requests("GET") if r.param("sig")], "no download URL was used"
    # the results went to the file server (storage=nfs) as well as back to the job directory
    assert list(batchai.file_server_dir("ddlkit-nfs").glob("results/*/result.json"))

    batchai.server.clear()
    batchai.queue_s = 4.0  # a queued job is not silent: the launcher says what the service says
    second = run_factory(*args, job_dir=tmp_path / "second")
    second.assert_success()
    assert "\nddlkit: job pending (Batch AI: queued), no output yet\n" in second.stdout, second.output
    assert creates(batchai) == ["jobs"], "a second job created resources again"
    looked_up = {r.path.rsplit("/", 1)[-1] for r in batchai.server.requests("GET", ARM + r"(/.*)?")}
    assert {WS, "ddlkit", "fileServers"} <= looked_up, looked_up  # workspace, experiment and cluster, file servers

    changed = run_factory(
        *args[:-1], "compute.cluster.vm_size=Standard_D8_v3", "trainer.epochs=1", job_dir=tmp_path / "third"
    )
    changed.assert_one_line_error(
        "cluster ddlkit exists with other settings",
        "vm_size is Standard_D4_v2",
        "compute.cluster.vm_size=Standard_D8_v3",
        "compute down",
    )


@pytest.mark.slow
def test_a_package_only_in_the_launch_directory_reaches_the_job_as_a_snapshot_uploaded_once(
    batchai: BatchAILoopback, ssh_key: Path, user_project: UserProject, tmp_path: Path
) -> None:
    run = RunFactory(user_project.root)
    args = cli_args(batchai, ssh_key, fake_image(batchai), *user_project.overrides)
    share = batchai.share_dir(FILES_ACCOUNT, "share")

    def uploads(digest: str) -> list[str]:
        """The files of the snapshot the launcher created on the share (Azure Files' Create File)."""
        return sorted(
            r.path.split(f"/ddlkit/code/{digest}/", 1)[1]
            for r in batchai.server.requests("PUT", rf"/{FILES_ACCOUNT}/share/ddlkit/code/{digest}/.*")
            if not r.query
        )

    first = run(*args, job_dir=tmp_path / "runs" / "first").assert_success()
    assert first.result["steps"] == 4
    digest = json.loads((first.job_dir / "code.json").read_text())["digest"]
    assert uploads(digest) == ["code.json", "code/my_pkg/__init__.py", "code/my_pkg/data.py"]
    assert (share / "ddlkit" / "code" / digest / "code" / "my_pkg" / "data.py").read_text() == user_project.data_module(
        32
    )
    # the job's folder on the share holds the job's files but not the snapshot; its preparation
    # copied the snapshot into the job's directory, beside job.json, where the ranks ran
    (job_folder,) = (share / "ddlkit" / "jobs").iterdir()
    assert (job_folder / "job.json").is_file() and not (job_folder / "code").exists()
    (ran,) = [p.parent for p in share.rglob("job.json") if (p.parent / "result.json").is_file()]
    assert (ran / "code" / "my_pkg" / "data.py").read_text() == user_project.data_module(32)
    assert json.loads((ran / "code.json").read_text())["digest"] == digest
    # what comes back to the launcher is what the ranks wrote, not the snapshot they ran with the .pyc
    # running it left (the launcher's own snapshot stays as it wrote it; issue 37, item 21)
    kept = sorted(p.relative_to(first.job_dir).as_posix() for p in (first.job_dir / "code").rglob("*") if p.is_file())
    assert kept == ["code/my_pkg/__init__.py", "code/my_pkg/data.py"] and (first.job_dir / "rank-0.log").is_file()

    # the same tree again: asked for (HEAD of its code.json), and not uploaded
    batchai.server.clear()
    second = run(*args, job_dir=tmp_path / "runs" / "second").assert_success()
    assert second.result["steps"] == 4
    assert uploads(digest) == []
    assert [r.method for r in batchai.server.requests(path=rf"/{FILES_ACCOUNT}/share/ddlkit/code/.*")] == ["HEAD"]

    # changed code is a new snapshot, uploaded, and it is what the job runs
    user_project.write(n=48)
    third = run(*args, job_dir=tmp_path / "runs" / "third").assert_success()
    assert third.result["steps"] == 6
    changed = json.loads((third.job_dir / "code.json").read_text())["digest"]
    assert changed != digest
    assert uploads(changed) == ["code.json", "code/my_pkg/__init__.py", "code/my_pkg/data.py"]


def test_plan_names_where_the_code_snapshot_goes(
    batchai: BatchAILoopback, ssh_key: Path, user_project: UserProject, tmp_path: Path
) -> None:
    args = cli_args(batchai, ssh_key, fake_image(batchai), *user_project.overrides)
    out = RunFactory(user_project.root).cli("plan", *args, f"hydra.run.dir={tmp_path / 'job'}").assert_success()
    digest = CodeSnapshot.take(user_project.root, max_bytes=10**6).digest
    folder = f"{batchai.share_url}/ddlkit/code/{digest}"
    assert "code: a snapshot of the launch directory ships with the job (2 files" in out.stdout
    assert f"HEAD {folder}/code.json" in out.stdout and f"PUT {folder}/..." in out.stdout
    assert f'cp -a \\"$AZ_BATCHAI_MOUNT_ROOT/azfiles/ddlkit/code/{digest}/.\\" \\"$out/\\"' in out.stdout
    assert batchai.server.requests() == [], "ddlkit plan sent a request"


@pytest.mark.slow
def test_states_logs_cancel_and_ddlkit_jobs(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path
) -> None:
    """A detached 2-rank job: its states, rank 0's log as it comes, `jobs status` with each rank's
    rate and waits while it runs (rank 0's telemetry.json read from the file share, issue 42), and
    `jobs cancel`."""
    batchai.queue_s = 2.0
    job_dir = tmp_path / "job"
    args = cli_args(batchai, ssh_key, fake_image(batchai), "compute.procs_per_node=2", "dist=native")
    out = run_factory("--detach", *args, "framework.step_delay_s=0.3", "trainer.log_every=1", job_dir=job_dir)
    out.assert_success()
    job_id = json.loads((job_dir / ".ddlkit" / "submission.json").read_text())["id"]
    handle = BatchAITarget(config(batchai, ssh_key)).attach(job_id, job_dir=job_dir)
    states: list[JobState] = []

    def running() -> bool:
        states.append(handle.status().state)
        return states[-1] is JobState.RUNNING

    wait_for(running, "the job to run", timeout=60, pace=0.2, detail=lambda: f"its states: {states}")
    assert states[0] is JobState.PENDING, states
    status = run_factory.cli("jobs", "status", str(job_dir))
    assert "state:     running" in status.stdout, status.output
    seen = ""
    for chunk in handle.logs(follow=True):  # rank 0's output as it comes, from stdout.txt
        seen += chunk
        if "step" in seen:
            break
    assert "step" in seen, seen
    rows = wait_for(
        lambda: rank_rows(run_factory.cli("jobs", "status", str(job_dir)).assert_success().stdout),
        "a rank table in `ddlkit jobs status` of the running job",
        timeout=60,
        pace=1,
    )
    assert [row[:2] for row in rows] == [("0", "0"), ("1", "0")], rows
    assert not (job_dir / "result.json").exists()
    cancel = run_factory.cli("jobs", "cancel", str(job_dir), timeout=90)
    cancel.assert_success()
    assert "cancelled" in cancel.stdout and "resume with: ddlkit" in cancel.stdout, cancel.output
    assert batchai.server.requests("POST", ARM + r".*/terminate")
    assert batchai.job_processes(job_id) is None
    status = run_factory.cli("jobs", "status", str(job_dir))
    assert "state:     cancelled" in status.stdout, status.output
    logs = run_factory.cli("jobs", "logs", str(job_dir))
    assert seen in logs.stdout, logs.output


@pytest.mark.slow
def test_the_rank_that_failed_first_is_judged_from_the_records_in_the_output(
    batchai: BatchAILoopback, ssh_key: Path, tmp_path: Path
) -> None:
    """The ranks' exit records come back with the output directory, before the job is judged: the
    rank that failed first is named, with its own log's last lines, instead of the service's word
    alone; an earlier run's records neither go up with the job directory nor stay in it."""
    job_dir = tmp_path / "job"
    (job_dir / ".ranks").mkdir(parents=True)
    (job_dir / "job.json").write_text("{}\n")
    stale = {"rank": 0, "node": 0, "local_rank": 0, "code": 1, "time": 1.0, "log": "rank-0.log", "pid": 1, "host": "x"}
    (job_dir / ".ranks" / "rank-0.json").write_text(json.dumps(stale))
    code = (
        "import os, sys, time\n"
        "if os.environ['OMPI_COMM_WORLD_RANK'] == '1':\n"
        "    print('rank 1: the batch is bad', flush=True)\n"
        "    sys.exit(4)\n"
        "time.sleep(60)\n"
    )
    handle = BatchAITarget(config(batchai, ssh_key, procs_per_node=2)).submit(
        ddlkit.JobSpec(name="first-failure", job_dir=job_dir, args=("-c", code))
    )
    status = handle.wait(timeout=90)
    assert (status.state, status.exit_code) == (JobState.FAILED, 4), status
    assert re.match(
        rf"Batch AI job {handle.id} failed with exit code \d+; rank 1 \(node 0, host [^)]+\) failed first, with "
        r"exit status 4; last lines of .*rank-1\.log:\n    rank 1: the batch is bad\n",
        status.message,
    ), status.message
    records = {p.name: json.loads(p.read_text())["code"] for p in (job_dir / ".ranks").iterdir()}
    assert records["rank-1.json"] == 4 and records["rank-0.json"] != 1, records


@pytest.mark.slow
def test_a_log_server_that_ignores_range_gets_each_line_printed_once(
    batchai: BatchAILoopback, ssh_key: Path, tmp_path: Path
) -> None:
    """stdout.txt is read from where the last read stopped (a 200 to a ranged read is the whole
    file), once per poll interval while the job runs."""
    batchai.ignore_range = True
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text("{}\n")
    code = "import time\nfor i in range(6):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\n"
    handle = BatchAITarget(config(batchai, ssh_key)).submit(
        ddlkit.JobSpec(name="ranged", job_dir=job_dir, args=("-c", code))
    )
    started, output = time.monotonic(), ""
    for chunk in handle.logs(follow=True):
        output += chunk
        assert output.count("line 0\n") <= 1, f"a line printed again:\n{output}"
    following_s = time.monotonic() - started
    assert [ln for ln in output.splitlines() if ln.startswith("line ")] == [f"line {i}" for i in range(6)], output
    reads = [r for r in batchai.server.requests("GET") if r.param("sig")]
    assert len(reads) <= following_s / 0.2 + 3, (len(reads), following_s)


@pytest.mark.slow
def test_secrets_travel_as_job_secrets_and_nowhere_else(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path
) -> None:
    job_dir = tmp_path / "job"
    # an environment variable the job gets whose name says it is secret (prepare.job_environment)
    out = run_factory(
        *cli_args(batchai, ssh_key, fake_image(batchai)),
        "trainer.epochs=1",
        f"+hydra.job.env_set.DDLKIT_TEST_TOKEN={SECRET}",
        job_dir=job_dir,
    )
    out.assert_success()
    (put,) = batchai.server.requests("PUT", ARM + r"/experiments/ddlkit/jobs/.*")
    props = put.body["properties"]
    assert {"name": "DDLKIT_TEST_TOKEN", "value": SECRET} in props["secrets"]
    assert SECRET not in json.dumps(props["environmentVariables"])
    reported = Service(config(batchai, ssh_key)).get_job(put.path.rsplit("/", 1)[-1])
    secrets = [(s.name, s.value) for s in reported.secrets if s.name == "DDLKIT_TEST_TOKEN"]
    assert secrets == [("DDLKIT_TEST_TOKEN", None)]
    leaked = [
        p
        for root in (job_dir, batchai.root, tmp_path / ".ddlkit-state")
        for p in root.rglob("*")
        if p.is_file() and SECRET.encode() in p.read_bytes()
    ]
    assert not leaked, leaked
    assert SECRET not in out.stdout + out.stderr


def test_errors_are_one_line(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = run_factory(*[a for a in cli_args(batchai, ssh_key) if a != "compute.gpu=false"])  # a GPU run
    gpu.assert_one_line_error("compute.cluster.vm_size=Standard_D4_v2 has no GPU", "compute.gpu=false")
    assert batchai.server.requests() == []
    ssd = run_factory(
        *cli_args(batchai, ssh_key, fake_image(batchai), "compute.cluster.vm_size=Standard_D4s_v4", "storage=local_ssd")
    )
    ssd.assert_one_line_error("storage=local_ssd", "Standard_D4s_v4 has none", "storage=nfs")
    nfs = run_factory(*cli_args(batchai, ssh_key, fake_image(batchai), "storage=nfs", "storage.root=/mnt/nfs"))
    nfs.assert_one_line_error("storage.root='$AZ_BATCHAI_MOUNT_ROOT/nfs'")
    batchai.core_quota = 4
    quota = run_factory(*cli_args(batchai, ssh_key, fake_image(batchai), "compute.nodes=2", "dist=native"))
    quota.assert_one_line_error("creating cluster ddlkit", "QuotaExceeded", "Maximum allowed: 4")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no `az`: nothing to sign in with
    nobody = run_factory(*cli_args(batchai, ssh_key, fake_image(batchai)))
    nobody.assert_one_line_error("no Azure credential found", "az login", "managed identity")


# ---------------------------------------------------------------------------- the image
# Without the check each of these jobs is created and queued, and fails when the nodes pull its image.
def test_an_image_the_registry_does_not_have_is_refused_before_anything_is_created(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory
) -> None:
    host = batchai.registry.host
    run = run_factory(*cli_args(batchai, ssh_key, f"compute.image={host}/ddlkit-fake:missing"))
    run.assert_one_line_error(
        f"image {host}/ddlkit-fake:missing does not exist ({host} answered 404 for ddlkit-fake:missing)",
        f"scripts/build_images.sh --registry {host} --push",
        "or set compute.image to an image that exists",
    )
    assert batchai.server.requests("PUT") == []


def test_ddlkits_image_never_pushed_to_the_registry_is_refused(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory
) -> None:
    """A repository that does not exist is refused to an anonymous client, as Docker Hub refuses one (401)."""
    host = batchai.registry.host
    run = run_factory(*cli_args(batchai, ssh_key, f"compute.registry={host}/elsewhere"), "framework=pytorch")
    image = default_image("pytorch", gpu=False, registry=f"{host}/elsewhere")
    run.assert_one_line_error(
        f"image {image} cannot be pulled: {host} refused it without credentials (401), so it "
        "does not exist or is private",
        f"scripts/build_images.sh --registry {host}/elsewhere --push",
    )
    assert batchai.server.requests("PUT") == []


def test_an_image_that_cannot_be_checked_is_said_and_the_job_submitted(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory
) -> None:
    batchai.registry.auth = "Negotiate"  # an authentication ddlkit does not speak
    run = run_factory(*cli_args(batchai, ssh_key, fake_image(batchai)), "trainer.epochs=1")
    run.assert_success()
    host = batchai.registry.host
    assert (
        f"ddlkit: note: could not check that image {host}/{FAKE} can be pulled ({host} asks for an "
        "authentication ddlkit does not speak (Negotiate)); submitting anyway\n"
    ) in run.stderr, run.output


def test_a_file_server_being_created_is_waited_for(batchai: BatchAILoopback, ssh_key: Path) -> None:
    said: list[str] = []
    batchai.add_file_server(SUB, RG, WS, "ddlkit-nfs", ready_after_s=1.0)
    service = Service(config(batchai, ssh_key, storage="nfs", file_server={"wait_s": 30}), say=said.append)
    assert service.prepare()[1].provisioning_state == "succeeded"
    assert any("file server ddlkit-nfs is still being created" in s for s in said), said
    batchai.add_file_server(SUB, RG, WS, "slow-nfs")
    slow = Service(
        config(batchai, ssh_key, storage="nfs", file_server={"name": "slow-nfs", "wait_s": 0.5}), say=said.append
    )
    with pytest.raises(ConfigError, match="file server slow-nfs is still being created after .* compute.file_server"):
        slow.prepare()


@pytest.mark.slow
def test_down_deletes_only_what_ddlkit_created(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path
) -> None:
    args = cli_args(
        batchai,
        ssh_key,
        fake_image(batchai),
        "storage=nfs",
        "storage.root=$AZ_BATCHAI_MOUNT_ROOT/nfs",
        "trainer.epochs=1",
    )
    run_factory(*args, job_dir=tmp_path / "job").assert_success()
    batchai.add_file_server(SUB, RG, WS, "theirs", state="succeeded")
    refused = run_factory.cli("compute", "down", *args)
    refused.assert_one_line_error("add --yes")
    assert batchai.server.requests("DELETE") == []
    down = run_factory.cli("compute", "down", "--yes", *args)
    down.assert_success()
    assert "will delete" in down.stdout and "cluster ddlkit" in down.stdout and "file server ddlkit-nfs" in down.stdout
    assert [r.path.rsplit("/", 2)[-2] for r in batchai.server.requests("DELETE")] == ["clusters", "fileServers"]
    theirs = run_factory.cli(
        "compute",
        "down",
        "--yes",
        *args[:-2],
        "compute.file_server.name=theirs",
        "storage=nfs",
        "storage.root=$AZ_BATCHAI_MOUNT_ROOT/nfs",
    )
    theirs.assert_success()
    assert "theirs was not created by ddlkit: kept" in theirs.stderr and "nothing deleted" in theirs.stdout
    assert len(batchai.server.requests("DELETE")) == 2


def test_composing_imports_no_azure_sdk(batchai: BatchAILoopback, ssh_key: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from ddlkit.launch.cli import main; main(sys.argv[1:]); "
        "print('AZURE', sorted(m for m in sys.modules if m.startswith(('azure', 'msrest'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "--cfg", "job", *cli_args(batchai, ssh_key)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert "AZURE []" in proc.stdout, proc.stdout[-2000:] + proc.stderr


def test_a_missing_resource_group_is_one_line_naming_the_fix(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory
) -> None:
    """ARM answers 404 ResourceGroupNotFound to every request under a resource group that does not exist."""
    batchai.resource_groups = {"someone-elses-rg"}
    run = run_factory(*cli_args(batchai, ssh_key, fake_image(batchai)))
    run.assert_one_line_error(
        f"looking up workspace {WS}: resource group {RG} was not found in subscription {SUB}",
        "ResourceGroupNotFound",
        "check compute.resource_group",
        f"az group create --name {RG}",
    )
    assert batchai.server.requests("PUT") == []
    down = run_factory.cli("compute", "down", "--yes", *cli_args(batchai, ssh_key, fake_image(batchai)))
    down.assert_one_line_error(f"resource group {RG} was not found")


def test_compute_down_without_the_workspace_has_nothing_to_delete(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory
) -> None:
    """Batch AI answers 404 to listing the file servers of a workspace that does not exist."""
    down = run_factory.cli(
        "compute",
        "down",
        "--yes",
        *cli_args(batchai, ssh_key, fake_image(batchai), "storage=nfs", "storage.root=$AZ_BATCHAI_MOUNT_ROOT/nfs"),
    )
    down.assert_success()
    assert f"nothing to delete: workspace {WS} does not exist in resource group {RG}" in down.stderr, down.output
    assert "ddlkit compute down: nothing deleted" in down.stdout and "Traceback" not in down.stderr
    assert batchai.server.requests("DELETE") == []


def test_compute_down_on_a_target_that_keeps_nothing(run_factory: RunFactory) -> None:
    run_factory.cli("compute", "down", "--yes", "compute=local").assert_one_line_error(
        "compute=local keeps nothing between jobs"
    )


# ---------------------------------------------------------------------------- staging
@pytest.mark.slow
def test_staging_copies_the_dataset_once(
    batchai: BatchAILoopback, ssh_key: Path, blob_container: str, tmp_path: Path
) -> None:
    from ddlkit.testing.core import upload

    data = tmp_path / "tiny"
    for cls in ("a", "b"):
        (data / "train" / cls).mkdir(parents=True)
        for i in range(3):
            (data / "train" / cls / f"{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    assert upload(data, f"{blob_container}/tiny", workers=4) == 0
    said: list[str] = []
    cfg = config(batchai, ssh_key, storage="nfs", stage_from=f"{blob_container}/tiny", data_root="datasets/tiny")
    service = Service(cfg, say=said.append)
    cluster, _ = service.prepare()
    service.stage(cluster)
    staged = batchai.file_server_dir("ddlkit-nfs") / "datasets" / "tiny"
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*.bin")) == [
        f"train/{c}/{i}.bin" for c in ("a", "b") for i in range(3)
    ]
    assert (staged / ".ddlkit" / "complete").is_file()
    stage_jobs = batchai.server.requests("PUT", ARM + r"/experiments/ddlkit/jobs/stage-.*")
    assert len(stage_jobs) == 1
    assert stage_jobs[0].body["properties"]["secrets"][0]["name"] == "AZURE_STORAGE_CONNECTION_STRING"

    Service(cfg, say=said.append).stage(cluster)
    assert len(batchai.server.requests("PUT", ARM + r"/experiments/ddlkit/jobs/stage-.*")) == 1
    assert "staging skipped" in said[-1]


# ---------------------------------------------------------------------------- a real training run
@pytest.mark.slow
@pytest.mark.parametrize("dist", ["native", "horovod"])
def test_resnet18_trains_through_the_cli(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path, dist: str
) -> None:
    if dist == "horovod" and shutil.which("mpirun") is not None:
        pytest.importorskip("horovod.torch", reason="Horovod is not installed (scripts/install_horovod.sh)")
    job_dir = tmp_path / "job"
    out = run_factory(
        *cli_args(
            batchai,
            ssh_key,
            "compute.nodes=1",
            "compute.procs_per_node=2",
            f"dist={dist}",
            "storage=nfs",
            "storage.root=$AZ_BATCHAI_MOUNT_ROOT/nfs",
        ),
        "framework=pytorch",
        "model=resnet18",
        "data=synthetic",
        "data.image_size=32",
        "data.num_classes=10",
        "data.length=64",
        "data.val_length=16",
        "trainer.batch_size=8",
        "trainer.epochs=1",
        "framework.num_threads=1",
        job_dir=job_dir,
        timeout=400,
    )
    out.assert_success()
    assert (out.result["world_size"], out.result["framework"], out.result["model"]) == (2, "pytorch", "resnet18")
    assert (job_dir / "model.pt").is_file() and (job_dir / "rank-1.log").is_file()
    (put,) = batchai.server.requests("PUT", ARM + r"/experiments/ddlkit/jobs/.*")
    image = put.body["properties"]["containerSettings"]["imageSourceRegistry"]["image"]
    horovod = dist == "horovod"  # the image with Horovod built in
    assert image == default_image("pytorch", gpu=False, registry=f"{batchai.registry.host}/ddlkit", horovod=horovod)
    # the registry was asked for it as the nodes pull it, without credentials, before the job was created
    tag = f"{ddlkit.__version__}-cpu" + ("-horovod" if horovod else "")
    assert ("HEAD", f"/v2/ddlkit/pytorch/manifests/{tag}", "Bearer") in [
        (r.method, r.path, r.auth_scheme) for r in batchai.registry.requests
    ]


@pytest.mark.slow
def test_a_job_whose_node_was_preempted_is_resubmitted_and_resumes(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path
) -> None:
    """The job's node is taken (its processes killed at once, the job failed with exit code 137):
    the launcher's restart policy submits a new Batch AI job for the same job directory, which resumes
    from the last checkpoint and completes; `ddlkit jobs status` names the job that was lost."""
    from ddlkit.testing.core import checkpoint_step, latest_checkpoint, verify

    job_dir = tmp_path / "preempted"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            *cli_args(batchai, ssh_key, fake_image(batchai)),
            "framework=fake",
            "framework.step_delay_s=0.2",
            "trainer.epochs=1",
            "trainer.checkpoint_every=5",
            "restart.backoff_s=0",
            f"hydra.run.dir={job_dir}",
        ],
        cwd=tmp_path,
        env={**os.environ, "DDLKIT_PLUGINS": "ddlkit.testing.fakes"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        submission = job_dir / ".ddlkit" / "submission.json"
        wait_for(submission.is_file, "the job to be submitted", timeout=120, pace=0.2, process=launcher)
        first = json.loads(submission.read_text())["id"]

        def checkpointed() -> int:
            return max((checkpoint_step(p) or 0 for p in batchai.root.rglob("checkpoints/step-*.ckpt")), default=0)

        wait_for(
            lambda: checkpointed() >= 10, "a checkpoint at step 10 or later", timeout=120, pace=0.1, process=launcher
        )
        batchai.preempt(first)
        stdout, stderr = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "ddlkit: restart 1/3: a rank was killed by SIGKILL from outside (a lost node, a preemption); " in stdout
    record = json.loads((job_dir / ".ddlkit" / "submission.json").read_text())
    [entry] = record["restarts"]
    assert entry["ended_id"] == first and record["id"] != first and entry["exit_code"] == 137
    assert entry["resumed_from"] >= 10 and entry["resumed_from"] % 5 == 0
    assert entry["steps_lost"] == entry["step_reached"] - entry["resumed_from"]
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["restarts"], result["resumed_from_step"], result["steps_lost"]) == (
        1,
        entry["resumed_from"],
        entry["steps_lost"],
    )
    assert result["steps"] == 80 and verify(latest_checkpoint(job_dir)) is None
    # two Batch AI jobs: the one that lost its node (failed, exit code 137), and the resubmission
    jobs = {r.path.rsplit("/", 1)[-1] for r in batchai.server.requests("PUT", ARM + r"/experiments/ddlkit/jobs/.*")}
    assert jobs == {first, record["id"]}
    status = run_factory.cli("jobs", "status", str(job_dir)).assert_success()
    assert f"; it ended at step {entry['step_reached']} as {first} (" in status.stdout, status.output


# ---------------------------------------------------------------------------- connections that drop (issue 37)
def test_an_endpoint_that_drops_or_refuses_is_one_line_and_jobs_list_lists_the_others(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path
) -> None:
    """Batch AI closing the connection without an answer, or refusing it, is retried by the SDK's
    retry policy (as a 503 is), then one line naming the endpoint, exit status 2; a recorded job
    whose endpoint does not answer is listed by `ddlkit jobs list` with its state unknown (`?`),
    among the others (issue 37, item 18)."""
    server = batchai.server
    endpoint = f"no answer from Batch AI at {server.host}:{server.port}"
    jobs = ARM + r"/experiments/[^/]+/jobs/[^/]+"
    args = cli_args(batchai, ssh_key, fake_image(batchai))
    server.drop("PUT", jobs, times=4)  # the first try and the SDK's 3 retries
    refused = run_factory(*args, job_dir=tmp_path / "dropped")
    refused.assert_one_line_error("creating job ", endpoint, "the connection was closed with no response")
    assert [r.dropped for r in server.requests("PUT", jobs)] == [True] * 4

    local = run_factory("trainer.epochs=1", job_dir=tmp_path / "local")
    local.assert_success()
    job_dir = tmp_path / "job"
    share = rf"/{FILES_ACCOUNT}/.*"
    server.drop("PUT", share, times=2)  # the job directory's upload to Azure Files: retried
    before = len(server.requests("PUT", share))
    run_factory("--detach", *args, "framework.step_delay_s=0.3", job_dir=job_dir).assert_success()
    assert [r.dropped for r in server.requests("PUT", share)][before : before + 3] == [True, True, False]
    server.drop("GET", jobs, times=None)
    status = run_factory.cli("jobs", "status", str(job_dir))
    status.assert_one_line_error("looking up job ", endpoint, f"`ddlkit jobs attach {job_dir}` follows it again")
    listed = run_factory.cli("jobs", "list").assert_success()
    rows = {line.split()[-1]: line.split()[2] for line in listed.stdout.splitlines()[1:]}
    assert rows[str(job_dir)].endswith("?") and rows[str(tmp_path / "local")] == "succeeded", listed.output

    server.stop()  # nothing listens: connections are refused
    status = run_factory.cli("jobs", "status", str(job_dir))
    status.assert_one_line_error("looking up job ", endpoint, "Connection refused")
    listed = run_factory.cli("jobs", "list").assert_success()
    assert str(tmp_path / "local") in listed.stdout and str(job_dir) in listed.stdout, listed.output
    # and why that one's state is not known now, beside the table
    assert " when last recorded; not known now: looking up job " in listed.stderr, listed.output
    assert "Connection refused" in listed.stderr and listed.stderr.count("\n") == 1, listed.output


def test_a_stdout_read_that_gives_up_leaves_the_job_running_and_says_how_to_attach(
    batchai: BatchAILoopback, ssh_key: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A dropped read of stdout.txt is retried (no line lost or repeated); reads that give up end the
    following, not the job: it is waited for and judged as any other, and stderr says that it runs on
    and how to follow it again (issue 37, item 20). The log is found with listOutputFiles, a POST that
    only reads: a dropped one is retried as a GET is (azure-core retries no POST that may have been
    received, unless told)."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text("{}\n")
    handle = BatchAITarget(config(batchai, ssh_key)).submit(
        ddlkit.JobSpec(name="dropped", job_dir=job_dir, args=("-c", COUNTING_JOB))
    )
    listing = ARM + r"/experiments/[^/]+/jobs/[^/]+/listOutputFiles"
    batchai.server.drop("POST", listing, times=1)
    follow_while_dropping(handle.logs(follow=True), batchai.server, r"/[a-z0-9]+/[^/]+/.*/stdout\.txt")
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    assert [r.dropped for r in batchai.server.requests("POST", listing)][:2] == [True, False]
    said = capfd.readouterr().err
    assert f"ddlkit: reading the log (stdout.txt) of job {handle.id}: no answer from Batch AI's file storage" in said
    assert (
        f"Batch AI job {handle.id} runs on: waiting for it to end without its log; "
        f"`ddlkit jobs attach {job_dir}` follows the log again."
    ) in said, said


def test_an_azure_files_share_that_drops_every_upload_is_one_line(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path
) -> None:
    """Uploads to the share are retried by ddlkit's retry loop (as Blob Storage's are, each retry said),
    then one line naming the share's endpoint, exit status 2; no job is created (issue 37, item 18)."""
    share = rf"/{FILES_ACCOUNT}/.*"
    batchai.server.drop("PUT", share, times=None)
    out = run_factory(*cli_args(batchai, ssh_key, fake_image(batchai)), job_dir=tmp_path / "job")
    out.assert_one_line_error(
        f"to {batchai.share_url}/ddlkit/jobs/",
        "failed after 5 attempts: no answer from Azure Files at "
        f"{batchai.server.host}:{batchai.server.port} (the connection was closed with no response)",
    )
    assert out.stderr.count("retrying in") == 4, out.output
    assert not batchai.server.requests("PUT", ARM + r"/experiments/[^/]+/jobs/[^/]+")


def test_a_share_that_refuses_the_key_is_one_line(
    batchai: BatchAILoopback, ssh_key: Path, run_factory: RunFactory, tmp_path: Path
) -> None:
    """Azure Files refusing the account key (403, and without a body, as a refused HEAD is) is one line
    naming the share and what to check; before, the SDK's own 12-line traceback of parsing the empty
    body came first (issue 37, item 21)."""
    from ddlkit_azure.testing.loopback import Response

    batchai.server.route("*", rf"/{FILES_ACCOUNT}/.*", lambda request, match: Response(403, b"", {}))
    out = run_factory(*cli_args(batchai, ssh_key, fake_image(batchai)), job_dir=tmp_path / "job")
    out.assert_one_line_error(
        f"uploading the job directory to {batchai.share_url}/", "check the share and its account key"
    )
    assert "Traceback" not in out.output and "deserialization" not in out.output, out.output
