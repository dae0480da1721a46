"""Everything that touches ``azure-ai-ml`` for ``compute=azureml`` (imported when a job is planned,
submitted or followed; never when a run is composed).

SDK errors become the errors ddlkit acts on, scrubbed of the job's secrets: no credential, a
refused role (403), a missing subscription, resource group, workspace or cluster, an SDK
validation error -> ``ConfigError`` (one line, exit status 2). A 404 is told apart by what was
asked for and ARM's error code, not by the words of its message.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from azure.ai.ml import (
    Input,
    MLClient,
    MpiDistribution,
    Output,
    PyTorchDistribution,
    command,
)
from azure.ai.ml.entities import Environment, ManagedIdentityConfiguration
from azure.ai.ml.exceptions import JobException, MlException
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

import ddlkit
from ddlkit.atomic import replace_text
from ddlkit.compute.containers import horovod_image_note
from ddlkit.compute.layout import LOCAL_SIZE_ENV, NODE_ENV
from ddlkit.compute.outcome import Observation
from ddlkit.compute.scheduler import Scheduler
from ddlkit.interfaces import JobSpec, JobState
from ddlkit.jobdir import (
    CODE_DIR,
    CODE_FILE,
    CONFIG_FILE,
    ENVIRONMENT_FILE,
    EXIT_FAILED,
    JOB_FILE,
    OVERRIDES_FILE,
    STATE_DIR,
    TELEMETRY_FILE,
    rank_log,
)
from ddlkit.redact import REDACTED, redact_text, scrub

from . import keyvault
from ._environment import job_environment, workspace_build
from .arm import (
    endpoint_of,
    error_code,
    management_credential,
    missing_scope,
    network_reason,
    no_credential,
    unreachable,
)
from .ranged import LogUnreadable, RangedLog, bytes_from, follow_paced, get_with_retries, range_header

if TYPE_CHECKING:
    from .azureml import AzureMLConfig, AzureMLTarget

# the SDK reports uploads, downloads and experimental classes on INFO/WARNING loggers, which
# Hydra's logging setup would print among the job's output
for _name in ("azure.ai.ml", "azure.core.pipeline.policies.http_logging_policy", "azure.identity"):
    logging.getLogger(_name).setLevel(logging.ERROR)

#: the job directory's files the launcher writes: the job's code (what the command copies into its output)
LAUNCHER_FILES = (JOB_FILE, CONFIG_FILE, OVERRIDES_FILE, ENVIRONMENT_FILE)
#: the job's output that holds its directory
OUTPUT = "job_dir"
#: the job's input that holds the data (when data.root is a datastore URI)
DATA_INPUT = "data"
#: the job's input that holds its code snapshot (``code/`` and ``code.json``, as in the job directory)
CODE_INPUT = "code"
#: files of a code snapshot uploaded at once
UPLOAD_WORKERS = 8
#: in the name of a file a process of the job is still writing (never part of a snapshot's files)
PARTIAL = ".ddlkit-partial"
#: what every process of the job runs, the worker under it (:mod:`ddlkit_azure.rank`)
RANK_ENTRY = "ddlkit_azure.rank"
#: where the job's copy of job.json reads data.root from (the input's path on the node)
DATA_ROOT_ENV = "DDLKIT_DATA_ROOT"
#: Azure ML's job states (run history's) -> ddlkit's
STATES = {
    **dict.fromkeys(("NotStarted", "Queued", "Preparing", "Starting", "Provisioning", "Paused"), JobState.PENDING),
    **dict.fromkeys(("Running", "Finalizing", "NotResponding"), JobState.RUNNING),
    "Completed": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    **dict.fromkeys(("Canceled", "CancelRequested"), JobState.CANCELLED),
}
TERMINAL = ("Completed", "Failed", "Canceled")
#: each process's log among the run's log files: ``user_logs/std_log.txt`` of one process,
#: ``std_log_process_<rank>.txt`` of several, the rank zero-padded to the width of the process count
#: (``std_log_process_00.txt`` of 10 or more), as the SDK's own log streaming takes them
#: (azure.ai.ml's ``user_logs/std_log[\D]*[0]*(?:_ps)?\.txt`` for rank 0)
_RANK_LOG = re.compile(r"^user_logs/std_log(?:_process_(\d+))?\.txt$")
_EXIT = re.compile(r"exited with (?:status )?code (-?\d+)")
#: where a job's output is: its datastore and path (``azureml://datastores/<name>/paths/<path>``, or
#: the same below the workspace's ARM id, as Azure ML may give it back)
_OUTPUT_PATH = re.compile(r"datastores/(?P<datastore>[^/]+)/paths/(?P<path>[^?#]*)$")
#: ARM's codes for a resource that does not exist, or whose parent does not
_NOT_FOUND_CODES = ("ResourceNotFound", "ParentResourceNotFound")
#: how long collect waits, once run history says the job ended, for the job's record (a separate
#: service, read by jobs.download, which refuses a job it says is still running) to say so too
SETTLE_S = 120.0
#: how long a cancel waits for Azure ML's cancel operation (a long-running operation) to finish
CANCEL_WAIT_S = 60.0
_ARM = "https://management.azure.com"


# ---------------------------------------------------------------------------- the job definition
def job_command(target: AzureMLTarget, spec: JobSpec, files: list[str]) -> str:
    """What every process of the job runs (bash, in the code directory): the job's files into its
    output, then ``spec.command("python")`` there."""
    copy = " ".join(shlex.quote(f) for f in files)
    lines = [
        "set -e",
        f'out="${{{{outputs.{OUTPUT}}}}}"',
        'mkdir -p "$out"',
        # every process of the job does this, into the same directory: each file is replaced in
        # one step, so no process reads a file another is writing
        f'for f in {copy}; do cp "$f" "$out/.$f.$(hostname).$$" && mv -f "$out/.$f.$(hostname).$$" "$out/$f"; done',
    ]
    if spec.code_digest:
        lines += place_snapshot()
    lines.append('cd "$out"')
    if target.data_input:
        lines.append(f'export {DATA_ROOT_ENV}="${{{{inputs.{DATA_INPUT}}}}}"')
    kind = distribution_kind(target)
    if kind == "mpi":
        # OpenMPI gives each rank its place; rank 0's host comes from Azure ML (several nodes: "ip:port")
        lines += [
            'MASTER_ADDR="${AZ_BATCH_MASTER_NODE%%:*}"',
            'export MASTER_ADDR="${MASTER_ADDR:-${AZ_BATCHAI_MPI_MASTER_NODE:-127.0.0.1}}"',
            f"export MASTER_PORT={int(target.cfg.master_port)}",
        ]
    elif kind == "pytorch":
        # Azure ML sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and NODE_RANK
        lines.append(f'export {LOCAL_SIZE_ENV}={int(target.cfg.procs_per_node)} {NODE_ENV}="${{NODE_RANK:-0}}"')
    # each process under ddlkit's rank minder: its log, its exit record, the service's SIGTERM passed on
    lines.append("exec " + shlex.join(["python", "-m", RANK_ENTRY, "--", *spec.command("python")]))
    return "\n".join(lines)


def place_snapshot() -> list[str]:
    """The command's lines that put the code snapshot (the ``code`` input) into the job's directory,
    so that the worker finds ``code/`` beside ``job.json``. Every process of the job runs them, into
    the same directory: each file is replaced in one step (no process imports a file another is
    writing); files an earlier run of the job directory left there that this snapshot does not have
    are removed; ``code.json`` comes last, and once it matches, a process (a later one, or the job
    queued again after a preemption) has nothing to do."""
    # $0: the job's directory; the arguments: the snapshot's files, relative to its input
    put = (
        f'for f; do d="$0/${{f%/*}}"; t="$d/.${{f##*/}}{PARTIAL}.$(hostname).$$"; '
        'mkdir -p "$d" && cp "$f" "$t" && mv -f "$t" "$0/$f" || exit 1; done'
    )
    # $0: the snapshot; the arguments: the files in the job's directory
    drop = 'for f; do [ -e "$0/$f" ] || rm -f "$f"; done'
    partial = f'"$out/.{CODE_FILE}{PARTIAL}.$(hostname).$$"'
    return [
        f'code="${{{{inputs.{CODE_INPUT}}}}}"',
        f'if ! cmp -s "$code/{CODE_FILE}" "$out/{CODE_FILE}"; then',
        f'  (cd "$code" && find {CODE_DIR} -type f -exec sh -c {shlex.quote(put)} "$out" {{}} +)',
        f'  (cd "$out" && find {CODE_DIR} -type f ! -name "*{PARTIAL}*" '
        f'-exec sh -c {shlex.quote(drop)} "$code" {{}} +)',
        f'  cp "$code/{CODE_FILE}" {partial} && mv -f {partial} "$out/{CODE_FILE}"',
        "fi",
    ]


def distribution_kind(target: AzureMLTarget) -> str | None:
    if target.world_size == 1:
        return None
    if target.cfg.framework == "pytorch" and target.cfg.dist in ("native", "fsdp"):
        return "pytorch"
    return "mpi"


def azureml_job_name(spec: JobSpec) -> str:
    """Unique in the workspace (a job directory run again is a new Azure ML job, in the same output)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"ddlkit-{spec.name}")[:240] + f"-{uuid.uuid4().hex[:6]}"


def build_job(
    target: AzureMLTarget,
    spec: JobSpec,
    *,
    code: str,
    files: list[str],
    name: str,
    environment: Any,
    environment_variables: Mapping[str, str],
    managed_identity: bool = False,
) -> Any:
    """The command job; ``environment``: an ``Environment`` or an ``azureml:<name>:<version>`` reference;
    ``managed_identity``: the job runs as the compute cluster's managed identity (it reads its
    secrets from Key Vault with it)."""
    cfg = target.cfg
    kind = distribution_kind(target)
    distribution = (
        PyTorchDistribution(process_count_per_instance=cfg.procs_per_node)
        if kind == "pytorch"
        else MpiDistribution(process_count_per_instance=cfg.procs_per_node)
        if kind == "mpi"
        else None
    )
    inputs = (
        {DATA_INPUT: Input(type="uri_folder", path=target.data_input, mode=target.input_mode)}
        if target.data_input
        else {}
    )
    if spec.code_digest:
        # downloaded: each node's processes read it from the node's own disk
        inputs[CODE_INPUT] = Input(type="uri_folder", path=target.snapshot_uri(spec.code_digest), mode="download")
    output_dir = f"{str(cfg.output_root).rstrip('/')}/{spec.name}/"
    outputs = {OUTPUT: Output(type="uri_folder", mode="rw_mount", path=output_dir)}
    return command(
        name=name,
        display_name=spec.name,
        experiment_name=cfg.experiment,
        tags={"ddlkit_job": spec.name},
        code=code,
        command=job_command(target, spec, files),
        environment=environment,
        compute=cfg.cluster,
        instance_count=cfg.nodes,
        distribution=distribution,
        inputs=inputs,
        outputs=outputs,
        environment_variables={**environment_variables, "PYTHONUNBUFFERED": "1"},
        queue_settings={"job_tier": "Spot"} if cfg.spot else None,
        identity=ManagedIdentityConfiguration() if managed_identity else None,
    )


def stage(spec: JobSpec, target: AzureMLTarget, into: Path) -> list[str]:
    """The job's code: the launcher's files of the job directory, copied into ``into``; the copy
    of ``job.json`` takes ``data.root`` from the data input's path on the node."""
    into.mkdir(parents=True)
    files = [f for f in LAUNCHER_FILES if (spec.job_dir / f).is_file()]
    for f in files:
        shutil.copy2(spec.job_dir / f, into / f)
    if target.data_input and JOB_FILE in files:
        job = json.loads((into / JOB_FILE).read_text(encoding="utf-8"))
        config = job.get("config", {})
        if isinstance(config.get("data"), dict):
            config["data"]["root"] = f"${{oc.env:{DATA_ROOT_ENV}}}"
            (into / JOB_FILE).write_text(json.dumps(job, indent=2), encoding="utf-8")
    return files


def plan(target: AzureMLTarget, spec: JobSpec) -> str:
    """The request ``submit`` would send to create the job, secrets as ``***``; offline: the code
    and environment are named as the SDK would name them once uploaded."""
    from azure.ai.ml.entities._job.to_rest_functions import to_rest_job_object

    cfg = target.cfg
    arm = (
        f"/subscriptions/{cfg.subscription_id}/resourceGroups/{cfg.resource_group}/providers/"
        f"Microsoft.MachineLearningServices/workspaces/{cfg.workspace}"
    )
    real = azureml_job_name(spec)  # its random end (6 characters) is drawn again at submission
    name = real[:-6] + "<random>"
    files = list(LAUNCHER_FILES)  # what the launcher writes into the job directory before it submits
    vault = str(cfg.key_vault or "<the workspace's key vault>")
    prefix = keyvault.secret_prefix(real)[:-6] + "<random>"
    names = keyvault.secret_names(name, spec.secret_env, prefix=prefix)
    shown = {**spec.env, **keyvault.job_variables(vault, names)}
    build = workspace_build(target)
    environment = Environment(image=str(cfg.image)) if build is None else build.reference
    job = build_job(
        target,
        spec,
        code=str(spec.job_dir),
        files=files,
        name=name,
        environment=environment,
        environment_variables=shown,
        managed_identity=bool(names),
    )._to_job()
    if build is None:
        job.environment = f"{arm}/environments/{environment.name}/versions/{environment.version}"
        about_environment = f"{cfg.image} (an anonymous environment version; its registry is asked for it first)"
        if target.horovod:
            about_environment += "; dist=horovod: the ranks import Horovod from this image, the launcher needs none"
    else:
        job.environment = f"{arm}/environments/{build.name}/versions/{build.version}"
        about_environment = build.describe()
        if target.horovod:
            about_environment += f"; dist=horovod: {horovod_image_note(gpu=bool(cfg.gpu))}"
    if distribution_kind(target) == "mpi" and target.horovod:
        about_environment += (
            f"\n# distribution: Mpi, {cfg.procs_per_node} process(es) on each of {cfg.nodes} "
            f"node(s): Azure ML's mpirun starts the {target.world_size} Horovod ranks"
        )
    job.code = f"{arm}/codes/<uploaded at submission>/versions/1"
    job.compute = f"{arm}/computes/{cfg.cluster}"
    body = to_rest_job_object(job).as_dict()
    body.pop("name", None)
    text = json.dumps(body, indent=2, sort_keys=True)
    snapshot = (
        f"# code snapshot: {target.snapshot_uri(spec.code_digest)}, the input {CODE_INPUT} (uploaded there "
        f"unless its {CODE_FILE} is there already: once per content digest), put into the job's directory "
        f"as {CODE_DIR}/ by the command\n"
        if spec.code_digest
        else ""
    )
    secrets = (
        f"# secrets: {', '.join(f'{var}={REDACTED}' for var in sorted(names))} go to key vault {vault} (one secret "
        f"each, named in {keyvault.NAMES_ENV}, tagged {keyvault.JOB_TAG}, expiring in "
        f"{keyvault.EXPIRES_AFTER.days} days, deleted once the job is collected); the job reads them as the "
        f"cluster's managed identity, which needs the '{keyvault.READER_ROLE}' role on the vault\n"
        if names
        else ""
    )
    return (
        f"PUT {_ARM}{arm}/jobs/{name}\n"
        f"# code: {', '.join(files)} from {spec.job_dir}, uploaded to the workspace's default datastore\n"
        f"{snapshot}"
        f"# environment: {about_environment}\n"
        f"{secrets}"
        f"{scrub(text, spec.secret_env)}"
    )


# ---------------------------------------------------------------------------- the workspace
class Workspace:
    """The Azure ML workspace of a ``compute=azureml`` config, through one ``MLClient``."""

    def __init__(self, cfg: AzureMLConfig) -> None:
        self.cfg = cfg
        self._client: MLClient | None = None
        self._uploader: MLClient | None = None
        self._credential: Any = None
        #: the workspace's ARM resource, once read
        self._resource: Any = None

    @property
    def credential(self) -> Any:
        """The launcher's credential (``DefaultAzureCredential``), for ARM and the job's key vault."""
        if self._credential is None:
            self._credential = management_credential()
        return self._credential

    @property
    def client(self) -> MLClient:
        if self._client is None:
            self._client = self._ml_client(show_progress=False)
        return self._client

    @property
    def uploader(self) -> MLClient:
        """The client for the calls that upload local files to the workspace's storage (a job's
        files, an environment's build context), under :func:`sdk_uploading`. Its progress bars are
        on because that is the SDK's one path that reads its upload threads' results: with them
        off, a refused upload is waited for forever (azure-ai-ml's ``upload_directory`` drops the
        threads' errors, then loops until every file counts as uploaded)."""
        if self._uploader is None:
            self._uploader = self._ml_client(show_progress=True)
        return self._uploader

    def _ml_client(self, *, show_progress: bool) -> MLClient:
        c = self.cfg
        return MLClient(
            self.credential,
            str(c.subscription_id),
            str(c.resource_group),
            str(c.workspace),
            enable_telemetry=False,
            show_progress=show_progress,
        )

    @contextlib.contextmanager
    def errors(
        self,
        what: str,
        secrets: Mapping[str, str] | None = None,
        *,
        reading_workspace: bool = False,
        unanswered: str = "",
    ) -> Iterator[None]:
        """Azure's answers as the errors ddlkit acts on (one line, secrets scrubbed);
        ``reading_workspace``: the call reads the workspace itself, so its 404 says it is missing;
        ``unanswered``: what to add when the service does not answer (refused or dropped
        connections, once the SDK's retries gave up)."""
        c = self.cfg
        try:
            yield
        except ClientAuthenticationError as err:
            if getattr(err, "status_code", None) == 401:
                raise ddlkit.ConfigError(
                    f"{what}: Azure refused the credential (401): sign in again (`az login`) "
                    "or check the service principal's secret."
                ) from None
            raise no_credential(what, err) from None
        except HttpResponseError as err:
            status = err.status_code
            message = _first_line(err, secrets)
            if status == 403:
                raise ddlkit.ConfigError(
                    f"{what}: access denied to workspace {c.workspace} (403: {message}). The identity needs the "
                    f"'AzureML Data Scientist' role (or Contributor) on the workspace: ask its owner for `az role "
                    f'assignment create --role "AzureML Data Scientist" --scope <workspace id>`.'
                ) from None
            if status == 404:
                raise self._not_found(what, err, message, reading_workspace=reading_workspace) from None
            raise ddlkit.ConfigError(f"{what}: Azure ML answered {status}: {message}") from None
        except (ServiceRequestError, ServiceResponseError) as err:
            raise unreachable(what, err, service="Azure ML", then=unanswered, secrets=secrets) from None
        except MlException as err:
            raise ddlkit.ConfigError(f"{what}: the Azure ML SDK refused the job: {_first_line(err, secrets)}") from None

    def _not_found(self, what: str, err: BaseException, message: str, *, reading_workspace: bool) -> ddlkit.ConfigError:
        """A 404 as what is missing: the subscription or resource group (ARM's code says which), the
        workspace (its own read, or ARM naming it as the missing resource or parent), or whatever
        else was asked for (the service's message)."""
        c = self.cfg
        wrong = missing_scope(err, what, subscription=str(c.subscription_id), resource_group=str(c.resource_group))
        if wrong is not None:
            return wrong
        # ARM names a missing resource by type and name, quoted: the workspace itself ends the
        # quote, a resource in it (.../workspaces/<ws>/datastores/<name>') does not
        names_workspace = re.search(
            rf"Microsoft\.MachineLearningServices/workspaces/{re.escape(str(c.workspace))}'", message, re.IGNORECASE
        )
        if reading_workspace or error_code(err) in _NOT_FOUND_CODES and names_workspace:
            return ddlkit.ConfigError(
                f"{what}: workspace {c.workspace} was not found in resource group {c.resource_group} of "
                f"subscription {c.subscription_id} ({message}): check compute.subscription_id, "
                "compute.resource_group and compute.workspace."
            )
        return ddlkit.ConfigError(f"{what}: Azure ML answered 404: {message}")

    def check_cluster(self) -> None:
        """The workspace answers, the cluster exists and has room for the job's nodes."""
        c = self.cfg
        self._read_workspace()
        with self.errors(f"reading cluster {c.cluster}"):
            try:
                cluster = self.client.compute.get(str(c.cluster))
            except ResourceNotFoundError:
                names = sorted(compute.name for compute in self.client.compute.list())
                raise ddlkit.ConfigError(
                    f"compute.cluster={c.cluster} is not a compute of workspace {c.workspace}; "
                    f"it has: {', '.join(names) or '(none)'}."
                ) from None
        most = getattr(cluster, "max_instances", None)
        if most is not None and c.nodes > most:
            raise ddlkit.ConfigError(
                f"compute.nodes={c.nodes} is more than cluster {c.cluster} can have ({most} nodes at most): lower "
                f"compute.nodes, or raise the cluster's maximum (az ml compute update --name {c.cluster} "
                f"--max-instances {c.nodes})."
            )

    def _read_workspace(self) -> Any:
        """The workspace's ARM resource, read now (and kept for :meth:`key_vault`)."""
        with self.errors(f"reading workspace {self.cfg.workspace}", reading_workspace=True):
            self._resource = self.client.workspaces.get(str(self.cfg.workspace))
        return self._resource

    def _datastore(self, name: str, what: str, secrets: Mapping[str, str] | None = None) -> tuple[Any, str]:
        """A client of datastore ``name``'s container, with the datastore's own credential (a SAS it
        issues, or the signed-in identity for an identity-based datastore: the route of the SDK's
        uploads of a job's local inputs), and the datastore's type."""
        from azure.ai.ml._artifacts._artifact_utilities import get_datastore_info
        from azure.storage.blob import BlobServiceClient

        with self.errors(what, secrets):
            info = get_datastore_info(self.client.datastores, name)
        service = BlobServiceClient(account_url=info["account_url"], credential=info["credential"])
        return service.get_container_client(info["container_name"]), info["storage_type"]

    def read_output(self, job_id: str, name: str) -> bytes | None:
        """The file ``name`` of the job's output (its directory) as the output's datastore holds it
        now; None when it is not there (yet)."""
        what = f"reading job {job_id}'s output"
        with self.errors(what):
            output = self.client.jobs.get(job_id).outputs[OUTPUT]
        where = _OUTPUT_PATH.search(str(getattr(output, "path", "") or ""))
        if where is None:
            return None
        container, _ = self._datastore(where["datastore"], what)
        try:
            return bytes(container.download_blob(f"{where['path'].strip('/')}/{name}").readall())
        except ResourceNotFoundError:
            return None
        except AzureError as err:
            raise storage_error(what, err, None) from None

    def upload_snapshot(self, target: AzureMLTarget, spec: JobSpec) -> None:
        """The job's code snapshot (``code/`` and ``code.json`` of its directory) to
        ``<compute.code_root>/<digest>/``, unless that digest's ``code.json`` is there: it is
        uploaded last, so its presence says every file before it arrived (:meth:`_datastore`'s
        route)."""
        uri = target.snapshot_uri(str(spec.code_digest))
        datastore, prefix = target.code_datastore, target.snapshot_path(str(spec.code_digest))
        container, kind = self._datastore(
            datastore, f"reading datastore {datastore} (compute.code_root)", spec.secret_env
        )
        if kind != "AzureBlob":
            raise ddlkit.ConfigError(
                f"compute.code_root={target.cfg.code_root} names datastore {datastore}, of type "
                f"{getattr(kind, 'value', kind)}: code snapshots go to a blob datastore, e.g. "
                "azureml://datastores/workspaceblobstore/paths/ddlkit-code."
            )
        files = [
            p.relative_to(spec.job_dir).as_posix() for p in sorted((spec.job_dir / CODE_DIR).rglob("*")) if p.is_file()
        ]

        def put(rel: str) -> None:
            with open(spec.job_dir / rel, "rb") as f:
                container.upload_blob(f"{prefix}/{rel}", f, overwrite=True)

        try:
            if container.get_blob_client(f"{prefix}/{CODE_FILE}").exists():
                return
            with ThreadPoolExecutor(UPLOAD_WORKERS) as pool:
                list(pool.map(put, files))
            put(CODE_FILE)
        except AzureError as err:
            raise storage_error(f"uploading the code snapshot to {uri}", err, spec.secret_env) from None

    def key_vault(self) -> str:
        """The URL of the vault that takes the job's secrets: ``compute.key_vault``, or the workspace's
        own (its ``properties.keyVault``)."""
        c = self.cfg
        if c.key_vault:
            return str(c.key_vault).rstrip("/")
        resource = self._resource if self._resource is not None else self._read_workspace()
        url = keyvault.vault_url_of(str(getattr(resource, "key_vault", None) or ""))
        if url is None:
            raise ddlkit.ConfigError(
                f"workspace {c.workspace} names no key vault for the job's secrets: name one with "
                "compute.key_vault=https://<name>.vault.azure.net."
            )
        return url

    def store_secrets(self, spec: JobSpec, name: str) -> tuple[str, dict[str, str]]:
        """The job's secrets into its key vault: (the vault, {variable: secret name})."""
        if not spec.secret_env:
            return "", {}
        vault = self.key_vault()
        try:
            return vault, keyvault.store(vault, name, spec.secret_env, self.credential)
        except keyvault.SecretsError as err:
            raise ddlkit.ConfigError(scrub(str(err), spec.secret_env)) from None

    def delete_secrets(self, job_id: str, vault: str, names: Mapping[str, str]) -> None:
        """Delete the job's secrets from its vault (best effort: one warning line if it cannot)."""
        try:
            failed = keyvault.delete(vault, names.values(), self.credential)
        except Exception as err:  # best effort: the secrets expire anyway
            failed = [f"{', '.join(names.values())} ({_first_line(err, None)})"]
        if failed:
            print(
                f"ddlkit: warning: could not delete job {job_id}'s secrets from key vault {vault}: "
                f"{'; '.join(failed)}; "
                f"they expire {keyvault.EXPIRES_AFTER.days} days after the job was submitted (delete them with "
                "`az keyvault secret delete --vault-name <vault> --name <secret>`)",
                file=sys.stderr,
                flush=True,
            )

    def submit(self, target: AzureMLTarget, spec: JobSpec) -> str:
        """Create the job (its cluster checked, its environment and code snapshot there); its name."""
        self.check_cluster()
        environment = job_environment(self, target)
        if spec.code_digest:
            self.upload_snapshot(target, spec)
        name = azureml_job_name(spec)
        vault, names = self.store_secrets(spec, name)
        with tempfile.TemporaryDirectory(prefix="ddlkit-azureml-") as tmp:
            code = Path(tmp) / "job"
            files = stage(spec, target, code)
            job = build_job(
                target,
                spec,
                code=str(code),
                files=files,
                name=name,
                environment=environment,
                # the secrets' vault and names, never a value: the job's definition is any workspace Reader's
                environment_variables={**spec.env, **keyvault.job_variables(vault, names)},
                managed_identity=bool(names),
            )
            what = f"submitting job {spec.name}"
            try:
                with self.errors(what, spec.secret_env), sdk_uploading(f"{what}: uploading its files", spec.secret_env):
                    created = self.uploader.jobs.create_or_update(job)
            except BaseException:
                if names:
                    self.delete_secrets(name, vault, names)
                raise
        return str(created.name)


@contextlib.contextmanager
def sdk_uploading(what: str, secrets: Mapping[str, str] | None = None) -> Iterator[None]:
    """Around a call of :attr:`Workspace.uploader` (the SDK uploads local files to the workspace's
    storage, then calls Azure ML): the progress bars, and the colour reset and blank lines it prints
    after an upload whatever ``show_progress`` says, kept off the console (they would land among the
    job's output); the storage account's refusal or silence one line naming it and what to check,
    not Azure ML's advice. Azure ML's own answers go on to :meth:`Workspace.errors`."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    except Exception as err:
        refused = storage_refusal(what, err, secrets)
        if refused is None:
            raise
        raise refused from None


#: a storage account's blob (or Data Lake) endpoint: ``<account>.blob.<the cloud's suffix>``
_STORAGE_HOST = re.compile(r"^([a-z0-9]{3,24})\.(?:blob|dfs)\.", re.IGNORECASE)


def storage_refusal(what: str, err: BaseException, secrets: Mapping[str, str] | None) -> ddlkit.ConfigError | None:
    """``err`` as one line when a storage account answered it, or did not answer (else None): an
    answer names its account (its URL); a connection that was not made is the storage's when the
    storage SDK raised it (through a proxy, nothing in the error names the host). The SDK raises a
    refusal as it is, or wrapped in a plain ``Exception`` of its own words. A SAS in what it quotes
    (the SDK's own, for the upload) is redacted with ``secrets``."""

    def said(text: str) -> ddlkit.ConfigError:
        return ddlkit.ConfigError(redact_text(scrub(text, dict(secrets or {}))))

    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for current in chain:
        if isinstance(current, (ServiceRequestError, ServiceResponseError)) and _raised_by_storage(current):
            account = _STORAGE_HOST.match(endpoint_of(current) or "")
            storage = "the workspace's storage" + (f" account {account.group(1)}" if account else "")
            return said(
                f"{what}: no answer from {storage} ({network_reason(current)}), retried and given up: check the "
                "network to it (proxy, firewall, DNS; a storage account's firewall may admit some networks "
                "only), then run the command again."
            )
        url = getattr(getattr(getattr(current, "response", None), "request", None), "url", None)
        account = _STORAGE_HOST.match(urlsplit(url).netloc if isinstance(url, str) else "")
        if not isinstance(current, HttpResponseError) or account is None:
            continue
        code = getattr(current, "error_code", None) or error_code(current)
        code = getattr(code, "value", code)  # the storage SDK's StorageErrorCode, a str enum
        answer = (
            f"the workspace's storage account {account.group(1)} answered {current.status_code} "
            f"({code or _first_line(current, secrets)})"
        )
        if current.status_code in (401, 403):
            return said(
                f"{what}: {answer}: the datastore's credential, which the workspace holds, must allow writing (a "
                "rotated account key: `az ml datastore update`; a SAS token: write, create and list permissions), "
                "and for an identity-based datastore the signed-in identity needs the 'Storage Blob Data "
                "Contributor' role on the storage account."
            )
        return said(f"{what}: {answer}.")
    return None


def storage_error(what: str, err: BaseException, secrets: Mapping[str, str] | None) -> ddlkit.ConfigError:
    """An error of a call that only speaks to storage, as one line: :func:`storage_refusal`'s, else
    the error's first line."""
    return storage_refusal(what, err, secrets) or ddlkit.ConfigError(f"{what}: {_first_line(err, secrets)}")


def _raised_by_storage(err: BaseException) -> bool:
    frame = err.__traceback__
    while frame is not None:
        if str(frame.tb_frame.f_globals.get("__name__", "")).startswith("azure.storage."):
            return True
        frame = frame.tb_next
    return False


def _first_line(err: BaseException, secrets: Mapping[str, str] | None) -> str:
    text = str(getattr(err, "message", None) or err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("Code:", "Message:"))]
    return scrub(lines[0] if lines else type(err).__name__, dict(secrets or {}))


# ---------------------------------------------------------------------------- the scheduler
class AzureMLScheduler(Scheduler):
    """What Azure ML says of its command jobs (``job_id``: the job's name in the workspace), their
    cancel, rank 0's log and the output; :class:`~ddlkit.compute.scheduler.SchedulerJob` paces the
    looks and :func:`~ddlkit.compute.outcome.judge` decides how a job ended, from the ranks' exit
    records in the output (:mod:`ddlkit_azure.rank`).

    One look is one run-history call (state, error, log files); following the log adds one ranged
    read of rank 0's log file per look."""

    noun = "Azure ML job"

    def __init__(
        self,
        workspace: Workspace,
        *,
        poll_interval_s: float,
        secrets: Mapping[str, str] | None = None,
        job_dir: Path | None = None,
    ):
        self.workspace, self.poll_interval_s = workspace, poll_interval_s
        self.secrets = dict(secrets or {})
        #: how to follow the job again, for the messages of a look that got no answer
        self.attach_hint = f"`ddlkit jobs attach {job_dir}`" if job_dir else "`ddlkit jobs attach <job>`"
        #: how long fetch waits, once run history says the job ended, for the job's record to say so too
        self.settle_s = SETTLE_S
        #: how long a cancel waits for Azure ML's cancel operation to finish
        self.cancel_wait_s = CANCEL_WAIT_S
        self._seen: dict[str, tuple[float, Any]] = {}
        self._logs: dict[str, RangedLog] = {}
        self._fetched: set[tuple[str, Path]] = set()

    def details(self, job_id: str) -> Any:
        """Run history's details of the job (state, error, log files): what `az ml job stream` reads."""
        unanswered = f"The job itself runs on in Azure ML whatever this says: {self.attach_hint} follows it again."
        with self.workspace.errors(f"reading job {job_id}", self.secrets, unanswered=unanswered):
            details = self.workspace.client.jobs._runs_operations.get_run_details(job_id)
        self._seen[job_id] = (time.monotonic(), details)
        return details

    def describe(self, job_id: str) -> Observation:
        status = self.details(job_id).status or "NotStarted"
        state = STATES.get(status, JobState.PENDING)
        if status not in TERMINAL:
            # CancelRequested: still stopping (its ranks checkpoint), so its files come after they stopped
            return Observation(JobState.RUNNING if state.done else state, reason=f"Azure ML: {status}")
        if status == "Completed":
            return Observation(JobState.SUCCEEDED, 0)
        details = self._seen[job_id][1]
        error = scrub(getattr(getattr(details.error, "error", None), "message", None) or "", self.secrets)
        found = _EXIT.search(error)
        code = int(found.group(1)) if found else None
        if status == "Canceled":  # Azure ML keeps no exit status of its own: the ranks' records say
            return Observation(JobState.CANCELLED, code)
        return Observation(
            JobState.FAILED, EXIT_FAILED if code is None else code, reason=f"failed: {error or 'no reason given'}"
        )

    def signal(self, job_id: str, how: Literal["stop", "kill"]) -> None:
        """Stop and kill alike: Azure ML stops the processes (SIGTERM: the ranks checkpoint), then
        kills them. The cancel operation is waited for, up to :data:`CANCEL_WAIT_S`: one that fails
        is one line (the job runs on), one that has not finished by then is said, and the job's
        state is then what tells."""
        what = f"cancelling job {job_id}"
        unanswered = f"The job may still be running: {self.attach_hint} follows it; `ddlkit jobs cancel` asks again."
        with self.workspace.errors(what, self.secrets, unanswered=unanswered):
            poller = self.workspace.client.jobs.begin_cancel(job_id, polling_interval=self.poll_interval_s)
            try:
                poller.result(timeout=self.cancel_wait_s)
            except HttpResponseError as err:
                raise ddlkit.ConfigError(
                    f"{what}: Azure ML's cancel operation failed ({_first_line(err, self.secrets)}). {unanswered}"
                ) from None
        if not poller.done():
            print(
                f"ddlkit: {what}: Azure ML has not confirmed the cancel within {self.cancel_wait_s:g} s; waiting for "
                "the job's state to say it stopped",
                file=sys.stderr,
                flush=True,
            )

    def peek(self, job_id: str, job_dir: Path) -> None:
        """Rank 0's ``telemetry.json`` from the job's output while the job runs, for ``ddlkit jobs
        status``: the output is a read-write mount of a datastore path, where a file is once it was
        written (rank 0 replaces it whole every few seconds). An ended job's files come with
        :meth:`fetch`; a file that cannot be read now leaves the launcher's copy as it was."""
        if self.details(job_id).status in TERMINAL:
            return
        with contextlib.suppress(ddlkit.DdlkitError):
            data = self.workspace.read_output(job_id, TELEMETRY_FILE)
            if data is not None:
                replace_text(Path(job_dir) / TELEMETRY_FILE, data.decode("utf-8", errors="replace"))

    # ------------------------------------------------------------ rank 0's log
    def read_log(self, job_id: str, offset: int) -> str:
        """Rank 0's log (``user_logs/std_log.txt``, or ``std_log_process_0.txt`` of several
        processes, zero-padded) from ``offset``: the log files of the last look at the job, looked
        at again when it had none and is a poll interval old."""
        seen = self._seen.get(job_id)
        if seen is None or 0 not in rank_logs(seen[1]) and time.monotonic() - seen[0] >= self.poll_interval_s:
            seen = (0.0, self.details(job_id))
        url = rank_logs(seen[1]).get(0)
        if url is None:
            return ""
        return self._logs.setdefault(job_id, RangedLog()).read(offset, lambda start: self._read(job_id, url, start))

    def follow_log(self, job_id: str, offset: int, done: Callable[[], bool]) -> Iterator[str]:
        return follow_paced(
            lambda at: self.read_log(job_id, at),
            offset,
            done,
            self.poll_interval_s,
            running=f"Azure ML job {job_id} runs on: waiting for it to end without its log; {self.attach_hint} "
            "follows the log again",
        )

    def _read(self, job_id: str, url: str, start: int | None = None) -> bytes:
        """The log file at ``url``, or its bytes from ``start`` on (a ranged read), retried as the
        SDK's calls are (:func:`~ddlkit_azure.ranged.get_with_retries`)."""
        what = f"reading job {job_id}'s log"
        try:
            response = get_with_retries(url, headers={} if start is None else range_header(start))
        except (ServiceRequestError, ServiceResponseError) as err:
            raise LogUnreadable(
                str(unreachable(what, err, service="Azure ML's log storage", again=False, secrets=self.secrets))
            ) from None
        data = bytes_from(response, start or 0)
        if data is None:
            raise LogUnreadable(f"{what}: HTTP {response.status_code}")
        return data

    # ------------------------------------------------------------ files
    def fetch(self, job_id: str, job_dir: Path) -> None:
        """The job's output (its directory: the ranks' exit records and logs, result, metrics,
        checkpoints, model) into the launcher's job directory -- the launcher's own files stay --,
        and the Azure ML log of each process that left no ``rank-N.log`` there (it failed before its
        rank minder started) as its ``rank-N.log``. An ended job's output is downloaded once."""
        job_dir = Path(job_dir)
        if (job_id, job_dir) in self._fetched:
            return
        details = self.details(job_id)
        brought: set[str] = set()
        downloaded = False
        with tempfile.TemporaryDirectory(prefix="ddlkit-azureml-") as tmp:
            try:
                self._download_output(job_id, tmp, job_dir, details.status)
                downloaded = True
            except ddlkit.DdlkitError:
                if details.status == "Completed":
                    raise
                # a job that failed or was cancelled before it ran has no output: its logs may still tell why
            source = Path(tmp) / "named-outputs" / OUTPUT
            for path in sorted(source.rglob("*")):
                rel = path.relative_to(source)
                # the launcher's own files (its job files, its code snapshot) stay; the job's
                # bookkeeping (its lock) stays there
                launchers = len(rel.parts) == 1 and rel.name in (*LAUNCHER_FILES, CODE_FILE)
                if rel.parts[0] not in (STATE_DIR, CODE_DIR) and not launchers and path.is_file():
                    (job_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, job_dir / rel)
                    brought.add(rel.as_posix())
        for rank, url in rank_logs(details).items():
            if rank_log(rank) not in brought:
                (job_dir / rank_log(rank)).write_bytes(self._read(job_id, url))
        if downloaded and details.status in TERMINAL:
            self._fetched.add((job_id, job_dir))
            self._delete_secrets(job_id)

    def _delete_secrets(self, job_id: str) -> None:
        """The ended job's secrets out of its key vault (its definition names the vault and the secrets)."""
        try:
            with self.workspace.errors(f"reading job {job_id}", self.secrets):
                variables = self.workspace.client.jobs.get(job_id).environment_variables
        except ddlkit.DdlkitError as err:
            print(f"ddlkit: warning: could not delete job {job_id}'s secrets: {err}", file=sys.stderr, flush=True)
            return
        stored = keyvault.stored_in(variables)
        if stored is not None:
            self.workspace.delete_secrets(job_id, *stored)

    def _download_output(self, job_id: str, into: str, job_dir: Path, ended: str) -> None:
        """The job's output into ``into``, once the job's record agrees with run history that the
        job ended: ``jobs.download`` reads the record, and refuses a job it says is still running.
        Waits up to ``settle_s`` for that, a look every poll interval."""
        deadline = time.monotonic() + self.settle_s
        told = refused_when_ended = False
        while True:
            with self.workspace.errors(f"downloading job {job_id}'s output", self.secrets):
                try:
                    self.workspace.client.jobs.download(job_id, download_path=into, output_name=OUTPUT)
                    return
                except JobException:
                    status = self.workspace.client.jobs.get(job_id).status
                    recorded = str(getattr(status, "value", status))
                    if recorded in TERMINAL:
                        if refused_when_ended:
                            raise  # the SDK refused for another reason
                        # the record ended between the download's read of it and this one: once more
                        refused_when_ended = True
                        continue
            if time.monotonic() >= deadline:
                raise ddlkit.RunError(
                    f"downloading job {job_id}'s output: Azure ML's run history says the job ended ({ended}), but "
                    f"its job record still says {recorded} after {self.settle_s:.0f} s, and the output is downloaded "
                    f"only once they agree. It stays in the workspace: download it later with `ddlkit jobs attach "
                    f"{job_dir}`.",
                    component="compute",
                )
            if not told:
                print(
                    f"ddlkit: Azure ML's job record says {recorded} while its run history says {ended}: waiting "
                    f"up to {self.settle_s:.0f} s for them to agree before downloading the output",
                    file=sys.stderr,
                    flush=True,
                )
                told = True
            time.sleep(max(0.0, min(self.poll_interval_s, deadline - time.monotonic())))


def rank_logs(details: Any) -> dict[int, str]:
    """Each process's log file among the run's: {rank: its URL}."""
    found = {}
    for name, url in (details.log_files or {}).items():
        m = _RANK_LOG.match(name)
        if m:
            found[int(m.group(1) or 0)] = url
    return found
