"""``compute=batchai``: the reference architecture on Azure Batch AI (API 2018-05-01).

**Batch AI was retired in 2019**; no live service answers. ``azure-mgmt-batchai`` 7.0.0 still
builds every request, so a Batch AI-compatible endpoint (``compute.endpoint``) gets a faithful
client, and ``ddlkit plan`` shows anyone what the architecture does. Its successor is
``compute=azureml``.

What a job does, in order (:mod:`ddlkit_azure.batchai_client` sends the requests):

0. the job's image (``compute.image``, or ddlkit's image for the framework in ``compute.registry``,
   which ``scripts/build_images.sh --push`` puts there; with ``dist=horovod`` the one with Horovod
   built in, ``--horovod``, tagged ``...-horovod``: the ranks import Horovod from the image, the
   launcher needs none) is asked of its registry, through the manifest
   API and anonymously, as the nodes pull it: an image the registry does not have, or refuses, is an
   error before anything is created; one that cannot be checked is said on the console;
1. the workspace, the experiment, the NFS file server (when ``storage=nfs`` or
   ``compute.stage_from`` needs it) and the cluster are created -- or reused when they exist with
   the same settings; a setting that differs is an error that says which and how to proceed;
   what ddlkit created is recorded, so that ``ddlkit compute down`` deletes only that;
2. ``compute.stage_from`` (a ``blob://`` dataset with its ``manifest.tsv``) is copied onto the
   file server by a staging job on the cluster, verified against the manifest; the job is named
   after the manifest's digest, so a later job with the same dataset finds it done and skips it;
3. the job directory goes to the Azure Files share the cluster mounts (the job's input
   directory ``JOB``), but its code snapshot (``code/`` and ``code.json``), which goes to a folder
   of its own named after its digest, ``<file_share.directory>/code/<digest>/``, once: a later job
   with the same tree finds its ``code.json`` (uploaded last) there and uploads nothing of it; the
   job's preparation step copies both into the job's output directory ``JOB``, where every rank runs: the service's ``mpirun`` (custom MPI settings, with the host
   file it provides) starts ``python -m ddlkit_mpi.rank ... -- python -m ddlkit.rank.worker job.json``
   on every rank of ``nodes x procs_per_node``, in the framework's image;
4. the handle follows the job (``GET`` at ``compute.poll_interval_s``), streams ``stdout.txt``
   from the ``stdouterr`` output directory (``listOutputFiles``, then the file's download URL),
   terminates it on cancel, and ``collect()`` downloads the ``JOB`` output directory into the
   launcher's job directory.

Secrets travel as the job's ``secrets`` (never ``environmentVariables``), which the service does
not report back. Imports no Azure SDK: the client is built on first use.
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING

import ddlkit
from ddlkit.atomic import write_text
from ddlkit.compute.containers import DEFAULT_REGISTRY, default_image, ensure_pullable
from ddlkit.interfaces import JobHandle, JobSpec, JobState, JobStatus
from ddlkit.jobdir import CANCEL_FILE, STATE_DIR
from ddlkit.options import MASTER_PORT, POSITIVE, POSITIVE_INTEGER, checked

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .batchai_client import Service

API_VERSION = "2018-05-01"
#: the id of the job's input and output directory (``$AZ_BATCHAI_INPUT_JOB``, ``$AZ_BATCHAI_OUTPUT_JOB``)
JOB_DIRECTORY_ID = "JOB"
#: the output directory Batch AI keeps the job's stdout.txt and stderr.txt in
STDOUTERR = "stdouterr"


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
class BatchAIConfig:
    # where the resources live; the credential comes from DefaultAzureCredential, never from here
    subscription_id: str = MISSING
    resource_group: str = MISSING
    workspace: str = MISSING
    # the workspace's region (when ddlkit creates it)
    location: str = "eastus"
    experiment: str = "ddlkit"
    # nodes of the job, and ranks per node (GPUs per node); the job has nodes x procs_per_node ranks
    nodes: int = checked(1, POSITIVE_INTEGER)
    procs_per_node: int = checked(1, POSITIVE_INTEGER)
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
    "standard_nc6": 1, "standard_nc12": 2, "standard_nc24": 4, "standard_nc24r": 4,
    "standard_nc6s_v2": 1, "standard_nc12s_v2": 2, "standard_nc24s_v2": 4, "standard_nc24rs_v2": 4,
    "standard_nc6s_v3": 1, "standard_nc12s_v3": 2, "standard_nc24s_v3": 4, "standard_nc24rs_v3": 4,
    "standard_nd6s": 1, "standard_nd12s": 2, "standard_nd24s": 4, "standard_nd24rs": 4,
    "standard_nd40s_v3": 8, "standard_nd40rs_v2": 8,
    "standard_nv6": 1, "standard_nv12": 2, "standard_nv24": 4,
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
                "compute.gpu=false for a CPU run.")
        if c.gpu and gpus is not None and c.procs_per_node > gpus:
            raise ddlkit.ConfigError(
                f"compute.procs_per_node={c.procs_per_node} asks for more ranks per node than "
                f"compute.cluster.vm_size={c.cluster.vm_size} has GPUs ({gpus}): one rank per GPU.")
        if not c.image:
            # refused before anything
            default_image(str(c.framework), gpu=bool(c.gpu), registry=str(c.registry), horovod=c.dist == "horovod")
        if c.cluster.scale == Scale.auto:
            most = c.cluster.max_nodes if c.cluster.max_nodes is not None else c.nodes
            if most < c.nodes or c.cluster.min_nodes < 0 or c.cluster.min_nodes > most:
                raise ddlkit.ConfigError(
                    f"compute.cluster.min_nodes={c.cluster.min_nodes}, max_nodes={c.cluster.max_nodes} do not fit a "
                    f"job of compute.nodes={c.nodes}: need 0 <= min_nodes <= max_nodes and max_nodes >= nodes.")
        if c.stage_from is not None and not str(c.stage_from).startswith("blob://"):
            raise ddlkit.ConfigError(f"compute.stage_from={c.stage_from} is not a blob:// URL: it names the dataset "
                                     "in Blob Storage that is copied onto the file server.")

    def configure(self, config: DictConfig) -> None:
        """What compute=batchai needs of the rest of the run: storage=nfs's root, local disks."""
        c, storage = self.cfg, config.storage
        mount = f"$AZ_BATCHAI_MOUNT_ROOT/{c.file_server.mount_path}"
        if storage.name == "nfs" and str(storage.root).rstrip("/") != mount:
            raise ddlkit.ConfigError(
                f"storage=nfs on compute=batchai reads and writes the file server the nodes mount at {mount}: set "
                f"storage.root='{mount}' (it is expanded on the nodes).")
        if storage.name == "local_ssd" and not vm_has_local_disk(c.cluster.vm_size):
            raise ddlkit.ConfigError(
                f"storage=local_ssd stages data onto each node's local disk, but compute.cluster.vm_size="
                f"{c.cluster.vm_size} has none (v4 and later sizes without a 'd' have no temporary disk): choose a "
                "size with one (e.g. Standard_D4ds_v4, Standard_NC24rs_v3) or use storage=nfs.")
        if c.stage_from is not None:
            root = config.data.get("root")
            if storage.name != "nfs" or not root or str(root).startswith(("/", "$")) or "://" in str(root):
                raise ddlkit.ConfigError(
                    f"compute.stage_from={c.stage_from} copies the dataset onto the file server: use storage=nfs and "
                    "a data.root relative to it, e.g. data.root=datasets/imagenet.")

    @property
    def world_size(self) -> int:
        return self.cfg.nodes * self.cfg.procs_per_node

    def service(self, *, planning: bool = False, say: Callable[[str], None] | None = None) -> Service:
        from .batchai_client import Service

        return Service(self.cfg, planning=planning, say=say)

    def plan(self, spec: JobSpec) -> str:
        service = self.service(planning=True)
        service.run_job(spec)
        return service.describe_plan()

    def submit(self, spec: JobSpec) -> JobHandle:
        service = self.service()
        # before anything is created: the nodes pull the image without credentials, so a registry that
        # has no such image, or refuses it to an anonymous pull, would fail the job once it is queued
        ensure_pullable(service.image(), say=service.say)
        name = service.run_job(spec)
        return BatchAIJob(service, name, job_dir=spec.job_dir)

    def attach(self, job_id: str, *, job_dir: Path) -> JobHandle:
        return BatchAIJob(self.service(), job_id, job_dir=Path(job_dir))

    def down(self, *, confirm: Callable[[Sequence[str]], bool]) -> list[str]:
        return self.service().down(confirm)


# ---------------------------------------------------------------------------- the handle
_STATES = {"queued": JobState.PENDING, "running": JobState.RUNNING, "terminating": JobState.RUNNING}


class BatchAIJob(JobHandle):
    """A Batch AI job; ``id`` is its name in the experiment."""

    def __init__(self, service: Service, job_id: str, *, job_dir: Path) -> None:
        self.service, self.id, self.job_dir = service, job_id, Path(job_dir)
        self.poll_interval_s = service.poll_interval_s
        self._final: JobStatus | None = None
        self._asked: tuple[float, Any] | None = None
        self._offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @property
    def cancel_requested(self) -> bool:
        return (self.job_dir / CANCEL_FILE).exists()

    def _job(self) -> Any:
        """The service's view of the job, asked again only after poll_interval_s."""
        now = time.monotonic()
        if self._asked is None or now - self._asked[0] >= self.poll_interval_s:
            self._asked = (now, self.service.get_job(self.id))
        return self._asked[1]

    def status(self) -> JobStatus:
        if self._final is not None:
            return self._final
        job = self._job()
        state = str(job.execution_state or "queued").lower()
        if state in _STATES:
            where = f" on {job.node_count} node(s)" if state == "running" else ""
            return JobStatus(_STATES[state], None, f"Batch AI: {state}{where}")
        info = job.execution_info
        code = info.exit_code if info is not None else None
        if state == "succeeded":
            self._final = JobStatus(JobState.SUCCEEDED, 0 if code is None else code)
            return self._final
        errors = "; ".join(f"{e.code}: {e.message}" for e in (info.errors or [])) if info is not None else ""
        tail = self.service.stdout_tail(self.id)
        message = (f"Batch AI job {self.id} {state}" + (f" with exit code {code}" if code is not None else "")
                   + (f" ({errors})" if errors else "") + "; last lines of its stdout.txt:\n"
                   + "\n".join("    " + ln for ln in tail))
        self._final = JobStatus(JobState.CANCELLED if self.cancel_requested else JobState.FAILED,
                                code if code is not None else 1, message)
        return self._final

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self.poll_until_done(timeout, self.poll_interval_s)

    def logs(self, follow: bool = True) -> Iterator[str]:
        """``stdout.txt`` of the job's ``stdouterr`` output directory, from where the last call stopped;
        while the job runs, one read per poll interval."""
        while True:
            finished = self.status().state.done
            data = self.service.read_stdout(self.id, self._offset)
            if data:
                self._offset += len(data)
                yield self._decoder.decode(data)
            if finished or not follow:
                if not data:  # all that was there has been read
                    return
            else:
                time.sleep(self.poll_interval_s)

    def cancel(self) -> None:
        """Terminate the job (the service stops its processes: ddlkit's ranks checkpoint on the SIGTERM
        when the service leaves them the time); the cancel is recorded in the job directory."""
        if self._final is not None or self.cancel_requested:
            return
        self._asked = None
        if self.status().state.done:
            return
        write_text(self.job_dir / CANCEL_FILE, f"{time.time()}\n")
        self.service.terminate(self.id)
        self._asked = None

    def collect(self) -> None:
        """Download the job's output directory ``JOB`` (what the ranks wrote) into the job
        directory; the launcher's own bookkeeping (``STATE_DIR``) is kept."""
        self.service.download_outputs(self.id, self.job_dir, skip=(STATE_DIR,))
