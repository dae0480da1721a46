"""compute=azureml: the job definition (what ``ddlkit plan`` prints, offline), the config checks,
and the workspace's refusals, through the real azure-ai-ml SDK against the loopback workspace."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from omegaconf import OmegaConf

import ddlkit
from ddlkit.compute import containers
from ddlkit.compute.containers import image_context
from ddlkit.compute.scheduler import SchedulerJob
from ddlkit.compute.snapshot import CodeSnapshot
from ddlkit.interfaces import JOB_FILE, JobSpec, JobState
from ddlkit.testing.core import Registry, get_plugin_manager
from ddlkit.testing.registry import LoopbackRegistry
from ddlkit_azure import rank as rank_entry
from ddlkit_azure._azureml import place_snapshot, sdk_uploading
from ddlkit_azure.azureml import AzureMLConfig, AzureMLTarget
from ddlkit_azure.testing import ACCOUNT
from ddlkit_azure.testing.azureml import ARM_PREFIX, BLOB_URL, LoopbackWorkspace
from ddlkit_azure.testing.loopback import (
    COUNTING_JOB,
    EXPIRED_SIGN_IN,
    TOKEN_CLAIMS,
    LoopbackServer,
    Request,
    Response,
    error_body,
    follow_while_dropping,
    install_az,
    sdk_environment,
)

if TYPE_CHECKING:
    from conftest import UserProject

SECRET = "sv=2026-01-01&sig=AZUREMLtestSECRET%3D"
WORKSPACE = {"subscription_id": "sub-x", "resource_group": "rg-x", "workspace": "ws-x", "cluster": "gpu-cluster"}
DERIVED = {"framework": "pytorch", "dist": "none", "data_root": None, "storage": "local"}


def target(**changes: object) -> AzureMLTarget:
    return AzureMLTarget(OmegaConf.merge(OmegaConf.structured(AzureMLConfig(**{**WORKSPACE, **DERIVED})), changes))


def on(loopback: LoopbackWorkspace, **changes: object) -> AzureMLTarget:
    """A target on the loopback workspace (``changes`` win)."""
    return target(
        **{
            "subscription_id": loopback.subscription,
            "resource_group": loopback.resource_group,
            "workspace": loopback.workspace,
            "poll_interval_s": 0.2,
            **changes,
        }
    )


def spec(tmp_path: Path, secret_env: dict[str, str] | None = None) -> JobSpec:
    return JobSpec(
        name="2026-11-23_10-00-00-0123abcd",
        job_dir=tmp_path / "job",
        env={"DDLKIT_PLUGINS": "p"},
        secret_env=secret_env or {},
    )


def submitted(loopback: LoopbackWorkspace, job_dir: Path, code: str, **changes: object) -> SchedulerJob:
    """A job of ``python -c code`` on the loopback workspace (as the compute contract submits one)."""
    job_dir.mkdir(parents=True)
    (job_dir / JOB_FILE).write_text("{}\n", encoding="utf-8")
    return on(loopback, **changes).submit(
        JobSpec(name=job_dir.name, job_dir=job_dir, args=("-c", textwrap.dedent(code)))
    )


def planned(t: AzureMLTarget, tmp_path: Path, secret_env: dict[str, str] | None = None) -> tuple[str, dict]:
    text = t.plan(spec(tmp_path, secret_env))
    request, body = text.split("\n{", 1)
    return request, json.loads("{" + body)["properties"]


# ---------------------------------------------------------------------------- registration
def test_azureml_is_registered_through_the_plugins_entry_point() -> None:
    registration = Registry.collect(get_plugin_manager()).get("compute", "azureml")
    assert registration.factory is AzureMLTarget and registration.config is AzureMLConfig


# ---------------------------------------------------------------------------- the job definition
@pytest.mark.parametrize(
    ("framework", "dist", "nodes", "per_node", "kind"),
    [
        ("pytorch", "none", 1, 1, None),
        ("pytorch", "native", 2, 4, "PyTorch"),
        ("pytorch", "fsdp", 2, 4, "PyTorch"),
        ("pytorch", "horovod", 2, 4, "Mpi"),
        ("tensorflow", "native", 4, 1, "Mpi"),
        ("keras", "native", 1, 2, "Mpi"),
    ],
)
def test_the_distribution_fits_the_framework_and_backend(
    tmp_path: Path, framework: str, dist: str, nodes: int, per_node: int, kind: str | None
) -> None:
    # ddlkit's image with Horovod is a CPU one (a GPU job with Horovod names its image)
    _, job = planned(
        target(framework=framework, dist=dist, nodes=nodes, procs_per_node=per_node, gpu=dist != "horovod"), tmp_path
    )
    assert job["resources"]["instanceCount"] == nodes
    assert (job.get("distribution") or {}).get("distributionType") == kind
    if kind:
        assert job["distribution"]["processCountPerInstance"] == per_node
    command = job["command"]
    # every process runs the worker under ddlkit's rank minder (its log and exit record in the job's output)
    assert command.endswith("exec python -m ddlkit_azure.rank -- python -m ddlkit.rank.worker job.json")
    # every case gives the ranks their place: MPI's from OpenMPI plus rank 0's host from Azure ML,
    # PyTorch's from Azure ML plus the node layout
    assert ('MASTER_ADDR="${AZ_BATCH_MASTER_NODE%%:*}"' in command) is (kind == "Mpi")
    assert (f"DDLKIT_LOCAL_SIZE={per_node}" in command) is (kind == "PyTorch")


def test_the_plan_is_the_request_the_sdk_sends_with_secrets_redacted(tmp_path: Path) -> None:
    request, job = planned(target(experiment="exp", spot=True), tmp_path, {"AZURE_STORAGE_SAS_TOKEN": SECRET})
    assert request.startswith(
        "PUT https://management.azure.com/subscriptions/sub-x/resourceGroups/rg-x/providers/"
        "Microsoft.MachineLearningServices/workspaces/ws-x/jobs/ddlkit-2026-11-23_10-00-00-"
    )
    assert SECRET not in request + json.dumps(job)
    # the secret goes to the workspace's key vault (named at submission), the job names it: no value
    variables = job["environmentVariables"]
    assert variables.keys() == {"DDLKIT_AZURE_KEY_VAULT", "DDLKIT_AZURE_SECRETS", "DDLKIT_PLUGINS", "PYTHONUNBUFFERED"}
    assert variables["DDLKIT_AZURE_KEY_VAULT"] == "<the workspace's key vault>"
    assert json.loads(variables["DDLKIT_AZURE_SECRETS"]) == {
        "AZURE_STORAGE_SAS_TOKEN": "ddlkit-2026-11-23-10-00-00-0123abcd-<random>-0-AZURE-STORAGE-SAS-TOKEN"
    }
    assert job["identity"] == {"identityType": "Managed"}
    assert (
        "\n# secrets: AZURE_STORAGE_SAS_TOKEN=*** go to key vault <the workspace's key vault> (one secret each, named "
        "in DDLKIT_AZURE_SECRETS, tagged ddlkit_job, expiring in 7 days, deleted once the job is collected); the job "
        "reads them as the cluster's managed identity, which needs the 'Key Vault Secrets User' role on the vault"
    ) in request
    # another vault named in the config; without secrets, no vault and no identity
    _, other = planned(
        target(key_vault="https://kv-other.vault.azure.net"), tmp_path / "2", {"AZURE_STORAGE_SAS_TOKEN": SECRET}
    )
    assert other["environmentVariables"]["DDLKIT_AZURE_KEY_VAULT"] == "https://kv-other.vault.azure.net"
    none_request, none = planned(target(), tmp_path / "3")
    assert "DDLKIT_AZURE_KEY_VAULT" not in none["environmentVariables"] and not none.get("identity")
    assert "# secrets" not in none_request
    with pytest.raises(ddlkit.ConfigError, match="compute.key_vault=kv-other must be a vault's URL"):
        target(key_vault="kv-other")
    assert job["jobType"] == "Command" and job["experimentName"] == "exp"
    assert job["computeId"].endswith("/workspaces/ws-x/computes/gpu-cluster")
    assert job["outputs"] == {
        "job_dir": {
            "jobOutputType": "uri_folder",
            "mode": "ReadWriteMount",
            "uri": "azureml://datastores/workspaceblobstore/paths/ddlkit/2026-11-23_10-00-00-0123abcd/",
        }
    }
    assert job["queueSettings"] == {"jobTier": "Spot"}
    assert job["tags"] == {"ddlkit_job": "2026-11-23_10-00-00-0123abcd"}
    assert not (tmp_path / "job").exists()


def test_planning_needs_no_credential_nor_network(tmp_path: Path) -> None:
    """In a process with no way to sign in and no route out, the plan is printed and no
    credential library is even imported."""
    script = f"""
import sys
from pathlib import Path
from omegaconf import OmegaConf
from ddlkit.interfaces import JobSpec
from ddlkit_azure.azureml import AzureMLConfig, AzureMLTarget
cfg = OmegaConf.structured(AzureMLConfig(**{ {**WORKSPACE, **DERIVED}!r}))
text = AzureMLTarget(cfg).plan(JobSpec(name="n", job_dir=Path({str(tmp_path / "job")!r})))
assert text.startswith("PUT "), text
print("imported:", sorted(m for m in sys.modules if m.startswith("azure.identity")))
"""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
        "AZUREML_DEV_URL_MFE": "https://127.0.0.1:9",
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "imported: []" in proc.stdout


@pytest.mark.parametrize(
    ("storage", "mode", "wire"),
    [
        ("local", "auto", "ReadOnlyMount"),
        ("local_ssd", "auto", "Download"),
        ("local", "download", "Download"),
        ("local_ssd", "ro_mount", "ReadOnlyMount"),
    ],
)
def test_an_azureml_data_root_is_an_input_of_the_job(tmp_path: Path, storage: str, mode: str, wire: str) -> None:
    root = "azureml://datastores/imagenet/paths/ilsvrc/"
    _, job = planned(target(data_root=root, storage=storage, input_mode=mode), tmp_path)
    assert job["inputs"] == {"data": {"jobInputType": "uri_folder", "mode": wire, "uri": root}}
    assert 'export DDLKIT_DATA_ROOT="${{inputs.data}}"' in job["command"]


DIGEST = "0123456789abcdef" * 4


def test_a_code_snapshot_is_an_input_at_its_digest_put_into_the_job_directory(tmp_path: Path) -> None:
    t = target(code_root="azureml://datastores/code_store/paths/team/snapshots/")
    text = t.plan(dataclasses.replace(spec(tmp_path), code_digest=DIGEST))
    request, body = text.split("\n{", 1)
    job = json.loads("{" + body)["properties"]
    uri = f"azureml://datastores/code_store/paths/team/snapshots/{DIGEST}/"
    assert job["inputs"] == {"code": {"jobInputType": "uri_folder", "mode": "Download", "uri": uri}}
    assert f"# code snapshot: {uri}, the input code (uploaded there unless its code.json is there already" in request
    assert job["command"].index('code="${{inputs.code}}"') < job["command"].index('cd "$out"')
    # a job that ships no snapshot has no such input
    _, plain = planned(target(), tmp_path)
    assert "inputs" not in plain or "code" not in plain["inputs"]
    assert "inputs.code" not in plain["command"]


def test_every_process_puts_the_snapshot_into_the_job_directory_in_one_piece(tmp_path: Path) -> None:
    """The command's lines, run by four processes at once (POSIX sh) into a job directory that an
    earlier run left another snapshot in: the new snapshot, exactly, and nothing half-written."""
    source, out = tmp_path / "input", tmp_path / "out"
    files = {
        "code/my_pkg/__init__.py": "",
        "code/my_pkg/nets.py": "x = 2\n" * 5000,
        "code/my pkg data/a b.txt": "spaces\n",
        "code.json": '{"digest": "new"}',
    }
    earlier = {
        "code/my_pkg/nets.py": "x = 1\n",
        "code/my_pkg/stale.py": "",
        "code.json": '{"digest": "old"}',
        "result.json": "{}",
    }
    for root, tree in ((source, files), (out, earlier)):
        for rel, text in tree.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    script = "\n".join(["set -e", f"out={shlex.quote(str(out))}", *place_snapshot()]).replace(
        "${{inputs.code}}", str(source)
    )
    runs = [subprocess.Popen(["sh", "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    assert [(run.wait(timeout=60), run.stderr.read()) for run in runs] == [(0, "")] * 4
    placed = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert placed == {**files, "result.json": "{}"}
    # once in place, nothing is copied again
    (out / "code" / "my_pkg" / "nets.py").write_text("x = 3\n")
    subprocess.run(["sh", "-c", script], check=True)
    assert (out / "code" / "my_pkg" / "nets.py").read_text() == "x = 3\n"


@pytest.mark.parametrize(
    ("env", "place"),
    [
        ({}, (0, 1, "0", "0", "1")),
        # MpiDistribution: OpenMPI's, the node from the rank and the ranks on each node
        (
            {
                "OMPI_COMM_WORLD_RANK": "5",
                "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            (5, 8, "1", "1", "4"),
        ),
        # PyTorchDistribution: Azure ML's RANK and LOCAL_RANK, the node and its size from the command
        (
            {
                "RANK": "3",
                "WORLD_SIZE": "4",
                "LOCAL_RANK": "1",
                "NODE_RANK": "1",
                "DDLKIT_NODE": "1",
                "DDLKIT_LOCAL_SIZE": "2",
            },
            (3, 4, "1", "1", "2"),
        ),
    ],
)
def test_each_process_finds_its_place_under_the_rank_minder(env: dict[str, str], place: tuple) -> None:
    rank, world, variables = rank_entry.layout(env)
    node, local_rank, local_size = (variables[k] for k in ("DDLKIT_NODE", "DDLKIT_LOCAL_RANK", "DDLKIT_LOCAL_SIZE"))
    assert (rank, world, node, local_rank, local_size) == place


def test_a_rank_forgets_the_records_an_earlier_run_left_in_the_output(tmp_path: Path) -> None:
    """The output outlives a job (queued again after a preemption, the job directory run again): a
    rank removes its own earlier record, rank 0 those of ranks this job does not have."""
    ranks = tmp_path / ".ranks"
    ranks.mkdir()
    for n in range(4):
        (ranks / f"rank-{n}.json").write_text("{}")
    rank_entry.forget_earlier_records(1, 2, tmp_path)
    assert sorted(p.name for p in ranks.iterdir()) == ["rank-0.json", "rank-2.json", "rank-3.json"]
    rank_entry.forget_earlier_records(0, 2, tmp_path)
    assert sorted(p.name for p in ranks.iterdir()) == []


@pytest.mark.parametrize(
    "root",
    [
        "azureml://datastores/workspaceblobstore",
        "https://acct.blob.core.windows.net/c",
        "azureml://subscriptions/s/resourcegroups/r/workspaces/w/datastores/d/paths/p",
    ],
)
def test_code_root_must_be_a_datastore_path(root: str) -> None:
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"compute.code_root=.* must be a datastore URI of the form "
        r"azureml://datastores/<datastore>/paths/<path>",
    ):
        target(code_root=root)


@pytest.mark.parametrize(
    ("framework", "gpu", "environment"),
    [
        ("pytorch", True, "ddlkit-pytorch-cuda"),
        ("tensorflow", True, "ddlkit-tensorflow-cuda"),
        ("keras", False, "ddlkit-keras-cpu"),
    ],
)
def test_the_environment_is_built_by_the_workspace_from_ddlkits_dockerfile(
    tmp_path: Path, framework: str, gpu: bool, environment: str
) -> None:
    context = image_context(framework, gpu=gpu)
    request, job = planned(target(framework=framework, gpu=gpu), tmp_path)
    version = context.digest[:16]
    assert job["environmentId"].endswith(f"/workspaces/ws-x/environments/{environment}/versions/{version}")
    variant = "cuda" if gpu else "cpu"
    assert (
        f"# environment: {environment}:{version}, built by the workspace from docker/Dockerfile (FRAMEWORK="
        f"{framework} VARIANT={variant}) with {len(context.files)} files"
    ) in request


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow", "keras"])
def test_dist_horovod_runs_in_ddlkits_image_with_horovod_built_in(tmp_path: Path, framework: str) -> None:
    """The ranks import Horovod from the job's image, so the environment is the one built with
    HOROVOD=1 (a name of its own), and Azure ML's MPI starts nodes x procs_per_node ranks."""
    context = image_context(framework, gpu=False, horovod=True)
    assert context.build_args == {"FRAMEWORK": framework, "VARIANT": "cpu", "HOROVOD": "1"}
    assert "\nARG HOROVOD=1\n" in context.dockerfile
    request, job = planned(target(framework=framework, dist="horovod", gpu=False, nodes=2, procs_per_node=3), tmp_path)
    assert job["environmentId"].endswith(f"/environments/ddlkit-{framework}-cpu-horovod/versions/{context.digest[:16]}")
    assert context.digest != image_context(framework, gpu=False).digest
    assert job["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 3}
    assert job["resources"]["instanceCount"] == 2
    assert "(FRAMEWORK=" + framework + " VARIANT=cpu HOROVOD=1)" in request
    assert "the launcher needs no Horovod" in request and "starts the 6 Horovod ranks" in request


def test_a_gpu_job_with_horovod_names_its_image(tmp_path: Path) -> None:
    """ddlkit's recipe builds Horovod for the CPU only: a GPU job with Horovod is refused before
    anything is sent unless it names an image, which is then the job's environment."""
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"dist=horovod and compute\.gpu=true needs a CUDA image with "
        r"Horovod built with NCCL.*set compute\.image",
    ):
        target(dist="horovod", gpu=True, nodes=2)
    request, job = planned(target(dist="horovod", gpu=True, nodes=2, image="myacr.azurecr.io/hvd:1"), tmp_path)
    assert "/environments/CliV2AnonymousEnvironment/versions/" in job["environmentId"]
    assert "the ranks import Horovod from this image, the launcher needs none" in request


def test_a_given_image_is_the_jobs_environment(tmp_path: Path) -> None:
    request, job = planned(target(image="myacr.azurecr.io/train:1"), tmp_path)
    assert "/environments/CliV2AnonymousEnvironment/versions/" in job["environmentId"]
    assert "# environment: myacr.azurecr.io/train:1 (an anonymous environment version" in request


# ---------------------------------------------------------------------------- config errors (before any network)
@pytest.mark.parametrize("key", ["subscription_id", "resource_group", "workspace", "cluster"])
def test_a_missing_workspace_key_is_named(key: str) -> None:
    cfg = OmegaConf.structured(AzureMLConfig(**DERIVED))
    for other in set(WORKSPACE) - {key}:
        cfg[other] = WORKSPACE[other]
    with pytest.raises(ddlkit.ConfigError, match=rf"compute=azureml needs compute\.{key} \(.*compute\.{key}=<{key}>"):
        AzureMLTarget(cfg)


@pytest.mark.parametrize("root", ["/data/imagenet", "data/imagenet", "~/imagenet"])
def test_a_local_data_root_is_refused(root: str) -> None:
    with pytest.raises(ddlkit.ConfigError, match=rf"data.root={root} is a path on this machine.*azureml://datastores/"):
        target(data_root=root)


def test_a_blob_url_data_root_is_read_by_the_ranks_themselves(tmp_path: Path) -> None:
    _, job = planned(target(data_root="blob://datasets/imagenet"), tmp_path)
    assert "inputs" not in job or not job["inputs"]


@pytest.mark.parametrize(("key", "value"), [("nodes", 0), ("procs_per_node", -1), ("poll_interval_s", 0.0)])
def test_bad_numbers_are_refused(key: str, value: object) -> None:
    with pytest.raises(ddlkit.ConfigError, match=rf"compute\.{key}={value} is invalid"):
        target(**{key: value})


# ---------------------------------------------------------------------------- the workspace's answers
def test_an_unknown_cluster_lists_the_workspaces_clusters(azureml_workspace: LoopbackWorkspace, tmp_path: Path) -> None:
    with pytest.raises(
        ddlkit.ConfigError,
        match="compute.cluster=gpu-clutser is not a compute of workspace "
        r"ws-ddlkit; it has: cpu-cluster, gpu-cluster\.$",
    ):
        azureml_workspace.clusters["cpu-cluster"] = type(azureml_workspace.clusters["gpu-cluster"])("cpu-cluster")
        on(azureml_workspace, cluster="gpu-clutser").submit(spec(tmp_path))
    assert not azureml_workspace.jobs


def test_more_nodes_than_the_cluster_has_are_refused(azureml_workspace: LoopbackWorkspace, tmp_path: Path) -> None:
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"compute.nodes=5 is more than cluster gpu-cluster can have \(4 "
        r"nodes at most\).*--max-instances 5",
    ):
        on(azureml_workspace, nodes=5, dist="native").submit(spec(tmp_path))
    assert not azureml_workspace.jobs


def test_a_403_names_the_missing_role(
    azureml_workspace: LoopbackWorkspace, https_loopback: LoopbackServer, tmp_path: Path
) -> None:
    https_loopback.route(
        "GET",
        r"/subscriptions/.*",
        lambda r, m: Response(
            403,
            error_body(
                "AuthorizationFailed",
                "The client 'tester@example.invalid' does not have authorization to perform action "
                "'Microsoft.MachineLearningServices/workspaces/read'",
            ),
        ),
    )
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"access denied to workspace ws-ddlkit \(403: .*AuthorizationFailed"
        r".*'AzureML Data Scientist' role",
    ):
        on(azureml_workspace).submit(spec(tmp_path))


def test_a_missing_workspace_names_the_keys(azureml_workspace: LoopbackWorkspace, tmp_path: Path) -> None:
    with pytest.raises(ddlkit.ConfigError, match="workspace nowhere was not found in resource group rg-ddlkit"):
        on(azureml_workspace, workspace="nowhere").submit(spec(tmp_path))


def test_a_job_of_a_workspace_that_is_gone_names_the_keys(azureml_workspace: LoopbackWorkspace, tmp_path: Path) -> None:
    """ARM's 404 naming the workspace as the missing resource, for a request that is not the workspace's own read."""
    handle = on(azureml_workspace, workspace="gone").attach("ddlkit-job-0123ab", job_dir=tmp_path / "job")
    with pytest.raises(
        ddlkit.ConfigError,
        match="^reading job ddlkit-job-0123ab: workspace gone was not found in resource group rg-ddlkit",
    ):
        handle.status()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (
            {"resource_group": "rg-nowhere"},
            "reading workspace ws-ddlkit: resource group rg-nowhere was not found in "
            "subscription sub-0001 (ResourceGroupNotFound: Resource group 'rg-nowhere' "
            "could not be found.): check compute.resource_group and "
            "compute.subscription_id, or create it (az group create --name rg-nowhere "
            "--location <region>).",
        ),
        (
            {"subscription_id": "sub-nowhere"},
            "reading workspace ws-ddlkit: subscription sub-nowhere was not found "
            "(SubscriptionNotFound: The subscription 'sub-nowhere' could not be found.): "
            "check compute.subscription_id",
        ),
    ],
)
def test_a_missing_resource_group_or_subscription_is_named(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path, where: dict, message: str
) -> None:
    with pytest.raises(ddlkit.ConfigError, match=re.escape(message)):
        on(azureml_workspace, **where).submit(spec(tmp_path))
    assert not azureml_workspace.jobs


def test_a_code_root_on_a_datastore_the_workspace_lacks_is_named(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path
) -> None:
    job = spec(tmp_path)
    (job.job_dir / "code").mkdir(parents=True)
    (job.job_dir / "code.json").write_text("{}")
    with pytest.raises(ddlkit.ConfigError) as info:
        on(azureml_workspace, code_root="azureml://datastores/nowhere/paths/code").submit(
            dataclasses.replace(job, code_digest=DIGEST)
        )
    assert str(info.value).startswith("reading datastore nowhere (compute.code_root): Azure ML answered 404:")
    assert not azureml_workspace.jobs


@pytest.mark.parametrize(
    ("method", "path", "answer"),
    [
        # ARM names a missing resource by type and name: here a resource *in* the workspace
        (
            "GET",
            r".*/datastores/workspaceblobstore",
            lambda ws, r: error_body(
                "ResourceNotFound",
                (
                    "The Resource "
                    f"'Microsoft.MachineLearningServices/workspaces/{ws.workspace}/datastores/workspaceblobstore' "
                    f"under resource group '{ws.resource_group}' was not found."
                ),
            ),
        ),
        # run history's answer for a run it does not know (its text, of a job named after a workspace)
        (
            "POST",
            r"/history/v1\.0/.*/rundata",
            lambda ws, r: error_body("UserError", f"Run {r.body['runId']} was not found"),
        ),
    ],
)
def test_a_404_of_something_in_the_workspace_is_not_a_missing_workspace(
    azureml_workspace: LoopbackWorkspace, https_loopback: LoopbackServer, tmp_path: Path, method: str, path: str, answer
) -> None:
    handle = submitted(azureml_workspace, tmp_path / "workspace-smoke-test", "print('done')")
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED  # its output downloaded before it was judged
    https_loopback.route(method, path, lambda r, m: Response(404, answer(azureml_workspace, r)))
    with pytest.raises(ddlkit.ConfigError) as refused:
        on(azureml_workspace).attach(handle.id, job_dir=tmp_path / "again").collect()
    assert str(refused.value).startswith(f"downloading job {handle.id}'s output: Azure ML answered 404: ")
    assert "was not found in resource group" not in str(refused.value)


# ---------------------------------------------------------------------------- the environment
def environment_puts(server: LoopbackServer) -> list[Request]:
    return server.requests("PUT", r".*/environments/[^/]+/versions/[^/]+")


def uploaded_context(workspace: LoopbackWorkspace, put: Request, into: Path) -> dict[str, bytes]:
    """The build context the environment's ``contextUri`` names, from the workspace's storage."""
    container, _, prefix = put.body["properties"]["build"]["contextUri"].removeprefix(f"{BLOB_URL}/").partition("/")
    workspace.download_prefix(container, prefix, into)
    return {p.relative_to(into).as_posix(): p.read_bytes() for p in into.rglob("*") if p.is_file()}


def test_the_first_job_creates_the_environment_from_its_build_context_and_later_jobs_reuse_it(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path
) -> None:
    server, context = azureml_workspace.server, image_context("pytorch", gpu=True)
    environment, version = "ddlkit-pytorch-cuda", context.digest[:16]
    first = submitted(azureml_workspace, tmp_path / "first", "print('one')")
    # asked for first (404), then created with a build context: no image, the SDK's upload as contextUri
    assert len(server.requests("GET", rf".*/environments/{environment}/versions/{version}")) == 1
    (put,) = environment_puts(server)
    assert put.path.endswith(f"/environments/{environment}/versions/{version}")
    assert set(put.body["properties"]) >= {"build"} and "image" not in put.body["properties"]
    assert put.body["properties"]["build"]["dockerfilePath"] == "docker/Dockerfile"
    assert put.body["properties"]["build"]["contextUri"].startswith(
        f"{BLOB_URL}/{azureml_workspace.datastores['workspaceblobstore']}/LocalUpload/"
    )
    # the context is what `docker build` gets from the checkout, the build arguments written in
    files = uploaded_context(azureml_workspace, put, tmp_path / "context")
    assert sorted(files) == sorted([*context.files, ".dockerignore", "docker/Dockerfile"])
    assert files["ddlkit/_version.py"] == (context.root / "ddlkit/_version.py").read_bytes()
    dockerfile = files["docker/Dockerfile"].decode()
    assert "\nARG FRAMEWORK=pytorch\n" in dockerfile and "\nARG VARIANT=cuda\n" in dockerfile
    assert first.wait(timeout=90).state is JobState.SUCCEEDED
    assert (
        azureml_workspace.jobs[first.id]
        .spec["environmentId"]
        .endswith(f"/environments/{environment}/versions/{version}")
    )
    (build,) = azureml_workspace.image_builds.values()
    assert azureml_workspace.jobs[first.id].image == build.image

    # a second job finds it: nothing created, nothing uploaded, the image built once
    blobs = {
        b.name: b.etag
        for b in azureml_workspace._service()
        .get_container_client(azureml_workspace.datastores["workspaceblobstore"])
        .list_blobs(name_starts_with="LocalUpload/")
    }
    second = submitted(azureml_workspace, tmp_path / "second", "print('two')")
    assert len(server.requests("GET", rf".*/environments/{environment}/versions/{version}")) == 2
    assert environment_puts(server) == [put]
    assert {
        b.name: b.etag
        for b in azureml_workspace._service()
        .get_container_client(azureml_workspace.datastores["workspaceblobstore"])
        .list_blobs(name_starts_with="LocalUpload/")
    } == blobs
    assert second.wait(timeout=90).state is JobState.SUCCEEDED
    assert azureml_workspace.jobs[second.id].image == build.image and len(azureml_workspace.image_builds) == 1


def test_a_horovod_job_creates_the_environment_with_horovod_built_in(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path
) -> None:
    """What the workspace receives for dist=horovod: the environment ddlkit-<framework>-cpu-horovod,
    whose uploaded context's Dockerfile says HOROVOD=1, and a job of Mpi distribution with
    procs_per_node processes per node; the job runs (one process per rank)."""
    server, context = azureml_workspace.server, image_context("tensorflow", gpu=False, horovod=True)
    handle = submitted(
        azureml_workspace,
        tmp_path / "job",
        "print('a rank')",
        framework="tensorflow",
        dist="horovod",
        gpu=False,
        procs_per_node=2,
    )
    (put,) = environment_puts(server)
    assert put.path.endswith(f"/environments/ddlkit-tensorflow-cpu-horovod/versions/{context.digest[:16]}")
    dockerfile = uploaded_context(azureml_workspace, put, tmp_path / "context")["docker/Dockerfile"].decode()
    assert "\nARG HOROVOD=1\n" in dockerfile and "\nARG VARIANT=cpu\n" in dockerfile
    (job_put,) = server.requests("PUT", r".*/jobs/[^/]+")
    assert job_put.body["properties"]["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 2}
    assert job_put.body["properties"]["environmentId"].endswith(
        f"/environments/ddlkit-tensorflow-cpu-horovod/versions/{context.digest[:16]}"
    )
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED


def test_a_changed_file_of_the_context_is_a_new_environment_version(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a checkout of its own to change: the context itself is one
    checkout = image_context("pytorch", gpu=False).write(tmp_path / "checkout")
    monkeypatch.setattr(containers, "CHECKOUT", checkout)
    submitted(azureml_workspace, tmp_path / "first", "print('one')", gpu=False)
    (first,) = environment_puts(azureml_workspace.server)
    assert first.path.endswith(f"/versions/{image_context('pytorch', gpu=False).digest[:16]}")
    # what .dockerignore leaves out is no part of it: a plugin's tests, the documentation
    (checkout / "plugins" / "ddlkit-pytorch" / "tests").mkdir()
    (checkout / "plugins" / "ddlkit-pytorch" / "tests" / "test_more.py").write_text("assert True\n")
    (checkout / "README.md").write_text("# ddlkit\n\nan edited README\n")
    submitted(azureml_workspace, tmp_path / "second", "print('two')", gpu=False)
    assert environment_puts(azureml_workspace.server) == [first]
    # what it lets in is
    (checkout / "ddlkit" / "_version.py").write_text('__version__ = "0.1.0"  # changed\n')
    submitted(azureml_workspace, tmp_path / "third", "print('three')", gpu=False)
    old, new = environment_puts(azureml_workspace.server)
    assert old == first and new.path.rsplit("/", 1)[1] != first.path.rsplit("/", 1)[1]
    version = image_context("pytorch", gpu=False).digest[:16]
    assert new.path.endswith(f"/environments/ddlkit-pytorch-cpu/versions/{version}")
    assert b"# changed" in uploaded_context(azureml_workspace, new, tmp_path / "context")["ddlkit/_version.py"]


def test_an_environment_another_launcher_created_meanwhile_is_used(
    azureml_workspace: LoopbackWorkspace, https_loopback: LoopbackServer, tmp_path: Path
) -> None:
    """Jobs submitted at once (a sweep) all find no version; the workspace creates it for the first and
    answers the others 409, as it does for a version that exists: they use it."""
    version = image_context("pytorch", gpu=True).digest[:16]

    def created_meanwhile(r: Request, m: re.Match[str]) -> Response:
        azureml_workspace.environments[(m["name"], m["version"])] = dict(r.body["properties"])
        return Response(409, error_body("UserError", f"Environment {m['name']}:{m['version']} already exists."))

    https_loopback.route(
        "PUT",
        ARM_PREFIX + r"/environments/(?P<name>[^/]+)/versions/(?P<version>[^/]+)",
        azureml_workspace._in_scope(created_meanwhile),
    )
    handle = submitted(azureml_workspace, tmp_path / "job", "print('done')")
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    assert list(azureml_workspace.image_builds) == [("ddlkit-pytorch-cuda", version)]


def test_a_given_image_is_asked_of_its_registry_before_the_job_is_submitted(
    azureml_workspace: LoopbackWorkspace,
    oci_registry: LoopbackRegistry,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    public = oci_registry.push("team/train", "1")
    oci_registry.public.add("team/train")
    handle = submitted(azureml_workspace, tmp_path / "public", "print('done')", image=public)
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    assert azureml_workspace.jobs[handle.id].image == public
    assert [(r.method, r.path) for r in oci_registry.requests if r.auth_scheme == "Bearer"] == [
        ("HEAD", "/v2/team/train/manifests/1")
    ]
    assert "ddlkit: note" not in capfd.readouterr().err

    # a tag the registry does not have: refused before anything is sent to the workspace
    with pytest.raises(
        ddlkit.ConfigError,
        match=re.escape(
            f"image {oci_registry.host}/team/train:2 does not exist ({oci_registry.host} answered 404 for "
            f"team/train:2). Build and push it (ddlkit's images: scripts/build_images.sh --registry "
            f"{oci_registry.host}/team --push), or set compute.image to an image that exists."
        ),
    ):
        submitted(azureml_workspace, tmp_path / "missing", "print('done')", image=f"{oci_registry.host}/team/train:2")
    assert len(azureml_workspace.jobs) == 1

    # a private one: the workspace pulls with credentials of its own, so it is told and submitted
    private = oci_registry.push("team/private", "1")
    handle = submitted(azureml_workspace, tmp_path / "private", "print('done')", image=private)
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    assert (
        f"ddlkit: note: could not check that image {private} can be pulled ({oci_registry.host} refused it "
        "without credentials (401)); submitting anyway\n"
    ) in capfd.readouterr().err


def test_collect_waits_for_the_job_record_to_agree_with_run_history(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Run history says Completed a while before the job's record (which jobs.download reads) does."""
    azureml_workspace.record_lag_s = 3.0
    handle = submitted(azureml_workspace, tmp_path / "job", "open('written-by-the-job.txt', 'w').write('here')")
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    handle.collect()
    assert (tmp_path / "job" / "written-by-the-job.txt").read_text() == "here"
    said = capfd.readouterr().err
    assert "job record says Finalizing while its run history says Completed: waiting up to 120 s" in said


def test_collect_downloads_a_job_whose_record_ends_between_two_reads(
    azureml_workspace: LoopbackWorkspace, https_loopback: LoopbackServer, tmp_path: Path
) -> None:
    """The SDK's download reads the record (still Finalizing) and refuses; ddlkit's own read a moment later
    finds it Completed: the download is tried again, not given up as refused for another reason."""
    handle = submitted(azureml_workspace, tmp_path / "job", "open('written-by-the-job.txt', 'w').write('here')")
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    # the handle downloaded the output before it judged the job: another handle downloads it anew
    handle = on(azureml_workspace).attach(handle.id, job_dir=tmp_path / "again")
    reads = []

    def lagging_once(r: Request, m: re.Match[str]) -> dict:
        reads.append(r.path)
        record = azureml_workspace._get_job(r, m)
        if len(reads) == 1:
            record["properties"]["status"] = "Finalizing"
        return record

    https_loopback.route("GET", ARM_PREFIX + r"/jobs/(?P<name>[^/]+)", lagging_once)
    handle.collect()
    assert (tmp_path / "again" / "written-by-the-job.txt").read_text() == "here"
    assert len(reads) >= 3  # the download's read (Finalizing), ddlkit's (Completed), the download's again


def test_collect_says_so_when_the_job_record_never_agrees(azureml_workspace: LoopbackWorkspace, tmp_path: Path) -> None:
    azureml_workspace.record_lag_s = 600.0
    handle = submitted(azureml_workspace, tmp_path / "job", "open('written-by-the-job.txt', 'w').write('here')")
    # the handle downloads the output before it judges the job, then collect() tries again
    handle.scheduler.settle_s = 1.0
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    with pytest.raises(
        ddlkit.RunError,
        match=r"run history says the job ended \(Completed\), but its job record "
        r"still says Finalizing after 1 s.*ddlkit jobs attach " + re.escape(str(tmp_path / "job")),
    ):
        handle.collect()
    assert not (tmp_path / "job" / "written-by-the-job.txt").exists()


def test_the_rank_that_failed_first_is_judged_from_the_records_in_the_output(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path
) -> None:
    """Every process runs under the rank minder, whose exit record goes into the job's output with
    its log: the job is judged from them once they are downloaded. Azure ML reports the exit status
    of the first process it lists (rank 0's, stopped when rank 1 failed); the job's is rank 1's."""
    code = """
        import os, sys, time
        if os.environ["RANK"] == "1":
            print("rank 1: the batch is bad", flush=True)
            sys.exit(4)
        time.sleep(60)
    """
    handle = submitted(azureml_workspace, tmp_path / "rank-1-fails", code, dist="native", procs_per_node=2)
    status = handle.wait(timeout=90)
    assert azureml_workspace.jobs[handle.id].exit_code == 143  # rank 0's minder, its worker stopped by SIGTERM
    assert (status.state, status.exit_code) == (JobState.FAILED, 4), status
    assert re.match(
        rf"Azure ML job {handle.id} failed: Execution failed\. User process 'bash' exited with status code 143\. .*; "
        r"rank 1 \(node 0, host [^)]+\) failed first, with exit status 4; last lines of .*rank-1\.log:\n"
        r"    rank 1: the batch is bad\n",
        status.message,
    ), status.message
    assert "then rank 0: killed by signal SIGTERM" in status.message, status.message
    records = {p.name: json.loads(p.read_text())["code"] for p in (tmp_path / "rank-1-fails" / ".ranks").iterdir()}
    assert records == {"rank-0.json": -15, "rank-1.json": 4}


def test_rank_0s_log_is_found_among_ten_processes(azureml_workspace: LoopbackWorkspace, tmp_path: Path) -> None:
    """With 10 or more processes Azure ML names their logs std_log_process_00.txt ... (zero-padded)."""
    handle = submitted(
        azureml_workspace,
        tmp_path / "job",
        "import os; print('rank', os.environ['RANK'], 'here')",
        framework="pytorch",
        dist="native",
        procs_per_node=10,
    )
    output = "".join(handle.logs(follow=True))
    assert "rank 0 here" in output and "rank 1 here" not in output, output
    assert "user_logs/std_log_process_00.txt" in azureml_workspace.jobs[handle.id].log_files()
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    handle.collect()
    assert sorted(p.name for p in (tmp_path / "job").glob("rank-*.log")) == sorted(f"rank-{r}.log" for r in range(10))
    assert (tmp_path / "job" / "rank-7.log").read_text() == "rank 7 here\n"


#: a job whose rank 0 prints a line every 0.3 s
LINES = """
    import time
    for i in range(6):
        print(f"line {i}", flush=True)
        time.sleep(0.3)
"""


def test_a_log_server_that_ignores_range_gets_each_line_printed_once(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path
) -> None:
    """The log is read from where the last read stopped; a 200 to a ranged read is the whole file."""
    azureml_workspace.ignore_range = True
    handle = submitted(azureml_workspace, tmp_path / "job", LINES)
    started, output = time.monotonic(), ""
    for chunk in handle.logs(follow=True):
        output += chunk
        assert output.count("line 0\n") <= 1, f"a line printed again:\n{output}"
    following_s = time.monotonic() - started
    assert [ln for ln in output.splitlines() if ln.startswith("line ")] == [f"line {i}" for i in range(6)], output
    reads = azureml_workspace.server.requests("GET", r"/loopback/logs/.*")
    assert all(r.headers.get("range") for r in reads)
    assert len(reads) <= following_s / 0.2 + 2, (len(reads), following_s)  # one read per poll interval


def test_without_a_credential_the_ways_to_sign_in_are_named(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no az
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"no Azure credential found.*`az login`.*managed identity.*"
        "AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET",
    ):
        on(azureml_workspace).submit(spec(tmp_path))
    assert not azureml_workspace.server.requests()


def test_an_expired_cli_sign_in_is_named_with_az_login(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Azure CLI's sign-in has expired (it answers AADSTS700082): said so, with `az login`, not
    "no credential found" (issue 37, item 21)."""
    bin_dir = install_az(tmp_path / "expired-az", error=EXPIRED_SIGN_IN)
    monkeypatch.setenv("PATH", sdk_environment(az_bin=bin_dir)["PATH"])
    with pytest.raises(ddlkit.ConfigError) as refused:
        on(azureml_workspace).submit(spec(tmp_path))
    assert str(refused.value) == (
        f"reading workspace {azureml_workspace.workspace}: the Azure CLI's sign-in has expired (AADSTS700082: "
        "The refresh token has expired due to inactivity): sign in again with `az login`."
    )
    assert (bin_dir / "az.log").read_text().startswith("account get-access-token")


# ---------------------------------------------------------------------------- through the CLI
def ddlkit_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddlkit", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("compute.subscription_id=S",),
            (
                "ddlkit: error: compute=azureml needs compute.resource_group (its resource "
                "group): set it, e.g. compute.resource_group=<resource_group>."
            ),
        ),
        (
            (
                "compute.subscription_id=S",
                "compute.resource_group=RG",
                "compute.workspace=W",
                "compute.cluster=c",
                "data=imagefolder",
                "data.root=/data/imagenet",
            ),
            (
                "ddlkit: error: data.root=/data/imagenet is a path on this "
                "machine, which compute=azureml's nodes cannot see"
            ),
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    proc = ddlkit_cli("compute=azureml", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_composing_an_azureml_run_does_not_import_the_sdk(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "ddlkit",
            "--cfg",
            "job",
            "compute=azureml",
            *(f"compute.{k}={v}" for k, v in WORKSPACE.items()),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert OmegaConf.create(proc.stdout).compute.subscription_id == "sub-x"  # the composed config
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line]
    assert "ddlkit.registry" in imported  # the import log was read: composing names the target, loads nothing of it
    assert not [m for m in imported if m.startswith(("azure.ai", "azure.identity", "azure.core"))]


def test_plan_lists_the_code_snapshot_and_names_where_it_goes(user_project: UserProject, tmp_path: Path) -> None:
    proc = ddlkit_cli(
        "plan",
        "compute=azureml",
        *(f"compute.{k}={v}" for k, v in WORKSPACE.items()),
        *user_project.overrides,
        f"hydra.run.dir={tmp_path / 'job'}",
        cwd=user_project.root,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    snapshot = CodeSnapshot.take(user_project.root, max_bytes=10**6)
    assert (
        f"code: a snapshot of the launch directory ships with the job ({snapshot.describe()}): "
        "my_pkg/__init__.py, my_pkg/data.py"
    ) in proc.stdout
    uri = f"azureml://datastores/workspaceblobstore/paths/ddlkit-code/{snapshot.digest}/"
    assert f"# code snapshot: {uri}, the input code" in proc.stdout
    assert f'"uri": "{uri}"' in proc.stdout
    assert not (tmp_path / "job").exists()  # a plan uploads and writes nothing


# ---------------------------------------------------------------------------- connections that drop (issue 37)
RUN_DETAILS = "/history/v1.0" + ARM_PREFIX + r"/runs/[^/]+/details"


def test_a_dropped_connection_is_retried_then_one_line_naming_the_endpoint(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path
) -> None:
    """Azure ML closing the connection without an answer (the SDK's ServiceResponseError) is retried
    by the SDK's retry policy, as a 503 is; once it gives up: one ConfigError line naming the endpoint,
    and a look at a job says that the job runs on and how to follow it again (issue 37, item 18)."""
    server = azureml_workspace.server
    jobs = ARM_PREFIX + r"/jobs/[^/]+"
    server.drop("PUT", jobs, times=1)
    handle = submitted(azureml_workspace, tmp_path / "job", "import time; time.sleep(1)")
    assert [r.dropped for r in server.requests("PUT", jobs)] == [True, False]
    endpoint = f"no answer from Azure ML at {server.host}:{server.port} (the connection was closed with no response)"

    server.drop("GET", RUN_DETAILS, times=None)
    with pytest.raises(ddlkit.ConfigError) as looked:
        handle.status()
    assert endpoint in str(looked.value) and "\n" not in str(looked.value)
    assert f"`ddlkit jobs attach {tmp_path / 'job'}` follows it again" in str(looked.value)
    assert len(server.requests("GET", RUN_DETAILS)) == 4  # the SDK's retries: 3 after the first

    server.drop("GET", ARM_PREFIX, times=None)  # the workspace's own read, before a submission
    with pytest.raises(ddlkit.ConfigError) as submitting:
        submitted(azureml_workspace, tmp_path / "second", "print('never')")
    assert str(submitting.value).startswith(f"reading workspace {azureml_workspace.workspace}: {endpoint}")
    assert "\n" not in str(submitting.value)


def test_a_log_read_that_gives_up_leaves_the_job_running_and_says_how_to_attach(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A dropped read of the log's URL is retried (no line lost or repeated); reads that give up end
    the following, not the job: it is waited for and judged as any other, and stderr says that it
    runs on and how to follow it again (issue 37, item 20)."""
    handle = submitted(azureml_workspace, tmp_path / "job", COUNTING_JOB)
    follow_while_dropping(handle.logs(follow=True), azureml_workspace.server, r"/loopback/logs/.*")
    assert handle.wait(timeout=90).state is JobState.SUCCEEDED
    said = capfd.readouterr().err
    assert (
        f"ddlkit: reading job {handle.id}'s log: no answer from Azure ML's log storage at "
        f"{azureml_workspace.server.host}:{azureml_workspace.server.port}"
    ) in said, said
    assert (
        f"Azure ML job {handle.id} runs on: waiting for it to end without its log; "
        f"`ddlkit jobs attach {tmp_path / 'job'}` follows the log again."
    ) in said, said


def test_a_cancel_azure_ml_fails_or_does_not_confirm_is_said(
    azureml_workspace: LoopbackWorkspace,
    https_loopback: LoopbackServer,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Azure ML accepts the cancel (202) and its operation then fails: one line saying so and that
    the job may still run, not a wait with no word; an operation that does not finish within the
    bound is said, and the cancel returns (issue 37, item 21)."""
    handle = submitted(azureml_workspace, tmp_path / "job", "import time; time.sleep(60)")
    wait_for_state = time.monotonic() + 60
    while handle.status().state is not JobState.RUNNING and time.monotonic() < wait_for_state:
        time.sleep(0.2)
    operation = {"status": 400}
    https_loopback.route(
        "POST",
        ARM_PREFIX + r"/jobs/(?P<name>[^/]+)/cancel",
        lambda r, m: Response(202, None, {"Location": f"{https_loopback.url}/loopback/operations/refused"}),
    )
    https_loopback.route(
        "GET",
        r"/loopback/operations/refused",
        lambda r, m: Response(
            operation["status"],
            error_body("UserError", "The job cannot be canceled now") if operation["status"] >= 400 else None,
        ),
    )
    with pytest.raises(ddlkit.ConfigError) as failed:
        handle.scheduler.signal(handle.id, "stop")
    assert str(failed.value).startswith(f"cancelling job {handle.id}: Azure ML's cancel operation failed (")
    assert "The job cannot be canceled now" in str(failed.value) and "\n" not in str(failed.value)
    assert f"`ddlkit jobs attach {tmp_path / 'job'}` follows it" in str(failed.value)

    operation["status"] = 202  # never finishes
    handle.scheduler.cancel_wait_s = 1.0
    started = time.monotonic()
    handle.scheduler.signal(handle.id, "stop")
    assert time.monotonic() - started < 10
    assert (
        f"ddlkit: cancelling job {handle.id}: Azure ML has not confirmed the cancel within 1 s; waiting for the "
        "job's state to say it stopped"
    ) in capfd.readouterr().err


def test_a_missing_secret_is_one_line_naming_the_vault_the_secret_and_the_role(
    azureml_workspace: LoopbackWorkspace,
) -> None:
    """What a rank meets when its job's secret is not in the vault (deleted, as once its job was
    collected): one line, not the SDK's traceback."""
    from ddlkit_azure import keyvault
    from ddlkit_azure.arm import management_credential

    vault = azureml_workspace.key_vault
    names = keyvault.store(vault.url, "ddlkit-job_x-abc123", {"TOKEN": SECRET}, management_credential())
    assert names == {"TOKEN": "ddlkit-job-x-abc123-0-TOKEN"}
    env = keyvault.job_variables(vault.url, names)
    assert keyvault.read(env, management_credential()) == {"TOKEN": SECRET}
    assert keyvault.delete(vault.url, names.values(), management_credential()) == []
    with pytest.raises(keyvault.SecretsError) as err:
        keyvault.read(env, management_credential())
    assert str(err.value) == (
        f"reading the job's secret TOKEN (key vault secret ddlkit-job-x-abc123-0-TOKEN) from key vault {vault.url}: "
        "the vault has no such secret (deleted once its job was collected, or never stored); if it is there, the "
        "job's identity (the compute cluster's managed identity) needs the 'Key Vault Secrets User' role on the "
        'vault (az role assignment create --role "Key Vault Secrets User" --assignee <its principal id> --scope '
        "<the vault's id>)."
    )
    # the launcher's own refusal names the role it needs
    vault.refuse(TOKEN_CLAIMS["oid"])
    with pytest.raises(keyvault.SecretsError, match="the identity that submits needs the 'Key Vault Secrets Officer'"):
        keyvault.store(vault.url, "ddlkit-job_y-abc123", {"TOKEN": SECRET}, management_credential())


# ---------------------------------------------------------------------------- storage that refuses the SDK's uploads
def submitting(loopback: LoopbackWorkspace, job_dir: Path, *, within_s: float = 120.0) -> BaseException | None:
    """What a submission raised (None: it submitted); fails the test when it has not ended within ``within_s``
    (the call goes on in a daemon thread, as a hung SDK would)."""
    ended: list[BaseException | None] = []

    def submit() -> None:
        try:
            submitted(loopback, job_dir, "print('submitted')")
            ended.append(None)
        except BaseException as err:  # noqa: BLE001 - the outcome under test
            ended.append(err)

    thread = threading.Thread(target=submit, daemon=True)
    thread.start()
    thread.join(within_s)
    assert ended, f"the submission of {job_dir.name} had not ended after {within_s:.0f} s"
    return ended[0]


@pytest.mark.parametrize("refusal", ["rotated", "read-only"])
def test_storage_that_refuses_the_sdks_uploads_is_one_line_not_a_wait(
    azureml_workspace: LoopbackWorkspace, tmp_path: Path, refusal: str
) -> None:
    """The SDK uploads the environment's build context and the job's files itself; with its progress bars
    off it never read its upload threads' results, and it waited forever for a refused write (`--detach`
    hung, silently). Refused at the first read (a rotated key) or at the first write (read-only
    credentials): one line naming the storage account and what to check, for both uploads, and no job
    created (issue 37, item 19)."""
    # a build context an earlier test uploaded would be found there (its name is its hash): nothing to upload
    store = azureml_workspace._service().get_container_client(azureml_workspace.datastores["workspaceblobstore"])
    for blob in store.list_blobs(name_starts_with="LocalUpload/"):
        store.delete_blob(blob.name)

    def refuse(on: bool) -> None:
        azureml_workspace.storage_credentials = refusal if on else "full"  # type: ignore[assignment]

    refuse(True)
    context = submitting(azureml_workspace, tmp_path / "context")  # the environment's build context first
    refuse(False)
    assert submitting(azureml_workspace, tmp_path / "created") is None  # the environment exists from now on
    refuse(True)
    files = submitting(azureml_workspace, tmp_path / "files")  # the job's own files, the environment found
    refuse(False)

    environment = f"creating environment ddlkit-pytorch-cuda:{image_context('pytorch', gpu=True).digest[:16]}"
    for what, err in (
        (f"{environment}: uploading its build context: ", context),
        ("submitting job files: uploading its files: ", files),
    ):
        assert isinstance(err, ddlkit.ConfigError), repr(err)
        message = str(err)
        assert "\n" not in message and message.startswith(what), message
        # a bad signature: Azure says AuthenticationFailed, Azurite AuthorizationFailure
        bad_signature = "AuthenticationFailed|AuthorizationFailure"
        code = bad_signature if refusal == "rotated" else "AuthorizationPermissionMismatch"
        assert re.search(rf"the workspace's storage account {ACCOUNT} answered 403 \({code}\)", message), message
        assert "'Storage Blob Data Contributor' role" in message, message
    assert len(azureml_workspace.jobs) == 1  # the one submitted while storage answered


def test_storage_the_sdk_cannot_reach_is_one_line_naming_the_workspaces_storage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A storage request that gets no connection (here a proxy that refuses it) is the workspace's
    storage's, not Azure ML's: through a proxy nothing in the error names the host, so the storage
    SDK's raising it says so. The SDK's own uploads retry for about a minute first; this one does
    not (issue 37, item 19)."""
    from azure.storage.blob import BlobServiceClient

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{closed.getsockname()[1]}")
    blob = BlobServiceClient(BLOB_URL, credential=SECRET, retry_total=0).get_blob_client("c", "LocalUpload/x")
    what = "submitting job j: uploading its files"
    with pytest.raises(ddlkit.ConfigError) as refused, sdk_uploading(what, {"s": SECRET}):
        blob.upload_blob(b"x")
    message = str(refused.value)
    assert message.startswith(f"{what}: no answer from the workspace's storage ("), message
    assert "Connection refused" in message and "\n" not in message and SECRET not in message, message
