"""``compute=azureml``: one ddlkit job = one Azure Machine Learning (v2) command job on a compute cluster.

What a job is there (the request ``ddlkit plan compute=azureml ...`` prints):

* **code**: the job directory's own files (``job.json`` and the config copies), uploaded by the
  SDK to the workspace's default datastore as an anonymous code asset;
* **the researcher's code**, when the job ships a snapshot of the launch directory (``code/`` and
  ``code.json``, :mod:`ddlkit.compute.snapshot`): an input ``code``, downloaded to each node, of
  ``<compute.code_root>/<digest>/`` -- uploaded there by ddlkit unless that digest's ``code.json``
  (written last) is there already, so an unchanged tree is uploaded once per workspace, not with
  every job. The command puts it into the job's directory (``code/`` beside ``job.json``), where
  the worker finds it;
* **environment**: by default ``ddlkit-<framework>-<cpu|cuda>``, built by the workspace from
  ddlkit's ``docker/Dockerfile`` and this checkout, versioned by the build context's digest: created
  (the context uploaded) by the first job that finds no such version, reused by every later one
  (:mod:`ddlkit_azure._environment`); with ``dist=horovod`` ``ddlkit-<framework>-cpu-horovod``, the
  image with Horovod built in (``HOROVOD=1``), which the ranks import it from; or ``compute.image``,
  once its registry was asked for it;
* **resources**: ``instance_count = compute.nodes`` on ``compute.cluster``; the **distribution**
  starts ``compute.procs_per_node`` processes per node: ``PyTorchDistribution`` for
  ``framework=pytorch dist=native`` (Azure ML sets ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``NODE_RANK``), ``MpiDistribution`` otherwise (Horovod, and
  TensorFlow's native backend, which builds its ``TF_CONFIG`` over ddlkit's control plane; the
  ranks read OpenMPI's ``OMPI_COMM_WORLD_*`` and the command takes ``MASTER_ADDR`` from
  ``AZ_BATCH_MASTER_NODE`` / ``AZ_BATCHAI_MPI_MASTER_NODE``); none for a single rank;
* **an output** ``job_dir``: a read-write mount of ``<compute.output_root>/<job name>/``. The
  command copies the job's files there and runs ``spec.command("python")`` *in it*, so what the
  ranks write -- checkpoints, metrics, logs, ``result.json``, the model -- lands in the workspace
  as it is written: a preempted job that Azure ML queues again resumes from its last checkpoint,
  and so does a later run of the same job directory (the same name, the same output);
* **an input** ``data`` when ``data.root`` is an ``azureml://`` URI (``download`` with
  ``storage=local_ssd``, a read-only mount otherwise); the job's copy of ``job.json`` reads
  ``data.root`` from the input's path (``DDLKIT_DATA_ROOT``). A local path is refused: the nodes
  cannot see this machine's disk;
* **environment variables**: ``spec.env`` and ``spec.secret_env``. Azure ML has no secret field
  for a command job: the secrets are environment variables of the job, kept in its definition in
  the workspace (readable by whoever may read the workspace's jobs); ddlkit shows them as ``***``
  in ``ddlkit plan`` and keeps them out of every file and log it writes. See the README.

Credentials come from ``DefaultAzureCredential`` (environment, workload identity, managed
identity, ``az login``), never from the config. The SDK is imported only when a job is planned,
submitted or followed (:mod:`ddlkit_azure._azureml`), never when a run is composed.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING, DictConfig, OmegaConf

import ddlkit
from ddlkit.options import POSITIVE, POSITIVE_INTEGER, Rule, checked

if TYPE_CHECKING:
    from ._azureml import AzureMLJob, Workspace

#: the keys that name the workspace and the cluster: required
REQUIRED = {"subscription_id": "the workspace's Azure subscription id", "resource_group": "its resource group",
            "workspace": "the Azure ML workspace's name", "cluster": "the compute cluster that runs the job"}
_DATASTORE_URI = re.compile(r"^azureml://")
#: a path on a datastore of the workspace, in its short form: (datastore, path)
DATASTORE_PATH = re.compile(r"^azureml://datastores/(?P<datastore>[^/]+)/paths/(?P<path>[^?#]*)$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class InputMode(enum.StrEnum):
    #: download with storage=local_ssd (data staged to the nodes' disks), a read-only mount otherwise
    auto = "auto"
    download = "download"
    ro_mount = "ro_mount"


@dataclass
class AzureMLConfig:
    # the workspace: its subscription id, resource group and name (required)
    subscription_id: str = MISSING
    resource_group: str = MISSING
    workspace: str = MISSING
    # the compute cluster (AmlCompute) that runs the job (required)
    cluster: str = MISSING
    # nodes of the cluster (instance_count) and ranks per node; the job has nodes x procs_per_node ranks
    nodes: int = checked(1, POSITIVE_INTEGER)
    procs_per_node: int = checked(1, POSITIVE_INTEGER)
    # the job's Docker image; null: ddlkit's image for the framework, built by the workspace from
    # ddlkit's docker/Dockerfile (environment ddlkit-<framework>-<cpu|cuda>, once per content; with
    # dist=horovod ddlkit-<framework>-cpu-horovod, Horovod built in: CPU only, a GPU job names its image)
    image: str | None = None
    # with image=null: the CUDA variant of ddlkit's image (true) or the CPU one (false)
    gpu: bool = True
    # the Azure ML experiment the jobs are grouped under
    experiment: str = "ddlkit"
    # queue the job on spot (low-priority) capacity: cheaper, may be preempted; a preempted job is
    # queued again by Azure ML and resumes from its last checkpoint
    spot: bool = False
    # how an azureml:// data.root reaches the job: auto, download or ro_mount
    input_mode: InputMode = InputMode.auto
    # where the jobs' directories live in the workspace: <output_root>/<job name>/
    output_root: str = "azureml://datastores/workspaceblobstore/paths/ddlkit"
    # where code snapshots of the launch directory are kept, one per content digest: <code_root>/<digest>/
    # (a blob datastore; an unchanged tree is uploaded once)
    code_root: str = "azureml://datastores/workspaceblobstore/paths/ddlkit-code"
    # rank 0's rendezvous port for MPI jobs (ddlkit's control plane uses the next one)
    master_port: int = checked(29500, Rule(lambda v: 0 < v < 65535, "a port below 65535"))
    # seconds between looks at the job (its state, its log); each look is one or two REST calls
    poll_interval_s: float = checked(30.0, POSITIVE)
    # taken from the rest of the run's config (do not set): what picks the distribution, the
    # image and the data input
    framework: str = "${framework.name}"
    dist: str = "${dist.backend}"
    data_root: str | None = "${oc.select:data.root,null}"
    storage: str = "${storage.name}"


class AzureMLTarget(ddlkit.ComputeTarget):
    """``compute=azureml``: a command job of ``nodes`` x ``procs_per_node`` ranks."""

    cfg: AzureMLConfig
    # the ranks run in the job's output on the workspace's storage, not in the launcher's directory
    shares_job_dir = False

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        for key, what in REQUIRED.items():
            if isinstance(cfg, DictConfig) and OmegaConf.is_missing(cfg, key) or not getattr(cfg, key, None):
                raise ddlkit.ConfigError(f"compute=azureml needs compute.{key} ({what}): set it, e.g. "
                                         f"compute.{key}=<{key}>.")
        root = cfg.data_root
        if root and not _URL.match(str(root)):
            raise ddlkit.ConfigError(
                f"data.root={root} is a path on this machine, which compute=azureml's nodes cannot see: put the data "
                "on a datastore of the workspace and give its URI, e.g. "
                "data.root=azureml://datastores/<datastore>/paths/<path>/ (or a blob:// URL with storage=azure).")
        if not _DATASTORE_URI.match(str(cfg.output_root)):
            raise ddlkit.ConfigError(f"compute.output_root={cfg.output_root} must be a datastore URI, e.g. "
                                     "azureml://datastores/workspaceblobstore/paths/ddlkit.")
        code_root = DATASTORE_PATH.match(str(cfg.code_root))
        if code_root is None:
            raise ddlkit.ConfigError(f"compute.code_root={cfg.code_root} must be a datastore URI of the form "
                                     "azureml://datastores/<datastore>/paths/<path>, e.g. "
                                     "azureml://datastores/workspaceblobstore/paths/ddlkit-code.")
        if self.horovod and cfg.gpu and not cfg.image:
            raise ddlkit.ConfigError(
                "compute=azureml with dist=horovod and compute.gpu=true needs a CUDA image with Horovod built with "
                "NCCL, which ddlkit's docker/Dockerfile does not build (its Horovod is CPU-only; README, 'Docker "
                "images', says which base image to build one on): set compute.image to such an image, or "
                "compute.gpu=false (ddlkit's CPU image with Horovod), or use dist=native.")
        #: where code snapshots are kept: a datastore, and a path in it
        self.code_datastore, self.code_path = code_root["datastore"], code_root["path"].strip("/")
        self.status_interval_s = float(cfg.poll_interval_s)
        self._workspace: Workspace | None = None

    @property
    def world_size(self) -> int:
        return self.cfg.nodes * self.cfg.procs_per_node

    @property
    def horovod(self) -> bool:
        """dist=horovod: the ranks import Horovod from the job's image (the launcher needs none)."""
        return self.cfg.dist == "horovod"

    @property
    def input_mode(self) -> str:
        mode = self.cfg.input_mode
        if mode == InputMode.auto:
            return "download" if self.cfg.storage == "local_ssd" else "ro_mount"
        return str(mode)

    @property
    def data_input(self) -> str | None:
        """``data.root`` when it is a datastore URI: the job's ``data`` input."""
        root = self.cfg.data_root
        return str(root) if root and _DATASTORE_URI.match(str(root)) else None

    def snapshot_uri(self, digest: str) -> str:
        """Where the code snapshot with ``digest`` is kept: ``<compute.code_root>/<digest>/``."""
        return f"{str(self.cfg.code_root).rstrip('/')}/{digest}/"

    def snapshot_path(self, digest: str) -> str:
        """:meth:`snapshot_uri`'s path in :attr:`code_datastore`."""
        return f"{self.code_path}/{digest}".lstrip("/")

    @property
    def workspace(self) -> Workspace:
        """The workspace's client (built on first use: imports the SDK)."""
        if self._workspace is None:
            from ._azureml import Workspace

            self._workspace = Workspace(self.cfg)
        return self._workspace

    # ------------------------------------------------------------ ComputeTarget
    def submit(self, spec: ddlkit.JobSpec) -> AzureMLJob:
        return self.workspace.submit(self, spec)

    def attach(self, job_id: str, *, job_dir: Path) -> AzureMLJob:
        from ._azureml import AzureMLJob

        return AzureMLJob(self.workspace, str(job_id), job_dir=Path(job_dir), poll_interval_s=self.cfg.poll_interval_s)

    def plan(self, spec: ddlkit.JobSpec) -> str:
        from ._azureml import plan

        return plan(self, spec)
