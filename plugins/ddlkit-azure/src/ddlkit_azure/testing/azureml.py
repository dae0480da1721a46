"""A loopback Azure Machine Learning workspace: the REST API the ``azure-ai-ml`` SDK talks to,
served on 127.0.0.1 by a :class:`~ddlkit_azure.testing.loopback.LoopbackServer`, with jobs that really run.

It follows the published API (the SDK's own request shapes) for what a command job needs:

* ARM (``AZUREML_DEV_URL_MFE`` points the SDK here): the workspace and its discovery document,
  computes (get, list), datastores (get, list, ``listSecrets``; the default ``workspaceblobstore``
  and ``workspaceartifactstore`` live in **Azurite**), code versions (list by hash,
  ``startPendingUpload`` -> a SAS for Azurite, put, get), environment versions (put, get: an
  ``image``, or a ``build`` whose ``contextUri`` names the context the SDK uploaded), jobs
  (put, get, ``cancel``);
* run history: ``/history/v1.0/.../runs/{id}/details`` (state, error, ``logFiles``), and the log
  files themselves (``user_logs/std_log.txt``, ``std_log_process_N.txt`` for several processes, N
  zero-padded to the width of their count: ``std_log_process_00.txt`` of 10 or more);
* ARM's 404s: ``SubscriptionNotFound`` and ``ResourceGroupNotFound`` for another subscription or
  resource group, ``ResourceNotFound`` naming ``Microsoft.MachineLearningServices/workspaces/<name>``
  for another workspace; :attr:`LoopbackWorkspace.record_lag_s` makes the job's record lag run
  history at a job's end (two services; the SDK's download reads the record), and
  :attr:`LoopbackWorkspace.ignore_range` answers ranged log reads 200 with the whole file.

Blob traffic goes to a real Azurite. The SDK addresses a datastore as
``https://<account>.blob.core.windows.net``; an :class:`~ddlkit_azure.testing.loopback.InterceptingProxy`
(``HTTPS_PROXY``, see :attr:`LoopbackWorkspace.environment`) carries exactly that host to Azurite.

**The workspace's key vault** (its ``properties.keyVault``) is a
:class:`~ddlkit_azure.testing.keyvault.LoopbackKeyVault` (:attr:`LoopbackWorkspace.key_vault`),
``https://kv-ddlkit.vault.azure.net`` carried to it by the same proxy. A job run with
``identity: Managed`` gets Azure ML's managed identity endpoint (``MSI_ENDPOINT``, ``MSI_SECRET``,
``DEFAULT_IDENTITY_CLIENT_ID``: a token of the cluster's identity, :data:`MANAGED_IDENTITY_CLAIMS`);
every job's processes get the proxy and the loopback certificate (``REQUESTS_CA_BUNDLE``), as a
node's network and trust store.

**Jobs run here.** A job PUT starts a thread that moves the job through ``Queued`` ->
``Preparing`` (the code is fetched from Azurite into a scratch directory, the outputs are
"mounted": downloaded from their datastore path, and the inputs downloaded) -> ``Running`` (the
job's command, ``${{inputs.x}}``/``${{outputs.x}}`` substituted, runs in the code directory with the
job's environment variables, under ``bash``, with *this machine's* ``python`` first on ``PATH`` in
place of the image, which is only recorded; ``MpiDistribution`` runs the command under the real
``mpirun``, ``PyTorchDistribution`` starts one process per rank with ``MASTER_ADDR``, ``RANK`` ...,
each process's output in its log file) -> ``Finalizing`` (the outputs go back to Azurite) ->
``Completed`` / ``Failed`` / ``Canceled``. An environment with a build context is built in ``Preparing``
by the first job that uses it, as the service builds it into the workspace's registry, and reused by
later ones: the build (:attr:`LoopbackWorkspace.image_builds`) fetches the context from Azurite and
checks that it holds the Dockerfile it names (the image is not built: the job runs here); a context
without it is a loopback error (:attr:`LoopbackServer.errors <ddlkit_azure.testing.loopback.LoopbackServer.errors>`),
which fails the test. A cancel sends SIGTERM to every process, SIGKILL after
``grace_period_s``. :meth:`LoopbackWorkspace.preempt` does what a low-priority eviction does:
the processes are stopped, the outputs kept, and the job is queued again and re-run.

Nothing here is ddlkit-specific; tests and the benchmark use it through the real SDK and CLI.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from ddlkit.compute.ports import free_ports

from . import ACCOUNT, ACCOUNT_KEY, Azurite
from .keyvault import LoopbackKeyVault
from .loopback import InterceptingProxy, LoopbackServer, Request, Response, error_body, unsigned_token

ARM_PREFIX = (
    r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/"
    r"Microsoft\.MachineLearningServices/workspaces/(?P<ws>[^/]+)"
)
#: the host name the SDK builds for the datastores' storage account (carried to Azurite by the proxy)
BLOB_HOST = f"{ACCOUNT}.blob.core.windows.net"
BLOB_URL = f"https://{BLOB_HOST}"
DEFAULT_DATASTORE = "workspaceblobstore"
ARTIFACT_DATASTORE = "workspaceartifactstore"
#: the compute cluster's managed identity: the claims of the tokens a job run with it gets (its ``oid``)
MANAGED_IDENTITY_CLAIMS = {
    "aud": "https://vault.azure.net",
    "iss": "https://sts.windows.net/00000000-0000-0000-0000-00000000000a/",
    "tid": "00000000-0000-0000-0000-00000000000a",
    "oid": "00000000-0000-0000-0000-0000000000c2",
    "appid": "00000000-0000-0000-0000-0000000000c3",
}
#: Azure ML's job states, in the order a job goes through them
QUEUED, PREPARING, RUNNING, FINALIZING = "Queued", "Preparing", "Running", "Finalizing"
COMPLETED, FAILED, CANCEL_REQUESTED, CANCELED = "Completed", "Failed", "CancelRequested", "Canceled"
TERMINAL = (COMPLETED, FAILED, CANCELED)
_PLACEHOLDER = re.compile(r"\$\{\{\s*(inputs|outputs)\.([A-Za-z0-9_]+)\s*\}\}")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Cluster:
    name: str
    max_nodes: int = 4
    vm_size: str = "STANDARD_NC24ADS_A100_V4"
    vm_priority: str = "Dedicated"


@dataclass(frozen=True)
class ImageBuild:
    """An environment's image, built (as far as the loopback goes) from its build context."""

    environment: str
    version: str
    #: the context as the SDK uploaded it (fetched from Azurite)
    context: Path
    #: where the image would be in the workspace's registry
    image: str


@dataclass
class LoopbackJob:
    """A job of the loopback workspace, as the tests see it."""

    name: str
    #: the job's ``properties`` as the SDK PUT them
    spec: dict[str, Any]
    workdir: Path
    state: str = QUEUED
    #: every state the job went through, in order
    states: list[str] = field(default_factory=list)
    exit_code: int | None = None
    error: str | None = None
    created: str = field(default_factory=_now)
    started: str | None = None
    ended: str | None = None
    #: how many times the job was (re-)started: 1, or more after preemptions
    attempts: int = 0
    #: environment each process got (the last attempt's), for tests to check
    process_env: dict[str, str] = field(default_factory=dict)
    processes: list[subprocess.Popen] = field(default_factory=list, repr=False)
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    preempt_event: threading.Event = field(default_factory=threading.Event, repr=False)
    preempt_hard: bool = False
    done_event: threading.Event = field(default_factory=threading.Event, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: when (time.monotonic) the job reached its terminal state
    ended_at: float | None = None
    #: the image the job's environment names, or the one built for it
    image: str | None = None

    def set_state(self, state: str) -> None:
        with self.lock:
            self.state = state
            self.states.append(state)
            if state in TERMINAL:
                self.ended_at = time.monotonic()

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def log_files(self) -> list[str]:
        """Log file names relative to the run's log root (``user_logs/std_log.txt`` ...)."""
        if not self.log_dir.is_dir():
            return []
        return sorted(str(p.relative_to(self.log_dir)) for p in self.log_dir.rglob("*") if p.is_file())


class LoopbackWorkspace:
    """An Azure ML workspace on ``server`` (started), its storage in ``azurite``, its jobs run in
    ``root``. Set :attr:`environment` where the SDK runs (and remove
    :data:`~ddlkit_azure.testing.loopback.CREDENTIAL_ENV`; sign in with ``install_az``)."""

    def __init__(
        self,
        server: LoopbackServer,
        azurite: Azurite,
        root: Path,
        *,
        subscription: str = "sub-0001",
        resource_group: str = "rg-ddlkit",
        workspace: str = "ws-ddlkit",
        clusters: Mapping[str, int] | None = None,
        queue_s: float = 0.2,
        grace_period_s: float = 30.0,
        python: str = sys.executable,
    ) -> None:
        self.server, self.azurite, self.root = server, azurite, Path(root)
        self.subscription, self.resource_group, self.workspace = subscription, resource_group, workspace
        self.clusters = {name: Cluster(name, n) for name, n in (clusters or {"gpu-cluster": 4}).items()}
        self.queue_s, self.grace_period_s = queue_s, grace_period_s
        #: seconds the job's record (GET .../jobs/<name>) lags run history's details at a job's end: it
        #: still says Finalizing (CancelRequested) while run history says Completed/Failed (Canceled),
        #: as two separate services may
        self.record_lag_s = 0.0
        #: answer a ranged read of a log file 200 with the whole file, as a server that ignores ``Range`` does
        self.ignore_range = False
        #: seconds between two flushes of a running job's mounted outputs into their datastore
        self.mount_flush_s = 1.0
        #: the credentials the workspace hands out for its storage (a datastore's secrets, a pending
        #: upload's SAS): "full"; "rotated" (signed with another key: every request is answered 403
        #: AuthenticationFailed); "read-only" (a SAS that reads and lists: the first write is answered
        #: 403 AuthorizationPermissionMismatch)
        self.storage_credentials: Literal["full", "rotated", "read-only"] = "full"
        self.workspace_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{subscription}/{resource_group}/{workspace}"))
        #: datastore name -> Azurite container
        self.datastores = {DEFAULT_DATASTORE: f"azureml-blobstore-{self.workspace_id}", ARTIFACT_DATASTORE: "azureml"}
        self.codes: dict[tuple[str, str], dict[str, Any]] = {}
        self.environments: dict[tuple[str, str], dict[str, Any]] = {}
        #: (environment, version) -> its image, built by the first job that used it
        self.image_builds: dict[tuple[str, str], ImageBuild] = {}
        self.jobs: dict[str, LoopbackJob] = {}
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._bin = self.root / "bin"
        self._bin.mkdir(parents=True, exist_ok=True)
        # "python" in a job is this machine's interpreter, in place of the image's: a script that runs
        # it by its own path, not a link to it -- a virtual environment's interpreter reached through a
        # link elsewhere does not find its environment (pyvenv.cfg is looked for beside the link)
        for name in ("python", "python3"):
            script = self._bin / name
            if not script.exists():
                script.write_text(f'#!/bin/sh\nexec {shlex.quote(str(python))} "$@"\n')
                script.chmod(0o755)
        self.proxy = InterceptingProxy(server.certificate, {re.escape(BLOB_HOST): ("127.0.0.1", azurite.port)})
        #: the workspace's key vault (its ``properties.keyVault``), reached through the proxy by its host name
        self.key_vault = LoopbackKeyVault(server.certificate)
        #: the secret of each job's managed identity endpoint (``MSI_SECRET``) -> the job's name
        self._msi_secrets: dict[str, str] = {}
        self._register_routes()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> LoopbackWorkspace:
        self.key_vault.start()
        vault = (re.compile(re.escape(self.key_vault.host)), ("127.0.0.1", self.key_vault.server.port))
        self.proxy.upstreams.append(vault)
        self.proxy.start()
        for container in self.datastores.values():
            self._container(container)
        return self

    def stop(self) -> None:
        for job in list(self.jobs.values()):
            if job.state not in TERMINAL:
                job.cancel_event.set()
        for job in list(self.jobs.values()):
            job.done_event.wait(timeout=self.grace_period_s + 10)
        self.proxy.stop()
        self.key_vault.stop()

    def __enter__(self) -> LoopbackWorkspace:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def environment(self) -> dict[str, str]:
        """What the SDK's process needs besides the sign-in: the ARM endpoint, and the proxy for
        the datastores' blob host (``NO_PROXY`` keeps this server direct)."""
        return {
            "AZUREML_DEV_URL_MFE": self.server.url,
            "HTTPS_PROXY": self.proxy.url,
            "https_proxy": self.proxy.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    @property
    def arm_id(self) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}/providers/"
            f"Microsoft.MachineLearningServices/workspaces/{self.workspace}"
        )

    # ------------------------------------------------------------ storage
    def _service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.azurite.connection_string)

    def _container(self, name: str) -> Any:
        from azure.core.exceptions import ResourceExistsError

        client = self._service().get_container_client(name)
        try:
            client.create_container()
        except ResourceExistsError:
            pass
        return client

    def add_datastore(self, name: str, container: str | None = None) -> str:
        """Register a blob datastore (its own Azurite container, created); returns the container."""
        self.datastores[name] = container or f"ds-{name}".lower().replace("_", "-")
        self._container(self.datastores[name])
        return self.datastores[name]

    def upload_dir(self, local: Path, datastore: str, prefix: str) -> None:
        """Put every file under ``local`` at ``<prefix>/<relative path>`` in ``datastore``."""
        client = self._container(self.datastores[datastore])
        for path in sorted(Path(local).rglob("*")):
            if path.is_file():
                with open(path, "rb") as f:
                    client.upload_blob(f"{prefix.strip('/')}/{path.relative_to(local).as_posix()}", f, overwrite=True)

    def download_prefix(self, container: str, prefix: str, local: Path) -> int:
        """The blobs under ``prefix`` into ``local`` (a directory); returns how many."""
        client = self._container(container)
        prefix = prefix.strip("/")
        count = 0
        for blob in client.list_blobs(name_starts_with=f"{prefix}/" if prefix else None):
            target = Path(local) / blob.name[len(prefix) :].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as f:
                client.download_blob(blob.name).readinto(f)
            count += 1
        return count

    def _sync_up(self, local: Path, container: str, prefix: str) -> None:
        """Make ``prefix`` hold exactly the files under ``local`` (a mount's view after the job)."""
        client = self._container(container)
        prefix = prefix.strip("/")
        present = {p.relative_to(local).as_posix() for p in Path(local).rglob("*") if p.is_file()}
        for blob in client.list_blobs(name_starts_with=f"{prefix}/"):
            if blob.name[len(prefix) + 1 :] not in present:
                client.delete_blob(blob.name)
        for rel in sorted(present):
            with open(Path(local) / rel, "rb") as f:
                client.upload_blob(f"{prefix}/{rel}", f, overwrite=True)

    def _sas(self, container: str) -> str:
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        return generate_container_sas(
            ACCOUNT,
            container,
            account_key=self._account_key,
            permission=ContainerSasPermissions(read=True, list=True)
            if self.storage_credentials == "read-only"
            else ContainerSasPermissions(read=True, write=True, list=True, add=True, create=True, delete=True),
            expiry=datetime.now(UTC) + timedelta(hours=2),
        )

    @property
    def _account_key(self) -> str:
        rotated = self.storage_credentials == "rotated"
        return base64.b64encode(b"a rotated key".ljust(64, b"!")).decode() if rotated else ACCOUNT_KEY

    def _datastore_secrets(self, r: Request, m: re.Match[str]) -> dict[str, str]:
        if self.storage_credentials == "read-only":
            return {"secretsType": "Sas", "sasToken": self._sas(self.datastores[m["name"]])}
        return {"secretsType": "AccountKey", "key": self._account_key}

    @staticmethod
    def parse_datastore_uri(uri: str) -> tuple[str, str]:
        """``azureml://datastores/<name>/paths/<path>`` (or its ARM-scoped long form) -> (name, path)."""
        m = re.search(r"datastores/([^/]+)/paths/(.*)$", uri)
        if not m:
            raise ValueError(f"not a datastore URI: {uri}")
        return m.group(1), m.group(2).strip("/")

    # ------------------------------------------------------------ REST resources
    def _resource(self, kind: str, name: str, properties: dict[str, Any], *, suffix: str = "") -> dict[str, Any]:
        return {
            "id": f"{self.arm_id}/{kind}/{name}{suffix}",
            "name": name.split("/")[-1],
            "type": f"Microsoft.MachineLearningServices/workspaces/{kind}",
            "properties": properties,
            "systemData": {
                "createdAt": _now(),
                "createdBy": "tester@example.invalid",
                "createdByType": "User",
                "lastModifiedAt": _now(),
            },
        }

    def _workspace(self) -> dict[str, Any]:
        return {
            "id": self.arm_id,
            "name": self.workspace,
            "type": "Microsoft.MachineLearningServices/workspaces",
            "location": "westeurope",
            "identity": {"type": "SystemAssigned"},
            "properties": {
                "workspaceId": self.workspace_id,
                "discoveryUrl": f"{self.server.url}/discovery",
                "provisioningState": "Succeeded",
                "friendlyName": self.workspace,
                "storageAccount": f"/subscriptions/{self.subscription}/resourceGroups/"
                f"{self.resource_group}/providers/Microsoft.Storage/"
                f"storageAccounts/{ACCOUNT}",
                "keyVault": self.key_vault.arm_id,
                "mlFlowTrackingUri": f"azureml://westeurope.api.azureml.ms/mlflow/v1.0{self.arm_id}",
            },
        }

    def _compute(self, cluster: Cluster) -> dict[str, Any]:
        return {
            **self._resource(
                "computes",
                cluster.name,
                {
                    "computeType": "AmlCompute",
                    "provisioningState": "Succeeded",
                    "computeLocation": "westeurope",
                    "properties": {
                        "vmSize": cluster.vm_size,
                        "vmPriority": cluster.vm_priority,
                        "scaleSettings": {
                            "maxNodeCount": cluster.max_nodes,
                            "minNodeCount": 0,
                            "nodeIdleTimeBeforeScaleDown": "PT120S",
                        },
                        "osType": "Linux",
                        "currentNodeCount": 0,
                        "targetNodeCount": 0,
                    },
                },
            ),
            "location": "westeurope",
        }

    def _datastore(self, name: str) -> dict[str, Any]:
        return self._resource(
            "datastores",
            name,
            {
                "datastoreType": "AzureBlob",
                "accountName": ACCOUNT,
                "containerName": self.datastores[name],
                "endpoint": "core.windows.net",
                "protocol": "https",
                "isDefault": name == DEFAULT_DATASTORE,
                "credentials": {"credentialsType": "AccountKey"},
                "serviceDataAccessAuthIdentity": "None",
            },
        )

    def _job_resource(self, job: LoopbackJob) -> dict[str, Any]:
        with job.lock:
            props = json.loads(json.dumps(job.spec))
            props["status"] = job.state
            if job.ended_at is not None and time.monotonic() - job.ended_at < self.record_lag_s:
                props["status"] = CANCEL_REQUESTED if job.state == CANCELED else FINALIZING
            for name, output in (props.get("outputs") or {}).items():
                output.setdefault("uri", self.output_uri(job.name, name, output))
            props["services"] = {
                "Studio": {"jobServiceType": "Studio", "endpoint": f"{self.server.url}/studio/runs/{job.name}"}
            }
            props.setdefault("properties", {})
        return self._resource("jobs", job.name, props)

    def output_uri(self, job_name: str, output_name: str, output: Mapping[str, Any]) -> str:
        """Where an output lives: its own ``uri``, else Azure ML's default path for it."""
        return output.get("uri") or (
            f"azureml://datastores/{DEFAULT_DATASTORE}/paths/azureml/{job_name}/{output_name}/"
        )

    def _run_details(self, job: LoopbackJob) -> dict[str, Any]:
        with job.lock:
            state, error = job.state, job.error
        details: dict[str, Any] = {
            "runId": job.name,
            "runUuid": str(uuid.uuid5(uuid.NAMESPACE_URL, job.name)),
            "status": state,
            "target": job.spec.get("computeId", "").rsplit("/", 1)[-1],
            "createdTimeUtc": job.created,
            "startTimeUtc": job.started,
            "endTimeUtc": job.ended,
            "properties": {},
            "tags": {},
            "logFiles": {
                name: f"{self.server.url}/loopback/logs/{job.name}/{name}?sv=2021-08-06&sig=loopback"
                for name in job.log_files()
            },
        }
        if error:
            details["error"] = {"error": {"code": "UserError", "message": error}}
        return details

    # ------------------------------------------------------------ routes
    def _register_routes(self) -> None:
        s, p = self.server, ARM_PREFIX
        arm = self._in_scope
        s.route("GET", p, arm(lambda r, m: self._workspace()))
        s.route(
            "GET",
            "/discovery",
            lambda r, m: {
                key: self.server.url
                for key in (
                    "api",
                    "catalog",
                    "experimentation",
                    "gallery",
                    "history",
                    "hyperdrive",
                    "labeling",
                    "modelmanagement",
                    "pipelines",
                    "studiometadata",
                )
            },
        )
        s.route("GET", p + "/computes", arm(lambda r, m: {"value": [self._compute(c) for c in self.clusters.values()]}))
        s.route("GET", p + r"/computes/(?P<name>[^/]+)", arm(self._get_compute))
        s.route("GET", p + "/datastores", arm(self._list_datastores))
        s.route("GET", p + r"/datastores/(?P<name>[^/]+)", arm(self._get_datastore))
        s.route(
            "POST",
            p + r"/datastores/(?P<name>[^/]+)/listSecrets",
            arm(self._datastore_secrets),
        )
        s.route("GET", p + r"/codes/(?P<name>[^/]+)/versions", arm(self._list_codes))
        s.route(
            "POST",
            p + r"/codes/(?P<name>[^/]+)/versions/(?P<version>[^/]+)/startPendingUpload",
            arm(self._pending_upload),
        )
        for kind, store in (("codes", self.codes), ("environments", self.environments)):
            put, get = self._asset_versions(kind, store)
            s.route("PUT", p + rf"/{kind}/(?P<name>[^/]+)/versions/(?P<version>[^/]+)", arm(put))
            s.route("GET", p + rf"/{kind}/(?P<name>[^/]+)/versions/(?P<version>[^/]+)", arm(get))
        s.route("PUT", p + r"/jobs/(?P<name>[^/]+)", arm(self._put_job))
        s.route("GET", p + r"/jobs/(?P<name>[^/]+)", arm(self._get_job))
        s.route("POST", p + r"/jobs/(?P<name>[^/]+)/cancel", arm(self._cancel_job))
        s.route("GET", r"/loopback/operations/(?P<op>[^/]+)", lambda r, m: Response(200, {"status": "Succeeded"}))
        s.route("GET", "/history/v1.0" + p + r"/runs/(?P<name>[^/]+)/details", arm(self._get_run_details))
        s.route("GET", r"/loopback/logs/(?P<name>[^/]+)/(?P<path>.+)", self._get_log)
        s.route("GET", r"/loopback/msi/token", self._msi_token)
        s.route("POST", "/history/v1.0" + p + "/rundata", arm(self._get_run_data))
        s.route("POST", "/data/v1.0" + p + "/dataversion/batchGetResolvedUris", arm(self._resolve_data_uris))

    def _in_scope(self, handler: Any) -> Any:
        """``handler`` for this workspace's requests; ARM's 404 for any other subscription, resource
        group (the subscription has only this workspace's) or workspace."""

        def scoped(r: Request, m: re.Match[str]) -> Any:
            if m["sub"] != self.subscription:
                return Response(
                    404, error_body("SubscriptionNotFound", f"The subscription '{m['sub']}' could not be found.")
                )
            if m["rg"].lower() != self.resource_group.lower():
                return Response(
                    404, error_body("ResourceGroupNotFound", f"Resource group '{m['rg']}' could not be found.")
                )
            if m["ws"] != self.workspace:
                return Response(
                    404,
                    error_body(
                        "ResourceNotFound",
                        (
                            f"The Resource 'Microsoft.MachineLearningServices/workspaces/{m['ws']}' under resource "
                            "group "
                            f"'{m['rg']}' was not found."
                        ),
                    ),
                )
            return handler(r, m)

        return scoped

    def _job(self, m: re.Match[str]) -> LoopbackJob | None:
        with self._lock:
            return self.jobs.get(m["name"])

    @staticmethod
    def _not_found(what: str) -> Response:
        return Response(404, error_body("ResourceNotFound", f"{what} was not found."))

    def _get_compute(self, r: Request, m: re.Match[str]) -> Response | dict:
        cluster = self.clusters.get(m["name"])
        return self._compute(cluster) if cluster else self._not_found(f"Compute {m['name']}")

    def _list_datastores(self, r: Request, m: re.Match[str]) -> dict:
        names = [DEFAULT_DATASTORE] if r.param("isDefault") == "true" else list(self.datastores)
        return {"value": [self._datastore(n) for n in names]}

    def _get_datastore(self, r: Request, m: re.Match[str]) -> Response | dict:
        return self._datastore(m["name"]) if m["name"] in self.datastores else self._not_found(f"Datastore {m['name']}")

    def _list_codes(self, r: Request, m: re.Match[str]) -> dict:
        wanted = r.param("hash")
        with self._lock:
            found = [
                self._resource("codes", f"{n}/versions/{v}", body)
                for (n, v), body in self.codes.items()
                if n == m["name"] and wanted and body.get("properties", {}).get("hash_sha256") == wanted
            ]
        return {"value": found}

    def _pending_upload(self, r: Request, m: re.Match[str]) -> dict:
        # a temporary container of its own per upload; the SDK takes the container from the URL
        container = f"code-{uuid.uuid4().hex}"
        self._container(container)
        blob_uri = f"{BLOB_URL}/{container}"
        return {
            "blobReferenceForConsumption": {
                "blobUri": blob_uri,
                "storageAccountArmId": f"{self.arm_id}/storage",
                "credential": {"credentialType": "SAS", "sasUri": f"{blob_uri}?{self._sas(container)}"},
            },
            "pendingUploadId": uuid.uuid4().hex,
            "pendingUploadType": "TemporaryBlobReference",
        }

    def _asset_versions(self, kind: str, store: dict[tuple[str, str], dict[str, Any]]) -> tuple[Any, Any]:
        """PUT and GET of ``<kind>/<name>/versions/<version>`` (code and environment versions), kept in ``store``."""

        def put(r: Request, m: re.Match[str]) -> Response:
            props = dict(r.body.get("properties") or {})
            with self._lock:
                store[(m["name"], m["version"])] = props
            return Response(201, self._resource(kind, f"{m['name']}/versions/{m['version']}", props))

        def get(r: Request, m: re.Match[str]) -> Response | dict:
            props = store.get((m["name"], m["version"]))
            if props is None:
                return self._not_found(f"{kind} {m['name']}:{m['version']}")
            return self._resource(kind, f"{m['name']}/versions/{m['version']}", props)

        return put, get

    def _put_job(self, r: Request, m: re.Match[str]) -> Response:
        name = m["name"]
        with self._lock:
            if name in self.jobs:
                return Response(409, error_body("UserError", f"A job with name {name} already exists."))
            job = LoopbackJob(name, dict(r.body["properties"]), self.root / "jobs" / name)
            job.set_state("NotStarted")
            self.jobs[name] = job
        threading.Thread(target=self._run, args=(job,), name=f"loopback-job-{name}", daemon=True).start()
        return Response(201, self._job_resource(job))

    def _get_job(self, r: Request, m: re.Match[str]) -> Response | dict:
        job = self._job(m)
        return self._job_resource(job) if job else self._not_found(f"Job {m['name']}")

    def _cancel_job(self, r: Request, m: re.Match[str]) -> Response:
        job = self._job(m)
        if job is None:
            return self._not_found(f"Job {m['name']}")
        job.cancel_event.set()
        return Response(
            202, None, {"Location": f"{self.server.url}/loopback/operations/{uuid.uuid4().hex}", "Retry-After": "0"}
        )

    def _get_run_details(self, r: Request, m: re.Match[str]) -> Response | dict:
        job = self._job(m)
        return self._run_details(job) if job else self._not_found(f"Run {m['name']}")

    def _output_asset_id(self, job: str, output: str) -> str:
        return f"azureml://locations/westeurope/workspaces/{self.workspace_id}/data/azureml_{job}_output_data_{output}/versions/1"

    def _get_run_data(self, r: Request, m: re.Match[str]) -> Response | dict:
        """A job's outputs as data assets (what ``jobs.download`` resolves before downloading)."""
        with self._lock:
            job = self.jobs.get(r.body.get("runId", ""))
        if job is None:
            return self._not_found(f"Run {r.body.get('runId')}")
        outputs = {
            name: {"assetId": self._output_asset_id(job.name, name), "type": entry.get("jobOutputType")}
            for name, entry in (job.spec.get("outputs") or {}).items()
        }
        return {"runMetadata": {**self._run_details(job), "outputs": outputs}}

    def _resolve_data_uris(self, r: Request, m: re.Match[str]) -> dict:
        values = {}
        with self._lock:
            jobs = list(self.jobs.values())
        for job in jobs:
            for name, entry in (job.spec.get("outputs") or {}).items():
                asset = self._output_asset_id(job.name, name)
                if asset in (r.body.get("values") or []):
                    _, path = self.parse_datastore_uri(self.output_uri(job.name, name, entry))
                    store, _ = self.parse_datastore_uri(self.output_uri(job.name, name, entry))
                    values[asset] = {
                        "uri": f"azureml://subscriptions/{self.subscription}/resourcegroups/"
                        f"{self.resource_group}/workspaces/{self.workspace}/datastores/{store}/"
                        f"paths/{path}/",
                        "type": entry.get("jobOutputType"),
                    }
        return {"values": values}

    def _msi_token(self, r: Request, m: re.Match[str]) -> Response:
        """Azure ML's managed identity endpoint (``MSI_ENDPOINT``, API 2017-09-01): a token of the
        cluster's identity for a process of a job run with it (its ``secret`` header)."""
        with self._lock:
            job = self._msi_secrets.get(r.headers.get("secret", ""))
        if job is None:
            return Response(401, error_body("Unauthorized", "the secret header is not a running job's"))
        expires = int(time.time()) + 3600
        return Response(
            200,
            {
                "access_token": unsigned_token(MANAGED_IDENTITY_CLAIMS, expires),
                "expires_on": str(expires),
                "resource": r.param("resource"),
                "token_type": "Bearer",
            },
        )

    def _get_log(self, r: Request, m: re.Match[str]) -> Response:
        job = self._job(m)
        path = (job.log_dir / m["path"]).resolve() if job else None
        if job is None or path is None or not path.is_file() or job.log_dir.resolve() not in path.parents:
            return Response(404, b"", {"x-ms-error-code": "BlobNotFound"})
        data = path.read_bytes()
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", r.headers.get("range") or r.headers.get("x-ms-range") or "")
        if not ranged or self.ignore_range:
            return Response(200, data, {"content-type": "text/plain"})
        start = int(ranged.group(1))
        end = min(int(ranged.group(2)) if ranged.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data):
            return Response(416, b"", {"content-range": f"bytes */{len(data)}"})
        return Response(
            206,
            data[start : end + 1],
            {"content-type": "text/plain", "content-range": f"bytes {start}-{end}/{len(data)}"},
        )

    # ------------------------------------------------------------ running a job
    def cancel(self, name: str) -> None:
        self.jobs[name].cancel_event.set()

    def preempt(self, name: str, *, hard: bool = False) -> None:
        """Evict the job's nodes, as a low-priority VM's eviction does: its processes get SIGTERM
        (SIGKILL after the grace period; at once with ``hard``), what its outputs hold is kept,
        and it is queued again and re-run."""
        job = self.jobs[name]
        job.preempt_hard = hard
        job.preempt_event.set()

    def wait(self, name: str, timeout: float = 300) -> LoopbackJob:
        job = self.jobs[name]
        if not job.done_event.wait(timeout):
            raise TimeoutError(f"loopback job {name} still {job.state} after {timeout} s")
        return job

    def _run(self, job: LoopbackJob) -> None:
        try:
            while True:
                job.preempt_event.clear()
                job.set_state(QUEUED)
                if self._pause(job, self.queue_s):
                    break
                preempted = self._attempt(job)
                if not preempted:
                    break
        except Exception as err:  # a bug here is the test's failure: keep it where the test sees it
            job.error = f"loopback workspace error: {type(err).__name__}: {err}"
            self.server.errors.append(f"job {job.name}: {err!r}")
            job.set_state(FAILED)
        finally:
            job.ended = _now()
            if job.state not in TERMINAL:
                job.set_state(CANCELED if job.cancel_event.is_set() else FAILED)
            job.done_event.set()

    def _pause(self, job: LoopbackJob, seconds: float) -> bool:
        """Sleep; True if the job was cancelled meanwhile (it then ends Canceled)."""
        if job.cancel_event.wait(seconds):
            job.set_state(CANCEL_REQUESTED)
            job.set_state(CANCELED)
            return True
        return False

    def _attempt(self, job: LoopbackJob) -> bool:
        """One run of the job; True if it was preempted (and is to be queued again)."""
        job.attempts += 1
        job.set_state(PREPARING)
        attempt_dir = job.workdir / f"attempt-{job.attempts}"
        code_dir, mounts = attempt_dir / "wd", {}
        code_dir.mkdir(parents=True)
        job.image = self._image(job)
        code_id = job.spec.get("codeId")
        if code_id:
            m = re.search(r"/codes/([^/]+)/versions/([^/]+)$", code_id)
            code = self.codes[(m.group(1), m.group(2))] if m else None
            if code is None:
                raise ValueError(f"the job names code {code_id}, which was never created")
            container, _, prefix = code["codeUri"].removeprefix(f"{BLOB_URL}/").partition("/")
            self.download_prefix(container, prefix, code_dir)
        for kind in ("inputs", "outputs"):
            for name, entry in (job.spec.get(kind) or {}).items():
                local = attempt_dir / kind / name
                local.mkdir(parents=True)
                uri = entry.get("uri") if kind == "inputs" else self.output_uri(job.name, name, entry)
                if uri:
                    store, path = self.parse_datastore_uri(uri)
                    self.download_prefix(self.datastores[store], path, local)
                mounts[(kind, name)] = (local, uri)
        if self._pause(job, 0):
            return False
        job.set_state(RUNNING)
        job.started = job.started or _now()
        ended = threading.Event()
        flusher = threading.Thread(target=self._flush_outputs, args=(mounts, ended), daemon=True)
        flusher.start()
        try:
            code = self._execute(job, code_dir, mounts)
        finally:
            ended.set()
            flusher.join()
        preempted = job.preempt_event.is_set() and not job.cancel_event.is_set()
        if not job.cancel_event.is_set():
            job.set_state(FINALIZING)
        # the mounted outputs hold what the job wrote, however it ended
        for (kind, _name), (local, uri) in mounts.items():
            if kind == "outputs" and uri:
                store, path = self.parse_datastore_uri(uri)
                self._sync_up(local, self.datastores[store], path)
        if preempted:
            return True
        job.exit_code = code
        if job.cancel_event.is_set():
            job.set_state(CANCELED)
        elif code == 0:
            job.set_state(COMPLETED)
        else:
            log = (
                "user_logs/std_log.txt"
                if (job.log_dir / "user_logs/std_log.txt").exists()
                else process_log(process_count(job.spec)) % 0
            )
            job.error = (
                f"Execution failed. User process 'bash' exited with status code {code}. Please check log "
                f"file '{log}' for error details."
            )
            job.set_state(FAILED)
        return False

    def _flush_outputs(self, mounts: dict, ended: threading.Event) -> None:
        """While a job runs, every :attr:`mount_flush_s`: the files of its mounted outputs that are new
        or changed since, into their datastore -- as Azure ML's read-write mount (blobfuse) uploads a
        file once it is written. Files removed stay until the job's end makes the datastore hold
        exactly what the job left."""
        written: dict[Path, tuple[int, int]] = {}
        outputs = [
            (local, self._container(self.datastores[store]), path.strip("/"))
            for (kind, _name), (local, uri) in mounts.items()
            if kind == "outputs" and uri
            for store, path in [self.parse_datastore_uri(uri)]
        ]
        while not ended.wait(self.mount_flush_s):
            for local, container, prefix in outputs:
                for file in Path(local).rglob("*"):
                    try:
                        stat = file.stat()
                        if not file.is_file() or written.get(file) == (stat.st_mtime_ns, stat.st_size):
                            continue
                        with open(file, "rb") as f:
                            container.upload_blob(f"{prefix}/{file.relative_to(local).as_posix()}", f, overwrite=True)
                        written[file] = (stat.st_mtime_ns, stat.st_size)
                    except OSError:
                        continue  # a temporary file, replaced meanwhile

    def _image(self, job: LoopbackJob) -> str | None:
        """The image of the job's environment: its ``image``, or the one built from its build context
        (by the first job that needs it)."""
        m = re.search(r"/environments/([^/]+)/versions/([^/]+)$", job.spec.get("environmentId") or "")
        environment = self.environments.get((m.group(1), m.group(2))) if m else None
        if environment is None:
            raise ValueError(f"the job names environment {job.spec.get('environmentId')}, which was never created")
        build = environment.get("build")
        if not build:
            return environment.get("image")
        key = (m.group(1), m.group(2))
        # one build per version, and the workspace answers meanwhile (a build takes a while: its
        # context comes from Azurite)
        with self._build_lock:
            if key not in self.image_builds:
                self.image_builds[key] = self._build_image(*key, build)
            return self.image_builds[key].image

    def _build_image(self, name: str, version: str, build: Mapping[str, Any]) -> ImageBuild:
        uri, dockerfile = build.get("contextUri") or "", build.get("dockerfilePath") or "Dockerfile"
        context = self.root / "image-builds" / name / version
        container, _, prefix = uri.removeprefix(f"{BLOB_URL}/").partition("/")
        if not uri.startswith(f"{BLOB_URL}/") or not self.download_prefix(container, prefix, context):
            raise ValueError(f"environment {name}:{version}'s build context {uri or '(none)'} holds no files")
        if not (context / dockerfile).is_file():
            raise ValueError(f"environment {name}:{version}'s build context has no {dockerfile}")
        tag = uuid.uuid5(uuid.NAMESPACE_URL, f"{self.workspace_id}/{name}/{version}").hex
        return ImageBuild(name, version, context, f"{self.workspace_id[:8]}.azurecr.io/azureml/azureml_{tag}")

    def _execute(self, job: LoopbackJob, code_dir: Path, mounts: dict) -> int:
        spec = job.spec
        paths = {(kind, name): str(local) for (kind, name), (local, _) in mounts.items()}
        command = _PLACEHOLDER.sub(lambda m: paths[(m.group(1), m.group(2))], spec["command"])
        env = {
            "PATH": f"{self._bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "AZUREML_RUN_ID": job.name,
            "AZUREML_ARM_WORKSPACE_NAME": self.workspace,
            "AZUREML_ARM_SUBSCRIPTION": self.subscription,
            "AZUREML_ARM_RESOURCEGROUP": self.resource_group,
            **{f"AZURE_ML_{kind[:-1].upper()}_{name}": path for (kind, name), path in paths.items()},
            # the node's trust store and network: they reach the workspace's key vault (through the proxy)
            "REQUESTS_CA_BUNDLE": str(self.server.certificate.ca_bundle),
            "SSL_CERT_FILE": str(self.server.certificate.ca_bundle),
            **{k: v for k, v in self.environment.items() if k.lower() in ("https_proxy", "no_proxy")},
            **(spec.get("environmentVariables") or {}),
        }
        if (spec.get("identity") or {}).get("identityType") == "Managed":
            # a job run as the cluster's managed identity: Azure ML's token endpoint for it
            secret = uuid.uuid4().hex
            with self._lock:
                self._msi_secrets[secret] = job.name
            env.update(
                MSI_ENDPOINT=f"{self.server.url}/loopback/msi/token",
                MSI_SECRET=secret,
                DEFAULT_IDENTITY_CLIENT_ID=MANAGED_IDENTITY_CLAIMS["appid"],
            )
        instances = int((spec.get("resources") or {}).get("instanceCount") or 1)
        dist = spec.get("distribution") or {}
        per_node = int(dist.get("processCountPerInstance") or 1)
        world = process_count(spec)
        logs = job.log_dir / "user_logs"
        logs.mkdir(parents=True, exist_ok=True)
        kind = dist.get("distributionType")
        if kind == "Mpi":
            env.update({"AZ_BATCHAI_MPI_MASTER_NODE": "127.0.0.1"})
            if instances > 1:
                env["AZ_BATCH_MASTER_NODE"] = "127.0.0.1:6105"
            rank_log = f'$(printf {process_log(world)} "$OMPI_COMM_WORLD_RANK")'
            per_rank = f'exec > "{job.log_dir}/{rank_log}" 2>&1; {command}'
            argv = [
                shutil.which("mpirun") or "mpirun",
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                str(world),
                "--bind-to",
                "none",
                "bash",
                "-c",
                per_rank,
            ]
            job.process_env = env
            self._start(job, [(argv, env, logs / "mpirun.txt")], code_dir)
        elif kind == "PyTorch":
            port = free_ports(2)[0]  # MASTER_PORT, and the next one for ddlkit's control plane
            starts = []
            for rank in range(world):
                rank_env = {
                    **env,
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "WORLD_SIZE": str(world),
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank % per_node),
                    "NODE_RANK": str(rank // per_node),
                }
                starts.append((["bash", "-c", command], rank_env, job.log_dir / (process_log(world) % rank)))
            job.process_env = starts[0][1]
            self._start(job, starts, code_dir)
        else:
            job.process_env = env
            self._start(job, [(["bash", "-c", command], env, logs / "std_log.txt")], code_dir)
        return self._supervise(job)

    def _start(self, job: LoopbackJob, starts: list, cwd: Path) -> None:
        job.processes = []
        for argv, env, log in starts:
            with open(log, "ab") as out:
                job.processes.append(
                    subprocess.Popen(
                        argv,
                        cwd=cwd,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )

    def _supervise(self, job: LoopbackJob) -> int:
        """Wait for the processes; on a cancel or an eviction SIGTERM them (SIGKILL after the
        grace period). The job's code: the first non-zero exit status, else 0."""
        stopping_since: float | None = None
        while any(p.poll() is None for p in job.processes):
            if stopping_since is None and (job.cancel_event.is_set() or job.preempt_event.is_set()):
                if job.cancel_event.is_set():
                    job.set_state(CANCEL_REQUESTED)
                stopping_since = time.monotonic()
                _signal_all(
                    job.processes,
                    signal.SIGKILL if job.preempt_hard and not job.cancel_event.is_set() else signal.SIGTERM,
                )
            if stopping_since is not None and time.monotonic() - stopping_since > self.grace_period_s:
                _signal_all(job.processes, signal.SIGKILL)
            # a process that failed stops the job, as Azure ML does when a process of a distributed job fails
            if any((p.poll() or 0) != 0 for p in job.processes) and stopping_since is None:
                stopping_since = time.monotonic()
                _signal_all(job.processes, signal.SIGTERM)
            time.sleep(0.05)
        codes = [p.returncode for p in job.processes]
        failed = [c for c in codes if c != 0]
        code = failed[0] if failed else 0
        return 128 - code if code < 0 else code


def process_count(spec: Mapping[str, Any]) -> int:
    """The processes of a job (``properties`` as PUT): instances x processes per instance."""
    instances = int((spec.get("resources") or {}).get("instanceCount") or 1)
    return instances * int((spec.get("distribution") or {}).get("processCountPerInstance") or 1)


def process_log(processes: int) -> str:
    """The log of each process of several as Azure ML names it, a printf format of the rank: the rank
    zero-padded to the width of the process count (``std_log_process_0.txt`` of 2 processes,
    ``std_log_process_00.txt`` of 10 or more)."""
    return f"user_logs/std_log_process_%0{len(str(processes))}d.txt"


def _signal_all(processes: list[subprocess.Popen], sig: int) -> None:
    for p in processes:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
