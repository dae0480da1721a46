r"""**Azure Batch AI was retired in 2019; no Azure service answers its API any more. To run on Azure
today use [compute=azureml](azureml.md).** `compute=batchai` keeps the seed's reference
architecture as ddlkit config, with the real `azure-mgmt-batchai` 7.0.0 client (API 2018-05-01;
it imports only with `msrest`, which it does not declare, so the plugin's extra installs it): for
a Batch AI-compatible endpoint (`compute.endpoint`), and so that `ddlkit plan` shows anyone
exactly what the architecture does.

    ddlkit compute=batchai compute.subscription_id=S compute.resource_group=RG compute.workspace=WS \
        compute.cluster.name=nc24 compute.cluster.vm_size=Standard_NC24rs_v3 compute.nodes=2 compute.procs_per_node=4 \
        compute.file_share.url=https://ACCOUNT.file.core.windows.net/SHARE \
        storage=nfs 'storage.root=$AZ_BATCHAI_MOUNT_ROOT/nfs' dist=native framework=pytorch \
        data=imagefolder data.root=datasets/imagenet compute.stage_from=blob://datasets/imagenet
    ddlkit plan compute=batchai ...                  # every request, in order, with its body; no sign-in, no network
    ddlkit --detach compute=batchai ...              # then ddlkit jobs status|logs|attach|cancel <job>
    ddlkit compute down compute=batchai ...          # delete the cluster and file server ddlkit created (asks first)

With `storage=nfs`, `storage.root='$AZ_BATCHAI_MOUNT_ROOT/nfs'` is expanded on the nodes. The
repository's `conf/compute/batchai_nc24.yaml` is a preset of these settings.

Status: works against a loopback service that follows the 2018-05-01 REST API (the real
`azure-mgmt-batchai` 7.0.0 client); no live service exists.

## What a job does

In order; each step reuses what exists with the same settings:

0. **The image**: before anything is created, the job's image is asked of its registry, as the
   nodes pull it: without credentials (the job sends none). An image the registry does not have,
   or refuses to an anonymous client (Docker Hub's answer for a repository that does not exist),
   is a one-line error naming the fix; a registry that cannot be asked is said on the console, and
   the job goes on ([Is the image there?](../docker.md#is-the-image-there)).
1. **Resources**: the workspace (`compute.location`), the experiment (`compute.experiment`), the
   NFS file server when `storage=nfs` or `compute.stage_from` needs it (`compute.file_server.*`),
   and the cluster (`compute.cluster.*`, with the file server and the Azure Files share mounted,
   an admin user signed in by `ssh_public_key_file`; no password is sent). A resource that exists
   with other settings is an error naming the setting and how to proceed; a cluster with more
   nodes than the job needs is reused. Everything ddlkit creates is recorded in
   `<state dir>/batchai/<subscription>/<resource group>/<workspace>.json`.
2. **Staging** (`compute.stage_from=blob://...`, a dataset uploaded with `ddlkit data upload`,
   which writes its `manifest.tsv`): a staging job on the cluster copies it onto the file server
   at `data.root` with ddlkit's staging ([staging](../storage/local_ssd.md#staging)). The job is named after
   the manifest's digest: a later job with the same dataset finds it done and skips the step (one
   look-up); a changed dataset gets a new one. The blob credentials travel as the staging job's
   secrets.
3. **The job**: the job directory is uploaded to the Azure Files share
   (`<compute.file_share.directory>/jobs/<job>`: the job's input directory `JOB`); its code
   snapshot, when it ships one (`code/` and `code.json`), goes to a folder of its own,
   `<compute.file_share.directory>/code/<sha256>/`, uploaded unless that folder's `code.json`
   (uploaded last) is there already: an unchanged tree is uploaded once. The job's preparation
   step copies the job directory, and the snapshot beside its `job.json`, into the job's output
   directory `JOB` (one node copies, the others wait), where every rank runs: custom MPI settings
   with `processCount` = `nodes x procs_per_node`, so the service's `mpirun` starts
   `python -m ddlkit_mpi.rank --node-sizes ... -- python -m ddlkit.rank.worker job.json` on every
   rank (the command line is `bash -c '<script>'`: the MPI runtime starts its first word, and the
   script, which sets the rendezvous variables, `cd`s into the output directory and `exec`s, is
   shell syntax), rank 0's host taken from the host file the service provides
   (`$AZ_BATCHAI_MPI_HOST_FILE`, `compute.master_port`), in `compute.image` (default: ddlkit's
   image for the framework in `compute.registry`, `-cuda`, or `-cpu` with `compute.gpu=false`,
   which `scripts/build_images.sh --registry <compute.registry> --push` puts there:
   [Docker images](../docker.md)). Output: `stdOutErrPathPrefix` on the share. The job's
   environment goes in `environmentVariables`, its secrets (keys, tokens, the config's secrets)
   in the job's `secrets`, which the service never reports back: never in
   `environmentVariables`, a file or a log; `ddlkit plan` shows `***`.
4. **Following**: the job's state every `compute.poll_interval_s` (queued -> pending, running,
   succeeded/failed; `terminating` while a cancel runs); rank 0's output streams from `stdout.txt`
   of the `stdouterr` output directory (`listOutputFiles`, then a ranged read of the file's
   download URL, one per `compute.poll_interval_s`; a whole-file answer to it has the bytes
   already read skipped). Ctrl-C and `ddlkit jobs cancel` terminate the job (the service stops its
   processes; the ranks checkpoint on the SIGTERM when it leaves them the time: the loopback gives
   10 s). At the end the output directory `JOB` (result, metrics, rank logs, the ranks' exit
   records, model, checkpoints) is downloaded into the local job directory before the job is
   judged, by ddlkit's one rule ([Failures, restarts and elastic jobs](../failures.md)): the rank
   that failed first gives the job its exit status (ranks that checkpointed on a terminate: 75,
   resumable), the service's exit code and errors stay in the message, and are all there is when
   no rank left a record; with `storage=nfs` the results are also copied to the file server
   (`storage.root` is expanded on the node).

**With `dist=horovod`** the default image is the one with Horovod built in,
`<framework>:<version>-<cpu|cuda>-horovod` (`scripts/build_images.sh --horovod --variant cpu`
builds the CPU ones; a CUDA one with NCCL is yours to build:
[Horovod on GPUs](../docker.md#horovod-on-gpus)), and the same custom MPI settings start its
`nodes x procs_per_node` ranks: Horovod runs over the MPI job the service starts, its ranks import
Horovod from the image, and the launcher needs none. `ddlkit plan` says which image brings it
(`the ranks run in image ...; dist=horovod: Horovod comes from the image ...`). The API's
`horovodSettings` is not used: it runs `<python> <script file> <args>` under the same `mpirun` and
adds nothing Horovod needs, while ddlkit's rank command is a module (`-m ddlkit_mpi.rank`) behind
a shell that sets the rendezvous variables.

A node taken away fails the job with exit code 137 (Batch AI does not re-queue a job itself), and
ddlkit's restart policy resubmits it, resuming from its checkpoint
([Failures, restarts and elastic jobs](../failures.md)).

## Errors

One line, exit status 2: a cluster or file server that exists with other settings (which, and
how to proceed), a VM size without GPUs for a GPU run (`compute.gpu=true`, the default) or more
ranks per node than its GPUs, a file server still being created (progress lines while waiting up
to `compute.file_server.wait_s`, then the error), quota and other refusals of the service (its
message: `QuotaExceeded: Operation results in exceeding quota limits of Core ...`),
`storage=local_ssd` on a VM size without a local disk, `storage=nfs` whose `storage.root` is not
the file server's mount, no credential (`az login`, a managed identity or a service principal), a
missing subscription/resource group/workspace/share key (`$AZURE_STORAGE_KEY` or
`compute.file_share.account_key_file`), a subscription or resource group that does not exist
(ARM's 404 `SubscriptionNotFound`/`ResourceGroupNotFound`: which key to check, or
`az group create`), any other 404 where a resource must exist (the service's message), an image
its registry does not have or refuses to an anonymous pull
(`scripts/build_images.sh --registry R --push`, or `compute.image`).

A connection Batch AI refuses or closes without an answer is retried by the SDK's retry policy
(azure-core's, as a 429 or 503 is), and a request to the Azure Files share by ddlkit's retry loop
(as Blob Storage's: each retry a line with its delay, five tries); then one line, exit status 2,
naming the endpoint and what to check. A look at a job adds that the job runs on and
`ddlkit jobs attach <job dir>` follows it again; `ddlkit jobs list` shows its state as unknown
(`running?`) among the others. Reads of `stdout.txt` are retried as Batch AI's calls are; reads
that give up end the following, not the run: it says so, waits for the job's end and judges it.

## Tearing down

`ddlkit compute down compute=batchai ...` (with the run's compute options) lists what it will
delete (the cluster and the file server the options name, and only if ddlkit created them; others
are listed as kept), asks, and deletes (`--yes`: without asking; without a terminal and without
`--yes` it deletes nothing). With nothing to delete (no such workspace: Batch AI answers 404 to
listing its file servers; or nothing ddlkit created still there) it says so and succeeds. The
workspace and experiment are kept (they cost nothing).

## How it is tested

The real client and CLI run against a loopback Batch AI service (`ddlkit_azure.testing.batchai`):
HTTPS on 127.0.0.1, signed in through `DefaultAzureCredential` and a stand-in `az`; long-running
operations answer 202 with a `Location` and `Retry-After: 0` (azure-core takes a 0 for no header
and waits its polling interval, which ddlkit sets to `compute.poll_interval_s`; without it every
poll waits 30 s); every create body is checked against the published schema; the Azure Files
share and the file server are directories of this machine; jobs really run under `mpirun`, the
node's shell running `mpirun <options> <commandLine>` as the API describes (this machine's
`python` stands in for the image; the nodes "pull" it from a loopback registry,
`ddlkit.testing.registry`, and a job whose image it does not let them pull fails as a failed pull
does, so the tests of the check fail without it); a resource group can be made missing (404
`ResourceGroupNotFound`), and listing under a missing workspace is 404. The tests run the
compute-target contract, ResNet-18 through the CLI with `dist=native` and `dist=horovod` getting
`result.json` back, idempotent re-runs, states, streaming, cancel, `ddlkit jobs`, staging from
Azurite, teardown, every error above, a node taken away (its processes killed: the job is
resubmitted and resumes), and a package that exists only in the launch directory trained from its
snapshot on the share (uploaded by the first job; the second asks with one `HEAD` and uploads
nothing of it; a changed tree is uploaded again). Requests, times and staging throughput are
measured by `benchmarks/batchai.py`
([Performance](../../explanation/performance.md#azure-ml-and-batch-ai)).

## How it works

`ddlkit_azure.batchai_client` sends the requests; the SDK is imported only when a job is planned,
submitted or followed, never when a run is composed. The file server's delete (in the published
API, missing from the 7.0.0 client's operations) is sent through the same client pipeline. The
credential helpers (`DefaultAzureCredential` without the browser, one-line sign-in errors) are in
`ddlkit_azure.arm`, for any target of this plugin.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from omegaconf import MISSING

import ddlkit
from ddlkit.atomic import replace_text
from ddlkit.compute.containers import DEFAULT_REGISTRY, default_image, ensure_pullable
from ddlkit.compute.gang import GangConfig
from ddlkit.compute.outcome import Observation
from ddlkit.compute.scheduler import Scheduler, SchedulerJob
from ddlkit.interfaces import JobSpec, JobState
from ddlkit.jobdir import CODE_DIR, RANKS_DIR, STATE_DIR, TELEMETRY_FILE
from ddlkit.options import MASTER_PORT, POSITIVE, checked

from .ranged import RangedLog, follow_paced

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .batchai_client import Service

API_VERSION = "2018-05-01"
#: the id of the job's input and output directory (``$AZ_BATCHAI_INPUT_JOB``, ``$AZ_BATCHAI_OUTPUT_JOB``)
JOB_DIRECTORY_ID = "JOB"
#: the output directory Batch AI keeps the job's stdout.txt and stderr.txt in
STDOUTERR = "stdouterr"
#: seconds after a terminate before it is sent again (the service stops the processes, then kills them itself)
TERMINATE_AGAIN_S = 60.0


class VmPriority(StrEnum):
    dedicated = "dedicated"
    lowpriority = "lowpriority"


class Scale(StrEnum):
    manual = "manual"
    auto = "auto"


class DiskType(StrEnum):
    Standard_LRS = "Standard_LRS"
    Premium_LRS = "Premium_LRS"


@dataclass
class ClusterSettings:
    # the cluster's name in the workspace; created if missing, reused when its settings match
    name: str = "ddlkit"
    # the nodes' VM size, e.g. Standard_NC24rs_v3 (4 V100s); compute.gpu=true needs one with GPUs
    vm_size: str = "Standard_NC6"
    # dedicated, or lowpriority (cheaper; nodes may be taken away, the job is re-queued)
    vm_priority: VmPriority = VmPriority.dedicated
    # manual: compute.nodes nodes (or max_nodes) kept; auto: between min_nodes and max_nodes as jobs need
    scale: Scale = Scale.manual
    min_nodes: int = 0
    # null: compute.nodes
    max_nodes: int | None = None
    # the nodes' admin user, and the public key that signs in as it (no password is ever sent)
    admin_user: str = "ddlkit"
    ssh_public_key_file: str = "~/.ssh/id_rsa.pub"


@dataclass
class FileServerSettings:
    # the NFS file server, created when storage=nfs or compute.stage_from needs it
    name: str = "ddlkit-nfs"
    vm_size: str = "Standard_D14_v2"
    # data disks, striped as RAID 0
    disk_count: int = 4
    disk_size_gb: int = 512
    disk_type: DiskType = DiskType.Premium_LRS
    # where the cluster mounts it, below $AZ_BATCHAI_MOUNT_ROOT
    mount_path: str = "nfs"
    # how long to wait for a file server that is still being created (progress every 30 s)
    wait_s: float = 1800.0


@dataclass
class FileShareSettings:
    # the Azure Files share that holds the job directories and logs: https://<account>.file.core.windows.net/<share>
    url: str = MISSING
    # its account key (the cluster mounts the share with it): this file, else $AZURE_STORAGE_KEY
    account_key_file: str | None = None
    # where the cluster mounts it, below $AZ_BATCHAI_MOUNT_ROOT
    mount_path: str = "azfiles"
    # the folder of the share that ddlkit's job directories go under
    directory: str = "ddlkit"


@dataclass
class BatchAIConfig(GangConfig):
    # where the resources live; the credential comes from DefaultAzureCredential, never from here
    subscription_id: str = MISSING
    resource_group: str = MISSING
    workspace: str = MISSING
    # the workspace's region (when ddlkit creates it)
    location: str = "eastus"
    # the experiment the jobs go in
    experiment: str = "ddlkit"
    # the job runs on GPUs: the framework's CUDA image, and a VM size with GPUs
    gpu: bool = True
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    file_server: FileServerSettings = field(default_factory=FileServerSettings)
    file_share: FileShareSettings = field(default_factory=FileShareSettings)
    # a blob:// dataset (with its manifest.tsv) copied onto the file server, at data.root below
    # storage.root, before the job; skipped when that copy is already there
    stage_from: str | None = None
    # the job's image; null: ddlkit's image for the framework at ddlkit's version, from `registry`
    image: str | None = None
    registry: str = DEFAULT_REGISTRY
    # the ranks' interpreter in the image
    python: str = "python"
    # rank 0's rendezvous port (MASTER_PORT) on the first node; ddlkit's control plane uses the next one
    master_port: int = checked(29500, MASTER_PORT)
    # the longest the job may run (ISO 8601 duration, e.g. P7D); null: the service's default (a week)
    max_wall_clock_time: str | None = None
    # the Batch AI endpoint (Azure Resource Manager); another one for a Batch AI-compatible service
    endpoint: str = "https://management.azure.com"
    # seconds between looks at the job (GET); a cluster's API has rate limits
    poll_interval_s: float = checked(5.0, POSITIVE)
    # taken from the run's config: the framework and dist pick the default image, storage and data.root
    # the file server's role (set by ddlkit; do not override)
    framework: str = "${framework.name}"
    # dist=horovod: the default image is the one with Horovod built in (<framework>:<version>-<variant>-horovod)
    dist: str = "${dist.backend}"
    storage: str = "${storage.name}"
    data_root: str | None = "${oc.select:data.root,null}"


# ---------------------------------------------------------------------------- VM sizes
#: GPUs per VM of the GPU sizes of Batch AI's time (NC, NCv2, NCv3, ND, NDv2, NV)
GPU_SIZES = {
    "standard_nc6": 1,
    "standard_nc12": 2,
    "standard_nc24": 4,
    "standard_nc24r": 4,
    "standard_nc6s_v2": 1,
    "standard_nc12s_v2": 2,
    "standard_nc24s_v2": 4,
    "standard_nc24rs_v2": 4,
    "standard_nc6s_v3": 1,
    "standard_nc12s_v3": 2,
    "standard_nc24s_v3": 4,
    "standard_nc24rs_v3": 4,
    "standard_nd6s": 1,
    "standard_nd12s": 2,
    "standard_nd24s": 4,
    "standard_nd24rs": 4,
    "standard_nd40s_v3": 8,
    "standard_nd40rs_v2": 8,
    "standard_nv6": 1,
    "standard_nv12": 2,
    "standard_nv24": 4,
}
# the N families are Azure's GPU VMs
_GPU_FAMILY = re.compile(r"^standard_n[cdv]\d", re.IGNORECASE)
# v4 and later sizes have a local (temporary) disk only when their letters include "d": D4ds_v4 has, D4s_v4 not
_NO_LOCAL_DISK = re.compile(r"^standard_[a-z]+\d+(?P<letters>[a-z-]*)_v(?P<version>\d+)$", re.IGNORECASE)


def vm_gpus(vm_size: str) -> int | None:
    """GPUs of ``vm_size``: 0 for a size without, None for a GPU size ddlkit does not know the count of."""
    size = vm_size.lower()
    if size in GPU_SIZES:
        return GPU_SIZES[size]
    return None if _GPU_FAMILY.match(size) else 0


def vm_has_local_disk(vm_size: str) -> bool:
    match = _NO_LOCAL_DISK.match(vm_size)
    return not (match and int(match["version"]) >= 4 and "d" not in match["letters"].lower())


def batchai_name(name: str, suffix: str = "") -> str:
    """``name`` as Batch AI takes it (``[-\\w]``, at most 64 characters), keeping its end (the hash)."""
    clean = re.sub(r"[^-\w]", "_", name) + suffix
    return clean[-64:]


# ---------------------------------------------------------------------------- the target
class BatchAITarget(ddlkit.ComputeTarget):
    """``compute=batchai``: one Batch AI job of ``nodes`` x ``procs_per_node`` ranks per ddlkit job."""

    cfg: BatchAIConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        c = cfg
        self.status_interval_s = float(c.poll_interval_s)
        gpus = vm_gpus(c.cluster.vm_size)
        if c.gpu and gpus == 0:
            raise ddlkit.ConfigError(
                f"compute.cluster.vm_size={c.cluster.vm_size} has no GPU, but compute.gpu=true asks for a GPU run: "
                "choose a GPU size (Standard_NC6, Standard_NC24rs_v3, Standard_ND40rs_v2, ...) or set "
                "compute.gpu=false for a CPU run."
            )
        if c.gpu and gpus is not None and c.procs_per_node > gpus:
            raise ddlkit.ConfigError(
                f"compute.procs_per_node={c.procs_per_node} asks for more ranks per node than "
                f"compute.cluster.vm_size={c.cluster.vm_size} has GPUs ({gpus}): one rank per GPU."
            )
        if not c.image:
            # refused before anything
            default_image(str(c.framework), gpu=bool(c.gpu), registry=str(c.registry), horovod=c.dist == "horovod")
        if c.cluster.scale == Scale.auto:
            most = c.cluster.max_nodes if c.cluster.max_nodes is not None else c.nodes
            if most < c.nodes or c.cluster.min_nodes < 0 or c.cluster.min_nodes > most:
                raise ddlkit.ConfigError(
                    f"compute.cluster.min_nodes={c.cluster.min_nodes}, max_nodes={c.cluster.max_nodes} do not fit a "
                    f"job of compute.nodes={c.nodes}: need 0 <= min_nodes <= max_nodes and max_nodes >= nodes."
                )
        if c.stage_from is not None and not str(c.stage_from).startswith("blob://"):
            raise ddlkit.ConfigError(
                f"compute.stage_from={c.stage_from} is not a blob:// URL: it names the dataset "
                "in Blob Storage that is copied onto the file server."
            )

    def configure(self, config: DictConfig) -> None:
        """What compute=batchai needs of the rest of the run: storage=nfs's root, local disks."""
        c, storage = self.cfg, config.storage
        mount = f"$AZ_BATCHAI_MOUNT_ROOT/{c.file_server.mount_path}"
        if storage.name == "nfs" and str(storage.root).rstrip("/") != mount:
            raise ddlkit.ConfigError(
                f"storage=nfs on compute=batchai reads and writes the file server the nodes mount at {mount}: set "
                f"storage.root='{mount}' (it is expanded on the nodes)."
            )
        if storage.name == "local_ssd" and not vm_has_local_disk(c.cluster.vm_size):
            raise ddlkit.ConfigError(
                f"storage=local_ssd stages data onto each node's local disk, but compute.cluster.vm_size="
                f"{c.cluster.vm_size} has none (v4 and later sizes without a 'd' have no temporary disk): choose a "
                "size with one (e.g. Standard_D4ds_v4, Standard_NC24rs_v3) or use storage=nfs."
            )
        if c.stage_from is not None:
            root = config.data.get("root")
            if storage.name != "nfs" or not root or str(root).startswith(("/", "$")) or "://" in str(root):
                raise ddlkit.ConfigError(
                    f"compute.stage_from={c.stage_from} copies the dataset onto the file server: use storage=nfs and "
                    "a data.root relative to it, e.g. data.root=datasets/imagenet."
                )

    def service(self, *, planning: bool = False, say: Callable[[str], None] | None = None) -> Service:
        from .batchai_client import Service

        return Service(self.cfg, planning=planning, say=say)

    def plan(self, spec: JobSpec) -> str:
        service = self.service(planning=True)
        service.run_job(spec)
        return service.describe_plan()

    def submit(self, spec: JobSpec) -> SchedulerJob:
        service = self.service()
        # before anything is created: the nodes pull the image without credentials, so a registry that
        # has no such image, or refuses it to an anonymous pull, would fail the job once it is queued
        ensure_pullable(service.image(), say=service.say)
        shutil.rmtree(spec.job_dir / RANKS_DIR, ignore_errors=True)  # an earlier run's records are not this job's
        return self._job(service, service.run_job(spec), spec.job_dir)

    def attach(self, job_id: str, *, job_dir: Path) -> SchedulerJob:
        return self._job(self.service(), job_id, job_dir)

    def _job(self, service: Service, job_id: str, job_dir: Path) -> SchedulerJob:
        return SchedulerJob(
            BatchAIScheduler(service, job_dir=Path(job_dir)),
            job_id,
            job_dir=Path(job_dir),
            world_size=self.world_size,
            poll_interval_s=service.poll_interval_s,
            grace_period_s=TERMINATE_AGAIN_S,
        )

    def down(self, *, confirm: Callable[[Sequence[str]], bool]) -> list[str]:
        return self.service().down(confirm)


# ---------------------------------------------------------------------------- the scheduler
_STATES = {"queued": JobState.PENDING, "running": JobState.RUNNING, "terminating": JobState.RUNNING}


class BatchAIScheduler(Scheduler):
    """What Batch AI says of its jobs (``job_id``: the job's name in the experiment), their
    terminate, ``stdout.txt`` and the output directory ``JOB``;
    :class:`~ddlkit.compute.scheduler.SchedulerJob` paces the looks and
    :func:`~ddlkit.compute.outcome.judge` decides how a job ended, from the ranks' exit records in
    the output."""

    noun = "Batch AI job"

    def __init__(self, service: Service, *, job_dir: Path | None = None) -> None:
        self.service = service
        #: how to follow the job again, for the messages of a look that got no answer
        self.attach_hint = f"`ddlkit jobs attach {job_dir}`" if job_dir else "`ddlkit jobs attach <job>`"
        self._logs: dict[str, RangedLog] = {}
        self._ended: set[str] = set()
        self._fetched: set[tuple[str, Path]] = set()

    def describe(self, job_id: str) -> Observation:
        from .arm import Unreachable

        try:
            job = self.service.get_job(job_id)
        except Unreachable as err:
            raise Unreachable(
                f"{err} The job itself runs on in Batch AI whatever this says: {self.attach_hint} follows it again."
            ) from None
        state = str(job.execution_state or "queued").lower()
        if state in _STATES:
            where = f" on {job.node_count} node(s)" if state == "running" else ""
            return Observation(_STATES[state], reason=f"Batch AI: {state}{where}")
        self._ended.add(job_id)
        info = job.execution_info
        code = info.exit_code if info is not None else None
        if state == "succeeded":
            return Observation(JobState.SUCCEEDED, code or 0)
        errors = "; ".join(f"{e.code}: {e.message}" for e in (info.errors or [])) if info is not None else ""
        reason = state + (f" with exit code {code}" if code is not None else "") + (f" ({errors})" if errors else "")
        return Observation(JobState.FAILED, 1 if code is None else code, reason=reason)

    def signal(self, job_id: str, how: Literal["stop", "kill"]) -> None:
        # stop and kill alike: the service stops the processes (SIGTERM: the ranks checkpoint when it
        # leaves them the time), then kills them
        self.service.terminate(job_id)

    def read_log(self, job_id: str, offset: int) -> str:
        """``stdout.txt`` of the job's ``stdouterr`` output directory from ``offset``."""
        reader = self._logs.setdefault(job_id, RangedLog())
        return reader.read(offset, lambda start: self.service.read_stdout(job_id, start))

    def follow_log(self, job_id: str, offset: int, done: Callable[[], bool]) -> Iterator[str]:
        return follow_paced(
            lambda at: self.read_log(job_id, at),
            offset,
            done,
            self.service.poll_interval_s,
            running=f"Batch AI job {job_id} runs on: waiting for it to end without its log; {self.attach_hint} "
            "follows the log again",
        )

    def peek(self, job_id: str, job_dir: Path) -> None:
        """Rank 0's ``telemetry.json`` from the job's output directory (on the file share, where the
        ranks write) while the job runs, for ``ddlkit jobs status``; a file that cannot be read now
        leaves the launcher's copy as it was. An ended job's files come with :meth:`fetch`."""
        if job_id in self._ended:
            return
        with contextlib.suppress(ddlkit.DdlkitError):
            data = self.service.output_file(job_id, JOB_DIRECTORY_ID, TELEMETRY_FILE)
            if data is not None:
                replace_text(Path(job_dir) / TELEMETRY_FILE, data.decode("utf-8", errors="replace"))

    def fetch(self, job_id: str, job_dir: Path) -> None:
        """Download the job's output directory ``JOB`` (what the ranks wrote, their exit records
        included) into the job directory; the launcher's own bookkeeping (``STATE_DIR``) is kept. An
        ended job's output is downloaded once."""
        fetched = (job_id, Path(job_dir))
        if fetched in self._fetched:
            return
        ended = job_id in self._ended
        # not the snapshot the ranks ran from (code/, with the .pyc running it left): the launcher has it
        self.service.download_outputs(job_id, Path(job_dir), skip=(STATE_DIR, CODE_DIR))
        if ended:
            self._fetched.add(fetched)
