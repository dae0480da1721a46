r"""One ddlkit job is one Azure Machine Learning (v2) command job on a compute cluster of your
workspace, submitted with the real `azure-ai-ml` SDK. Going from a
laptop to eight GPU nodes is one override:

    az login                                        # or a managed identity, or AZURE_CLIENT_* variables

    ddlkit compute=azureml compute.subscription_id=S compute.resource_group=RG compute.workspace=WS \
        compute.cluster=gpu-cluster compute.nodes=4 compute.procs_per_node=4 dist=native framework=pytorch \
        model=resnet50 data=imagefolder data.root=azureml://datastores/imagenet/paths/ilsvrc/
    ddlkit plan compute=azureml ...                # the request body the SDK would send; no sign-in, no network
    ddlkit --detach compute=azureml ...            # then ddlkit jobs status|logs|attach|cancel <job>

Status: works against a loopback workspace that follows the REST API (the real `azure-ai-ml`
SDK); no live Azure service was contacted, and a real workspace has not been tried, nor a
workspace's image build.

## What it needs

- a workspace and a compute cluster (AmlCompute) in it;
- ddlkit installed from its checkout (`pip install -e`), whose `docker/Dockerfile` the workspace
  builds the image from, or a `compute.image` the cluster's nodes can pull;
- an identity with the **AzureML Data Scientist** role on the workspace (or Contributor), signed
  in where `DefaultAzureCredential` looks: the environment (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
  `AZURE_CLIENT_SECRET`), workload identity, a managed identity, or `az login`. Credentials never
  go in a config;
- for a run with secrets (a W&B key, a SAS token, the config's secret values): the workspace's key
  vault (or `compute.key_vault`) with the **Key Vault Secrets Officer** role for that identity, and
  a managed identity on the compute cluster with the **Key Vault Secrets User** role on the vault
  (see [Secrets](#secrets));
- the data on a datastore of the workspace.

## The job

What `ddlkit plan` prints, secrets as `***`:

- *code*: the job directory's own files (`job.json`, `config.yaml`, `overrides.yaml`,
  `environment.json`), uploaded by the SDK as an anonymous code asset;
- *environment*: by default ddlkit's image, **built by the workspace**, the environment
  `ddlkit-<framework>-<cuda|cpu>` (`compute.gpu=false`: `cpu`) with a build context: the files of
  this checkout that `.dockerignore` lets into a `docker build` (ddlkit, its plugins,
  `pyproject.toml`, `scripts/install_horovod.sh`: about 175 files, 1.2 MB; no README, which nothing
  installed reads, so editing the documentation builds nothing) and `docker/Dockerfile` with
  `FRAMEWORK` and `VARIANT` written in as its defaults (a build context takes no build arguments).
  Its version is the first 16 hex digits of a SHA-256 over those files and the Dockerfile. Before
  each job ddlkit asks the workspace for that version (one GET); only when there is none does it
  create it: the SDK uploads the context to the workspace's default datastore and creates the
  version with `build.contextUri`, and the workspace builds the image into its container registry
  for the first job that uses it (while the job is `Preparing`; how long that takes on Azure was
  not measured); every later job with the same files reuses it. Editing a file that goes into the
  image (a plugin's source, a `pyproject.toml`, another ddlkit version) makes a new version, built
  once more. `ddlkit plan` names the version, the build arguments and the files. With
  `compute.image=<image>` the job's environment is that image (an anonymous environment version);
  its registry is asked for it first ([Docker images](../docker.md#is-the-image-there)): one it
  does not have is refused, and one that refuses an anonymous question (a private registry: the
  workspace pulls with credentials of its own) is said on the console and the job submitted;
- **with `dist=horovod`** the ranks import Horovod from the image, so the launcher needs none
  (`ddlkit plan` and submitting work on a laptop without it): the environment is
  `ddlkit-<framework>-cpu-horovod`, the same context with `HOROVOD=1` written in as well, an
  environment and version of its own. ddlkit's recipe builds Horovod for the CPU only, so a GPU
  job with Horovod (`compute.gpu=true`, the default) must name its image,
  `compute.image=<an image with Horovod built with NCCL>`; without one it is refused in one line
  before anything is sent ([Docker images](../docker.md#horovod-on-gpus));
- `instance_count` = `compute.nodes` on `compute.cluster`, `compute.procs_per_node` processes per
  node: `PyTorchDistribution` for `framework=pytorch dist=native` (Azure ML sets `MASTER_ADDR`,
  `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `NODE_RANK`), `MpiDistribution` otherwise
  (Horovod, and TensorFlow's native backend, which builds its `TF_CONFIG` over ddlkit's control
  plane; OpenMPI gives the ranks their place and rank 0's host comes from `AZ_BATCH_MASTER_NODE`),
  none for one rank. For `dist=horovod` that is `MpiDistribution(process_count_per_instance=
  compute.procs_per_node)` with `instance_count=compute.nodes`: Azure ML's `mpirun` starts the
  `nodes x procs_per_node` Horovod ranks, which `ddlkit plan` says in a `# distribution:` line;
- an output `job_dir`, a read-write mount of `<compute.output_root>/<job name>/` on the
  workspace's default datastore: the command copies the job's files there and runs the worker
  *in it*, so what the ranks write (checkpoints, metrics, `result.json`, the model) is in the
  workspace as it is written. Each process runs the worker under ddlkit's rank minder
  (`python -m ddlkit_azure.rank -- python -m ddlkit.rank.worker job.json`), which writes the
  rank's `rank-N.log` and its exit record `.ranks/rank-N.json` there too. At the end (any end)
  `result.json`, the checkpoints, metrics, model, rank logs and exit records are downloaded into
  the local job directory, before the job is judged; a process that left no `rank-N.log` (it
  failed before its minder started) has its Azure ML log (`user_logs/std_log*.txt`) as one;
- `data.root=azureml://datastores/<name>/paths/<path>` becomes an input `data`, downloaded to the
  nodes with `storage=local_ssd` (or `compute.input_mode=download`), mounted read-only otherwise
  (`ro_mount`); the job's copy of `job.json` reads `data.root` from the input's path. A local
  `data.root` is refused (the nodes cannot see this machine); `blob://` roots are read by the
  ranks themselves ([storage=azure](../storage/azure.md));
- *your code* (when the config names code in the launch directory, e.g.
  `model.target=my_pkg.nets:build`): the job's code snapshot (`code/` and `code.json`) becomes an
  input `code`, downloaded to each node, of `<compute.code_root>/<sha256>/`. ddlkit uploads it
  there before submitting (with the datastore's own credential, as the SDK uploads a local input)
  unless that folder's `code.json` (uploaded last) is there already: an unchanged tree is uploaded
  once per workspace, a changed one is a new folder. The command puts it into the job's output
  directory beside `job.json` (each file replaced in one step, so every process of the job may do
  it at once; files an earlier run of the same job directory left there and this snapshot lacks
  are removed), where the worker puts it first on the import path. Nothing names a path of the
  launcher's; `ddlkit plan` names the folder;
- environment variables: the job's (plugin switches, `AZURE_STORAGE_ACCOUNT_URL`), where its
  secrets are (`DDLKIT_AZURE_KEY_VAULT`, `DDLKIT_AZURE_SECRETS`: the vault and the secrets' names,
  no value) and `PYTHONUNBUFFERED=1` so the log streams; with secrets, `identity: Managed` (the job
  runs as the cluster's managed identity).

## Secrets

A job's definition is readable by anyone who may read the workspace's jobs (Reader and up), so a
run's secrets (a W&B key, a SAS token, the config's secret values) are not in it. Before it creates
the job, ddlkit puts each secret variable into an **Azure Key Vault** as a secret of its own: the
workspace's own vault (the workspace's `properties.keyVault`), or `compute.key_vault=
https://<name>.vault.azure.net`. Each is named for the job (`<Azure ML job name>-<n>-<VARIABLE>`,
dashes for other characters), tagged `ddlkit_job=<Azure ML job name>` and `variable=<VARIABLE>`, and
expires 7 days later, so a job that is never collected leaves nothing readable for ever. The job's
environment carries only the vault's URL (`DDLKIT_AZURE_KEY_VAULT`) and the variable -> secret
name map (`DDLKIT_AZURE_SECRETS`), and the job runs as the compute cluster's managed identity
(`identity: Managed`). Each process of the job (`ddlkit_azure.rank`) reads the secrets with that
identity (`DefaultAzureCredential`: Azure ML's managed identity endpoint; a user-assigned identity is
the one Azure ML names in `DEFAULT_IDENTITY_CLIENT_ID`) and gives them to the worker's environment
only. When the job has ended and its output is collected, ddlkit deletes them (best effort: a vault
that refuses is one warning line, and they expire anyway). `ddlkit plan` says where they will go,
values as `***`.

What this needs:

- the identity that submits: **Key Vault Secrets Officer** on the vault (to set and delete
  secrets); a refusal is one line naming the role, exit status 2, before the job is created;
- the compute cluster: a managed identity (system- or user-assigned) with **Key Vault Secrets
  User** on the vault (`az role assignment create --role "Key Vault Secrets User" --assignee
  <the identity's principal id> --scope <the vault's id>`). A vault that refuses it, or a secret
  that is not there, is one line in each rank's log naming the vault, the secret and that role,
  and the rank exits 2 (a config error: the job is not restarted).

What a Reader of the workspace still sees: the job's variables name the vault and the secrets
(names such as `ddlkit-<job>-0-AZURE-STORAGE-SAS-TOKEN`), never a value; reading a value needs a
role on the vault. The vault's deletes are soft deletes (every vault keeps a deleted secret for its
retention period, recoverable by those with the vault's recover permission, not readable as it
is). No file, log, console output or other request of ddlkit's holds a value (a test checks every
file, the console, the job's definition the workspace keeps and every request Azure ML got).
## Following a job

ddlkit looks at the job once per `compute.poll_interval_s`: one run history call (state, error,
log files), plus one ranged read of rank 0's log while it streams (`user_logs/std_log.txt`, or
`std_log_process_0.txt` for several processes, zero-padded to the width of their count as Azure
ML names them: `std_log_process_00.txt` of 10 or more), from where the last read stopped (a
server that ignores `Range` and answers with the whole file has the bytes already read skipped,
so each line is printed once). `ddlkit jobs status|logs|attach|cancel` work from any shell.

Ctrl-C cancels the job: Azure ML stops its processes; where they get SIGTERM first (as in the
loopback workspace) the ranks checkpoint, the job ends `Canceled` and the resume command is
printed. How long Azure ML waits before killing them was not measured.

Azure ML's states map as NotStarted/Queued/Preparing/Starting/Provisioning -> pending,
Running/Finalizing -> running, Completed -> succeeded, Failed -> failed, Canceled -> cancelled;
CancelRequested counts as running until the job is Canceled (its ranks are checkpointing), so the
job's files are collected after they stopped. How a job ended is ddlkit's one rule
([Failures, restarts and elastic jobs](../failures.md)), from the ranks' exit records in its
output: the rank that failed first gives the job its exit status and its log's last lines (Azure
ML's own exit status, of whichever process it lists first, and its error stay in the message);
ranks that checkpointed on a cancel end it with exit status 75, resumable; without records,
Azure ML's exit status and the last lines of rank 0's log are all there is. The output is
downloaded once the job's record (another service than run history, and the one the SDK's
download reads) also says the job ended: it may lag by seconds, so ddlkit waits up to 120 s,
saying so, and otherwise ends with a one-line error that the output stays in the workspace
(`ddlkit jobs attach <job dir>` downloads it later).

## Spot and low priority

With `compute.spot=true` (`queue_settings.job_tier=Spot`; on a low-priority cluster every job is
preemptible anyway), Azure ML queues a preempted job again under the same name (as its
documentation says; reproduced by the loopback workspace, not seen on Azure), and it resumes from
its last checkpoint, which lives in its output; a sweep sees one job that ran a little longer. An
eviction may not give the ranks time to checkpoint, so set `trainer.checkpoint_every` to what you
can afford to lose. Running the same command again (`hydra.run.dir=` the same job directory)
submits a new Azure ML job on the same output, and it resumes too. These re-runs happen inside
one Azure ML job, so `ddlkit jobs status` does not list them as restarts.

## Errors

One line, exit status 2: a missing `subscription_id`/`resource_group`/`workspace`/`cluster`
(named), a local `data.root`, no credential (the ways to sign in), 403 (the role to ask for), a
subscription, resource group or workspace that does not exist (told apart by ARM's error code and
what was asked for; a 404 of anything else is the service's own message), an unknown cluster
(lists the workspace's computes), more nodes than the cluster's maximum, a `compute.image` its
registry does not have (with the fix: push it, or another image), ddlkit installed without its
checkout and no `compute.image` (the fix: `pip install -e`, or an image), the SDK refusing the
job. Composing a run (`ddlkit --cfg job compute=azureml ...`) never imports the SDK (it takes
about 3 s to import); `ddlkit plan` imports it but signs in nowhere. Submission time and the
requests made while following a job are measured by `benchmarks/azureml.py`
([Performance](../../explanation/performance.md#azure-ml-and-batch-ai)).

A connection Azure ML refuses or closes without an answer, or that times out, is retried by the
SDK's retry policy (azure-core's, as a 429 or 503 is: three more tries, about 5 s of back-off), then
one line, exit status 2, naming the endpoint and what to check (`no answer from Azure ML at HOST
(the connection was closed with no response), retried and given up: check the network to HOST ...`);
a look at a job (`ddlkit jobs status`, a followed run) adds that the job runs on and
`ddlkit jobs attach <job dir>` follows it again, and `ddlkit jobs list` shows such a job's state
as unknown (`running?`) among the others. The log's reads are retried the same way; reads that
give up end the following, not the run: it says so (the job runs on, `ddlkit jobs attach` follows
its log again), waits for the job's end and judges it as any other. A cancel waits up to 60 s for
Azure ML's cancel operation: one that fails is one line (the job may still run, and how to follow
it), one not finished by then is said before the cancel waits on the job's state. An Azure CLI
sign-in that has expired is named as such (the CLI's `AADSTS` code and words) with `az login`, not
as "no credential found".

## How it is tested

The real `azure-ai-ml` and `azure-keyvault-secrets` SDKs and the real `ddlkit` CLI run against a
loopback Azure ML workspace
(`ddlkit_azure.testing.azureml`): an HTTPS server on 127.0.0.1 (self-signed certificate, trusted
through `REQUESTS_CA_BUNDLE`) that follows the REST API the SDK uses (job PUT/GET/cancel,
computes, datastores, code and environment versions with the code's and the build context's real
uploads, run history's details, log files and run data), its key vault
(`ddlkit_azure.testing.keyvault`: secrets set, read, deleted, with Key Vault's challenge
authentication, at `https://<vault>.vault.azure.net` through the proxy below) and Azure ML's managed
identity endpoint for a job run with `identity: Managed`, signed in through
`DefaultAzureCredential` by a stand-in `az` on `PATH`, with the workspace's storage in Azurite
(the SDK's `https://<account>.blob.core.windows.net` reaches it through a loopback CONNECT proxy
that refuses any other host than these two). The jobs' processes get the proxy and the loopback
certificate too, as a node's network and trust store. The key vault reads tokens' `oid` (not their
signature): the launcher's identity and the cluster's are told apart, so a vault that refuses the
job's identity is tested end to end. The workspace runs each job on this machine (the machine's `python`
stands in for the image, which is recorded in the request and asserted; an environment with a
build context is "built" by the first job that uses it: its context fetched from Azurite and its
Dockerfile checked) through Azure ML's states, `MpiDistribution` under the real `mpirun`,
`PyTorchDistribution` as a process per rank, cancel and preemption. The tests check the
environment's request and its uploaded context file by file (the Dockerfile's arguments
included), that a second job creates and uploads nothing (the context's blobs keep their ETags),
that a changed file makes a new version and a file `.dockerignore` leaves out does not, and a
`compute.image` asked of a loopback registry (`ddlkit.testing.registry`) before the job. A package
that exists only in the launch directory trains through it, reaching the job as the uploaded
snapshot (its blobs and the job's directory checked on the workspace's side); a second submission
of the same tree uploads nothing of it (every blob keeps its ETag), a changed tree is a new
snapshot, uploaded and run. A run's SAS token reaches its rank through the key vault (the results
are published with it) and is in no request Azure ML got, not in the job's definition it keeps, no
file and no console output; the vault's secret is tagged, expires in 7 days and is deleted once the
job is collected.

## How it works

The request is built in `ddlkit_azure._azureml`, the environment in `ddlkit_azure._environment`
(`WorkspaceBuild`); the SDK is imported only when a job is planned, submitted or followed, never
when a run is composed. The job's copy of `job.json` reads `data.root` from the input's path
through `DDLKIT_DATA_ROOT`; under `MpiDistribution` the command takes `MASTER_ADDR` from
`AZ_BATCH_MASTER_NODE` / `AZ_BATCHAI_MPI_MASTER_NODE` and the ranks read OpenMPI's
`OMPI_COMM_WORLD_*`, which `ddlkit_azure.rank` (the rank minder's entry) turns into ddlkit's node
layout, and reads the job's secrets from its key vault (`ddlkit_azure.keyvault`). A job is
followed by the core's `SchedulerJob` over `ddlkit_azure._azureml.AzureMLScheduler`, which says
what Azure ML sees, downloads the output and then deletes the job's secrets. The code snapshot is
`ddlkit.compute.snapshot`'s.
"""

from __future__ import annotations

import enum
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING, DictConfig, OmegaConf

import ddlkit
from ddlkit.compute.gang import GangConfig
from ddlkit.compute.scheduler import SchedulerJob
from ddlkit.jobdir import RANKS_DIR
from ddlkit.options import POSITIVE, POSITIVE_INTEGER, Rule, checked

if TYPE_CHECKING:
    from ._azureml import Workspace

#: the keys that name the workspace and the cluster: required
REQUIRED = {
    "subscription_id": "the workspace's Azure subscription id",
    "resource_group": "its resource group",
    "workspace": "the Azure ML workspace's name",
    "cluster": "the compute cluster that runs the job",
}
_DATASTORE_URI = re.compile(r"^azureml://")
#: a path on a datastore of the workspace, in its short form: (datastore, path)
DATASTORE_PATH = re.compile(r"^azureml://datastores/(?P<datastore>[^/]+)/paths/(?P<path>[^?#]*)$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_VAULT_URL = re.compile(r"^https://[A-Za-z0-9-]+\.vault\.[A-Za-z0-9.-]+/?$")
#: seconds after a cancel before it is sent again (Azure ML stops the processes, then kills them itself)
CANCEL_AGAIN_S = 60.0


class InputMode(enum.StrEnum):
    #: download with storage=local_ssd (data staged to the nodes' disks), a read-only mount otherwise
    auto = "auto"
    download = "download"
    ro_mount = "ro_mount"


@dataclass
class AzureMLConfig(GangConfig):
    # the workspace: its subscription id, resource group and name (required)
    subscription_id: str = MISSING
    resource_group: str = MISSING
    workspace: str = MISSING
    # the compute cluster (AmlCompute) that runs the job (required)
    cluster: str = MISSING
    # nodes of the cluster (instance_count); the job has nodes x procs_per_node ranks
    nodes: int = checked(1, POSITIVE_INTEGER)
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
    # how an azureml:// data.root reaches the job: download, ro_mount, or auto (download with
    # storage=local_ssd, else ro_mount)
    input_mode: InputMode = InputMode.auto
    # where the jobs' directories live in the workspace: <output_root>/<job name>/
    output_root: str = "azureml://datastores/workspaceblobstore/paths/ddlkit"
    # where code snapshots of the launch directory are kept, one per content digest: <code_root>/<digest>/
    # (a blob datastore; an unchanged tree is uploaded once)
    code_root: str = "azureml://datastores/workspaceblobstore/paths/ddlkit-code"
    # the Key Vault that takes the job's secrets, https://<name>.vault.azure.net; null: the workspace's own
    key_vault: str | None = None
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
                raise ddlkit.ConfigError(
                    f"compute=azureml needs compute.{key} ({what}): set it, e.g. compute.{key}=<{key}>."
                )
        root = cfg.data_root
        if root and not _URL.match(str(root)):
            raise ddlkit.ConfigError(
                f"data.root={root} is a path on this machine, which compute=azureml's nodes cannot see: put the data "
                "on a datastore of the workspace and give its URI, e.g. "
                "data.root=azureml://datastores/<datastore>/paths/<path>/ (or a blob:// URL with storage=azure)."
            )
        if not _DATASTORE_URI.match(str(cfg.output_root)):
            raise ddlkit.ConfigError(
                f"compute.output_root={cfg.output_root} must be a datastore URI, e.g. "
                "azureml://datastores/workspaceblobstore/paths/ddlkit."
            )
        code_root = DATASTORE_PATH.match(str(cfg.code_root))
        if code_root is None:
            raise ddlkit.ConfigError(
                f"compute.code_root={cfg.code_root} must be a datastore URI of the form "
                "azureml://datastores/<datastore>/paths/<path>, e.g. "
                "azureml://datastores/workspaceblobstore/paths/ddlkit-code."
            )
        if cfg.key_vault and not _VAULT_URL.match(str(cfg.key_vault)):
            raise ddlkit.ConfigError(
                f"compute.key_vault={cfg.key_vault} must be a vault's URL, e.g. https://<name>.vault.azure.net."
            )
        if self.horovod and cfg.gpu and not cfg.image:
            raise ddlkit.ConfigError(
                "compute=azureml with dist=horovod and compute.gpu=true needs a CUDA image with Horovod built with "
                "NCCL, which ddlkit's docker/Dockerfile does not build (its Horovod is CPU-only; docs/how-to/docker.md "
                "says which base image to build one on): set compute.image to such an image, or "
                "compute.gpu=false (ddlkit's CPU image with Horovod), or use dist=native."
            )
        #: where code snapshots are kept: a datastore, and a path in it
        self.code_datastore, self.code_path = code_root["datastore"], code_root["path"].strip("/")
        self.status_interval_s = float(cfg.poll_interval_s)
        self._workspace: Workspace | None = None

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
    def submit(self, spec: ddlkit.JobSpec) -> SchedulerJob:
        shutil.rmtree(spec.job_dir / RANKS_DIR, ignore_errors=True)  # an earlier run's records are not this job's
        return self.attach(self.workspace.submit(self, spec), job_dir=spec.job_dir, secrets=spec.secret_env)

    def attach(self, job_id: str, *, job_dir: Path, secrets: Mapping[str, str] | None = None) -> SchedulerJob:
        from ._azureml import AzureMLScheduler

        scheduler = AzureMLScheduler(
            self.workspace, poll_interval_s=self.cfg.poll_interval_s, secrets=secrets, job_dir=Path(job_dir)
        )
        return SchedulerJob(
            scheduler,
            str(job_id),
            job_dir=Path(job_dir),
            world_size=self.world_size,
            poll_interval_s=self.cfg.poll_interval_s,
            grace_period_s=CANCEL_AGAIN_S,
        )

    def plan(self, spec: ddlkit.JobSpec) -> str:
        from ._azureml import plan

        return plan(self, spec)
