"""A loopback Azure Batch AI service (API 2018-05-01) and the Azure Files share its clusters mount,
served on 127.0.0.1 by a :class:`~ddlkit_azure.testing.loopback.LoopbackServer`, with jobs that really run.

Batch AI was retired in 2019; this follows the published REST API
(``specification/batchai/resource-manager/Microsoft.BatchAI/stable/2018-05-01`` and its
``examples/``) for what ``azure-mgmt-batchai`` 7.0.0 sends:

* workspaces, experiments, file servers (create, list, delete), clusters and jobs (create, get,
  delete), ``listOutputFiles`` and ``terminate``. Creates, deletes and terminate are long-running:
  they answer 202 with a ``Location`` (an ``operationresults`` URL) and ``Retry-After``
  (:attr:`BatchAILoopback.retry_after_s`, 0 by default: the SDK waits 30 s between polls without
  it), and the location answers 202 for :attr:`BatchAILoopback.polls` polls, then 200. A request
  without a bearer token is 401, another api-version is 400, and every create body is checked
  against the published schema (:data:`SCHEMA`: required properties, known properties, enums): a
  body that does not fit is 400 ``InvalidRequestContent`` naming what is wrong, and is kept in
  :attr:`BatchAILoopback.invalid`;
* the Azure Files REST calls ``azure-storage-file-share`` makes to upload files (create
  directory, create file, put range), to ask whether a file exists (``HEAD``, Get File
  Properties: 404 ``ResourceNotFound``, or ``ParentNotFound`` without its directory) and downloads
  (``GET`` with ``Range``), under
  ``/<account>/<share>/...`` (path-style, as for an IP address), on a directory of this machine;
  download links carry a SAS the service issued, and a link it did not issue is refused (403);
  with :attr:`BatchAILoopback.ignore_range` a ranged download is answered 200 with the whole file;
* a cluster's file server is a directory of this machine (its "NFS export"); a cluster's nodes
  see ``$AZ_BATCHAI_MOUNT_ROOT/<relativeMountPath>`` of each mounted volume (symbolic links).

**Jobs run here.** A created job is ``queued`` for :attr:`BatchAILoopback.queue_s`, then
``running``: its job-preparation command runs once per node, then its toolkit -- custom MPI (and
Horovod) settings under the real ``mpirun`` with ``processCount`` processes and the host file in
``$AZ_BATCHAI_MPI_HOST_FILE`` (this machine, standing for every node): the node's shell runs
``mpirun <its options> <commandLine>``, so the command line is what the MPI runtime starts on every
rank (its first word the program), expanded by that shell once; a custom toolkit under ``bash`` --
with the job's environment variables and secrets, ``AZ_BATCHAI_*`` as the service sets them, and
*this machine's* ``python`` first on ``PATH`` in place of the image, which is only recorded (or, with
:attr:`BatchAILoopback.registry`, looked up: a job whose image the nodes cannot pull from it fails).
``stdout.txt``/``stderr.txt`` go to ``<stdOutErrPathPrefix>/<segment>/stdouterr``, output
directories to ``<pathPrefix>/<segment>/<pathSuffix>``. The job ends ``succeeded`` (exit 0) or
``failed``. ``terminate`` makes it ``terminating``: SIGTERM to the job's processes (but ``mpirun``),
SIGKILL to all of them after :attr:`BatchAILoopback.terminate_grace_s`. :meth:`BatchAILoopback.preempt`
takes a running job's node away: its processes are killed at once and the job ends ``failed``.

Secrets are never reported back (a job's ``secrets`` come back without values, as the API says).
Nothing here is ddlkit-specific; tests and the benchmark use it through the real SDK and CLI.
"""

from __future__ import annotations

import base64
import os
import re
import secrets as random_tokens
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ddlkit.compute.process import kill_session
from ddlkit.testing.registry import LoopbackRegistry

from .loopback import LoopbackServer, Request, Response, error_body

API_VERSION = "2018-05-01"
#: the storage account of the loopback Azure Files share, and its key (made up here; not a secret of anyone's)
FILES_ACCOUNT = "ddlkitfiles"
FILES_KEY = base64.b64encode(b"ddlkit loopback azure files key, not a secret").decode()
_WS = (
    r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.BatchAI/"
    r"workspaces/(?P<ws>[^/]+)"
)
_OPS = (
    r"/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.BatchAI/locations/(?P<loc>[^/]+)/"
    r"operationresults/(?P<op>[^/]+)"
)

# ---------------------------------------------------------------------------- the published schema
#: the create bodies' definitions (2018-05-01): required properties, and each known property's type:
#: a definition's name, ``[definition]`` for an array of it, a tuple of allowed values, or a Python type
SCHEMA: dict[str, dict[str, Any]] = {
    "WorkspaceCreateParameters": {"required": ["location"], "properties": {"location": str, "tags": dict}},
    "FileServerCreateParameters": {"required": [], "properties": {"properties": "FileServerBaseProperties"}},
    "FileServerBaseProperties": {
        "required": ["vmSize", "sshConfiguration", "dataDisks"],
        "properties": {
            "vmSize": str,
            "sshConfiguration": "SshConfiguration",
            "dataDisks": "DataDisks",
            "subnet": "ResourceId",
        },
    },
    "SshConfiguration": {
        "required": ["userAccountSettings"],
        "properties": {"publicIPsToAllow": list, "userAccountSettings": "UserAccountSettings"},
    },
    "UserAccountSettings": {
        "required": ["adminUserName"],
        "properties": {"adminUserName": str, "adminUserSshPublicKey": str, "adminUserPassword": str},
    },
    "DataDisks": {
        "required": ["diskSizeInGB", "diskCount", "storageAccountType"],
        "properties": {
            "diskSizeInGB": int,
            "cachingType": ("none", "readonly", "readwrite"),
            "diskCount": int,
            "storageAccountType": ("Standard_LRS", "Premium_LRS"),
        },
    },
    "ResourceId": {"required": ["id"], "properties": {"id": str}},
    "ClusterCreateParameters": {"required": [], "properties": {"properties": "ClusterBaseProperties"}},
    "ClusterBaseProperties": {
        "required": ["vmSize", "userAccountSettings"],
        "properties": {
            "vmSize": str,
            "vmPriority": ("dedicated", "lowpriority"),
            "scaleSettings": "ScaleSettings",
            "virtualMachineConfiguration": dict,
            "nodeSetup": "NodeSetup",
            "userAccountSettings": "UserAccountSettings",
            "subnet": "ResourceId",
        },
    },
    "ScaleSettings": {
        "required": [],
        "properties": {"manual": "ManualScaleSettings", "autoScale": "AutoScaleSettings"},
    },
    "ManualScaleSettings": {
        "required": ["targetNodeCount"],
        "properties": {
            "targetNodeCount": int,
            "nodeDeallocationOption": ("requeue", "terminate", "waitforjobcompletion"),
        },
    },
    "AutoScaleSettings": {
        "required": ["minimumNodeCount", "maximumNodeCount"],
        "properties": {"minimumNodeCount": int, "maximumNodeCount": int, "initialNodeCount": int},
    },
    "NodeSetup": {
        "required": [],
        "properties": {"setupTask": dict, "mountVolumes": "MountVolumes", "performanceCountersSettings": dict},
    },
    "MountVolumes": {
        "required": [],
        "properties": {
            "azureFileShares": ["AzureFileShareReference"],
            "azureBlobFileSystems": [dict],
            "fileServers": ["FileServerReference"],
            "unmanagedFileSystems": [dict],
        },
    },
    "AzureFileShareReference": {
        "required": ["accountName", "azureFileUrl", "credentials", "relativeMountPath"],
        "properties": {
            "accountName": str,
            "azureFileUrl": str,
            "credentials": "AzureStorageCredentialsInfo",
            "relativeMountPath": str,
            "fileMode": str,
            "directoryMode": str,
        },
    },
    "AzureStorageCredentialsInfo": {
        "required": [],
        "properties": {"accountKey": str, "accountKeySecretReference": dict},
    },
    "FileServerReference": {
        "required": ["fileServer", "relativeMountPath"],
        "properties": {
            "fileServer": "ResourceId",
            "sourceDirectory": str,
            "relativeMountPath": str,
            "mountOptions": str,
        },
    },
    "JobCreateParameters": {"required": [], "properties": {"properties": "JobBaseProperties"}},
    "JobBaseProperties": {
        "required": ["cluster", "nodeCount", "stdOutErrPathPrefix"],
        "properties": {
            "schedulingPriority": ("low", "normal", "high"),
            "cluster": "ResourceId",
            "mountVolumes": "MountVolumes",
            "nodeCount": int,
            "containerSettings": "ContainerSettings",
            "cntkSettings": dict,
            "pyTorchSettings": dict,
            "tensorFlowSettings": dict,
            "caffeSettings": dict,
            "caffe2Settings": dict,
            "chainerSettings": dict,
            "customToolkitSettings": "CustomToolkitSettings",
            "customMpiSettings": "CustomMpiSettings",
            "horovodSettings": "HorovodSettings",
            "jobPreparation": "JobPreparation",
            "stdOutErrPathPrefix": str,
            "inputDirectories": ["InputDirectory"],
            "outputDirectories": ["OutputDirectory"],
            "environmentVariables": ["EnvironmentVariable"],
            "secrets": ["EnvironmentVariableWithSecretValue"],
            "constraints": "JobConstraints",
        },
    },
    "JobConstraints": {"required": [], "properties": {"maxWallClockTime": str}},
    "ContainerSettings": {
        "required": ["imageSourceRegistry"],
        "properties": {"imageSourceRegistry": "ImageSourceRegistry", "shmSize": str},
    },
    "ImageSourceRegistry": {"required": ["image"], "properties": {"serverUrl": str, "image": str, "credentials": dict}},
    "CustomToolkitSettings": {"required": [], "properties": {"commandLine": str}},
    "CustomMpiSettings": {"required": ["commandLine"], "properties": {"commandLine": str, "processCount": int}},
    "HorovodSettings": {
        "required": ["pythonScriptFilePath"],
        "properties": {
            "pythonScriptFilePath": str,
            "pythonInterpreterPath": str,
            "commandLineArgs": str,
            "processCount": int,
        },
    },
    "JobPreparation": {"required": ["commandLine"], "properties": {"commandLine": str}},
    "InputDirectory": {"required": ["id", "path"], "properties": {"id": str, "path": str}},
    "OutputDirectory": {
        "required": ["id", "pathPrefix"],
        "properties": {"id": str, "pathPrefix": str, "pathSuffix": str},
    },
    "EnvironmentVariable": {"required": ["name", "value"], "properties": {"name": str, "value": str}},
    "EnvironmentVariableWithSecretValue": {
        "required": ["name"],
        "properties": {"name": str, "value": str, "valueSecretReference": dict},
    },
}
_TOOLKITS = (
    "cntkSettings",
    "pyTorchSettings",
    "tensorFlowSettings",
    "caffeSettings",
    "caffe2Settings",
    "chainerSettings",
    "customToolkitSettings",
    "customMpiSettings",
    "horovodSettings",
)


def schema_errors(definition: str, value: Any, where: str = "") -> list[str]:
    """What in ``value`` does not fit the published definition (empty: it fits)."""
    spec = SCHEMA[definition]
    if not isinstance(value, dict):
        return [f"{where or definition}: expected an object ({definition})"]
    errors = [f"{where}{name}: required by {definition}" for name in spec["required"] if name not in value]
    for name, item in value.items():
        path = f"{where}{name}"
        if name not in spec["properties"]:
            errors.append(f"{path}: not a property of {definition}")
            continue
        errors.extend(_type_errors(spec["properties"][name], item, path))
    return errors


def _type_errors(kind: Any, value: Any, path: str) -> list[str]:
    if isinstance(kind, str):
        return schema_errors(kind, value, f"{path}.")
    if isinstance(kind, list):
        if not isinstance(value, list):
            return [f"{path}: expected an array"]
        return [e for i, v in enumerate(value) for e in _type_errors(kind[0], v, f"{path}[{i}]")]
    if isinstance(kind, tuple):
        return [] if value in kind else [f"{path}: {value!r} is not one of {', '.join(kind)}"]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        return [f"{path}: expected an integer"]
    return [] if isinstance(value, kind) else [f"{path}: expected {kind.__name__}"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _cores(vm_size: str) -> int:
    """vCPUs of a VM size, as its name says them (Standard_NC24rs_v3: 24)."""
    match = re.search(r"_[A-Za-z]+(\d+)", vm_size)
    return int(match.group(1)) if match else 1


# ---------------------------------------------------------------------------- jobs that run
@dataclass
class _RunningJob:
    process: subprocess.Popen | None = None
    terminated: bool = False
    thread: threading.Thread | None = None


@dataclass
class _Operation:
    remaining: int
    #: called once when the operation completes (the resource's state changes then)
    on_done: Callable[[], None] | None = None
    #: the resource a create's Location answers with once done (a Location-polled LRO's result)
    path: str | None = None


@dataclass
class BatchAILoopback:
    """The service, on ``server``, with its state (file servers, shares, job directories) under ``root``."""

    server: LoopbackServer
    root: Path
    location: str = "eastus"
    #: polls of an operation's Location answered 202 before the 200
    polls: int = 1
    retry_after_s: int = 0
    #: how long an operation takes when nobody polls for it
    operation_s: float = 0.5
    #: how long a created job stays queued
    queue_s: float = 0.2
    terminate_grace_s: float = 10.0
    #: dedicated cores a subscription may use (clusters' nodes x the VM size's cores); None: no limit
    core_quota: int | None = None
    #: the interpreter that stands for the image's ``python``
    python: str = sys.executable
    #: the subscription's resource groups (a request under another is ARM's 404 ``ResourceGroupNotFound``);
    #: None: any name is one
    resource_groups: set[str] | None = None
    #: answer a ranged download 200 with the whole file, as a server that ignores ``Range`` does
    ignore_range: bool = False
    #: where the nodes pull images from (anonymously, as a job without registry credentials does): a job
    #: whose image it does not let them pull fails, as a failed pull fails it; None: images are only recorded
    registry: LoopbackRegistry | None = None
    #: create bodies that did not fit the schema: (method, path, errors)
    invalid: list[tuple[str, str, list[str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.resources: dict[str, dict[str, Any]] = {}
        self._operations: dict[str, _Operation] = {}
        self._jobs: dict[str, _RunningJob] = {}
        self._sas: set[str] = set()
        self._lock = threading.RLock()
        self.share_dir(FILES_ACCOUNT, "share").mkdir(parents=True, exist_ok=True)
        self._routes()

    # ------------------------------------------------------------ what tests use
    @property
    def share_url(self) -> str:
        """The loopback Azure Files share (``compute.file_share.url``); its key is :data:`FILES_KEY`."""
        return f"{self.server.url}/{FILES_ACCOUNT}/share"

    def share_dir(self, account: str, share: str) -> Path:
        return self.root / "shares" / account / share

    def file_server_dir(self, name: str) -> Path:
        """The file server's "NFS export" on this machine."""
        return self.root / "fileservers" / name.lower() / "export"

    def add_file_server(
        self,
        sub: str,
        rg: str,
        ws: str,
        name: str,
        *,
        vm_size: str = "Standard_D14_v2",
        state: str = "creating",
        ready_after_s: float | None = None,
        disks: tuple[int, int] = (4, 512),
        disk_type: str = "Premium_LRS",
    ) -> None:
        """A file server someone else created (maybe still being created)."""
        path = (
            f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.BatchAI/workspaces/{ws}/fileServers/{name}"
        )
        body = {
            "properties": {
                "vmSize": vm_size,
                "sshConfiguration": {"userAccountSettings": {"adminUserName": "x"}},
                "dataDisks": {"diskCount": disks[0], "diskSizeInGB": disks[1], "storageAccountType": disk_type},
            }
        }
        self._store(path, "Microsoft.BatchAI/FileServers", body, state)
        if ready_after_s is not None:
            threading.Timer(ready_after_s, self._provisioned, (path,)).start()

    def job_processes(self, name: str) -> int | None:
        """The session id of a running job's processes (its command's pid), None when not running."""
        with self._lock:
            for path, run in self._jobs.items():
                if path.endswith(f"/jobs/{name.lower()}") and run.process is not None and run.process.poll() is None:
                    return run.process.pid
        return None

    def preempt(self, name: str) -> None:
        """What losing a running job's node does (a low-priority node preempted, a node that failed):
        every process of the job is killed at once, with no notice, and the job ends ``failed``. The
        published API has no state of its own for it (a job is queued, running, terminating,
        succeeded or failed, and the service does not re-queue it): the killed command's exit code
        in ``executionInfo`` (137: SIGKILL) is what tells a node's loss from the job's own failure."""
        with self._lock:
            running = [
                run.process
                for path, run in self._jobs.items()
                if path.endswith(f"/jobs/{name.lower()}") and run.process is not None and run.process.poll() is None
            ]
        if not running:
            raise ValueError(f"job {name} is not running")
        kill_session(running[0].pid, signal.SIGKILL)

    def stop(self) -> None:
        """Kill what still runs (a test's end)."""
        with self._lock:
            runs = list(self._jobs.values())
        for run in runs:
            if run.process is not None and run.process.poll() is None:
                kill_session(run.process.pid, signal.SIGKILL)

    # ------------------------------------------------------------ routing
    def _routes(self) -> None:
        route = self.server.route
        # routes are tried newest first: the shares' catch-all goes first, so it is tried last
        route("*", r"/(?P<account>(?!subscriptions/|providers/)[a-z0-9]+)/(?P<share>[^/]+)(?P<path>/.*)?", self._files)
        route("GET", _OPS, self._operation)
        for method in ("PUT", "GET", "DELETE"):
            route(method, _WS, self._resource("Microsoft.BatchAI/Workspaces", "WorkspaceCreateParameters"))
            route(method, _WS + r"/experiments/(?P<exp>[^/]+)", self._resource("Microsoft.BatchAI/Experiments", None))
            route(
                method,
                _WS + r"/fileServers/(?P<fs>[^/]+)",
                self._resource("Microsoft.BatchAI/FileServers", "FileServerCreateParameters"),
            )
            route(
                method,
                _WS + r"/clusters/(?P<cluster>[^/]+)",
                self._resource("Microsoft.BatchAI/Clusters", "ClusterCreateParameters"),
            )
            route(
                method,
                _WS + r"/experiments/(?P<exp>[^/]+)/jobs/(?P<job>[^/]+)",
                self._resource("Microsoft.BatchAI/Jobs", "JobCreateParameters"),
            )
        route("GET", _WS + r"/fileServers", self._list("fileservers"))
        route("GET", _WS + r"/clusters", self._list("clusters"))
        route("GET", _WS + r"/experiments/(?P<exp>[^/]+)/jobs", self._list("jobs"))
        route("POST", _WS + r"/experiments/(?P<exp>[^/]+)/jobs/(?P<job>[^/]+)/listOutputFiles", self._list_output_files)
        route("POST", _WS + r"/experiments/(?P<exp>[^/]+)/jobs/(?P<job>[^/]+)/terminate", self._terminate)

    def _refuse(self, request: Request) -> Response | None:
        if request.auth_scheme != "Bearer":
            return Response(
                401, error_body("AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing.")
            )
        group = re.match(r"/subscriptions/[^/]+/resourceGroups/([^/]+)/", request.path)
        if (
            group
            and self.resource_groups is not None
            and group[1].lower() not in {g.lower() for g in self.resource_groups}
        ):
            return Response(
                404, error_body("ResourceGroupNotFound", f"Resource group '{group[1]}' could not be found.")
            )
        if request.param("api-version") != API_VERSION:
            return Response(
                400,
                error_body(
                    "InvalidApiVersionParameter",
                    f"The api-version '{request.param('api-version')}' is invalid. The "
                    f"supported versions are '{API_VERSION}'.",
                ),
            )
        return None

    def _accepted(
        self, sub: str, on_done: Callable[[], None] | None = None, body: Any = None, path: str | None = None
    ) -> Response:
        op = str(uuid.uuid4())
        with self._lock:
            self._operations[op] = _Operation(self.polls, on_done, path)
        # the service finishes the operation whether or not the client polls for it
        timer = threading.Timer(self.operation_s, self._complete, (op,))
        timer.daemon = True
        timer.start()
        location = (
            f"{self.server.url}/subscriptions/{sub}/providers/Microsoft.BatchAI/locations/{self.location}/"
            f"operationresults/{op}?api-version={API_VERSION}"
        )
        return Response(202, body, {"Location": location, "Retry-After": str(self.retry_after_s)})

    def _operation(self, request: Request, match: re.Match[str]) -> Response:
        if refused := self._refuse(request):
            return refused
        with self._lock:
            op = self._operations.get(match["op"])
            if op is None:
                return Response(404, error_body("NotFound", f"no operation {match['op']}"))
            if op.remaining > 0:
                op.remaining -= 1
                return Response(
                    202,
                    None,
                    {
                        "Location": f"{self.server.url}{request.path}?api-version={API_VERSION}",
                        "Retry-After": str(self.retry_after_s),
                    },
                )
        self._complete(match["op"])
        with self._lock:
            resource = self.resources.get(op.path.lower()) if op.path else None
        return Response(200, self._shown(resource) if resource is not None else None)

    # ------------------------------------------------------------ resources
    def _complete(self, op_id: str) -> None:
        with self._lock:
            op = self._operations.get(op_id)
            done = op.on_done if op is not None else None
            if op is not None:
                op.remaining, op.on_done = 0, None
        if done is not None:
            done()

    def _store(self, path: str, kind: str, body: dict[str, Any], state: str) -> dict[str, Any]:
        properties = dict(body.get("properties") or {})
        properties.update(provisioningState=state, creationTime=_now(), provisioningStateTransitionTime=_now())
        resource = {"id": path, "name": path.rsplit("/", 1)[-1], "type": kind, "properties": properties}
        if "location" in body:
            resource["location"] = body["location"]
        with self._lock:
            self.resources[path.lower()] = resource
        return resource

    def _provisioned(self, path: str) -> None:
        with self._lock:
            resource = self.resources.get(path.lower())
            if resource is not None and resource["properties"]["provisioningState"] == "creating":
                resource["properties"].update(provisioningState="succeeded", provisioningStateTransitionTime=_now())

    def _resource(self, kind: str, definition: str | None) -> Callable[[Request, re.Match[str]], Response]:
        def handle(request: Request, match: re.Match[str]) -> Response:
            if refused := self._refuse(request):
                return refused
            path = request.path.rstrip("/")
            with self._lock:
                existing = self.resources.get(path.lower())
            if request.method == "GET":
                if existing is None:
                    return Response(404, error_body("NotFound", f"The resource {path} was not found."))
                return Response(200, self._shown(existing))
            if request.method == "DELETE":
                if existing is None:
                    return Response(204)
                return self._accepted(match["sub"], lambda: self._delete(path))
            body = request.body if isinstance(request.body, dict) else {}
            if definition is not None:
                errors = schema_errors(definition, body)
                if errors:
                    self.invalid.append((request.method, path, errors))
                    return Response(400, error_body("InvalidRequestContent", "; ".join(errors)))
            if existing is not None and kind == "Microsoft.BatchAI/Jobs":
                return Response(409, error_body("JobAlreadyExists", f"Job {path.rsplit('/', 1)[-1]} already exists."))
            if kind == "Microsoft.BatchAI/Clusters" and (refused := self._over_quota(body)):
                return refused
            if kind == "Microsoft.BatchAI/Jobs":
                problem = self._job_problem(body)
                if problem:
                    return Response(400, error_body("InvalidRequestContent", problem))
            resource = self._store(path, kind, body, "creating")
            if kind == "Microsoft.BatchAI/FileServers":
                self.file_server_dir(resource["name"]).mkdir(parents=True, exist_ok=True)
                resource["properties"]["mountSettings"] = {
                    "mountPoint": "/mnt/data",
                    "fileServerInternalIP": "127.0.0.1",
                }
            if kind == "Microsoft.BatchAI/Clusters":
                self._allocate(resource)
            if kind == "Microsoft.BatchAI/Jobs":
                self._queue(path, resource, match)
            return self._accepted(match["sub"], lambda: self._provisioned(path), path=path)

        return handle

    def _shown(self, resource: dict[str, Any]) -> dict[str, Any]:
        """What a GET answers: no secret (job secrets without values, no account key, no password)."""
        return _without_secrets(resource)

    def _delete(self, path: str) -> None:
        with self._lock:
            self.resources.pop(path.lower(), None)
            run = self._jobs.pop(path.lower(), None)
        if run is not None and run.process is not None and run.process.poll() is None:
            kill_session(run.process.pid, signal.SIGKILL)

    def _list(self, what: str) -> Callable[[Request, re.Match[str]], Response]:
        def handle(request: Request, match: re.Match[str]) -> Response:
            if refused := self._refuse(request):
                return refused
            prefix = request.path.rstrip("/").lower() + "/"
            parent = request.path.rstrip("/").rsplit("/", 1)[0]
            with self._lock:
                if parent.lower() not in self.resources:  # the workspace (or experiment) the list is of
                    return Response(
                        404,
                        error_body(
                            "ResourceNotFound",
                            (
                                f"The Resource '{parent.split('/providers/', 1)[1]}' under resource group "
                                f"'{match['rg']}' was not found."
                            ),
                        ),
                    )
                found = [
                    self._shown(r)
                    for p, r in self.resources.items()
                    if p.startswith(prefix) and "/" not in p[len(prefix) :]
                ]
            return Response(200, {"value": found})

        return handle

    def _over_quota(self, body: dict[str, Any]) -> Response | None:
        if self.core_quota is None:
            return None
        props = body.get("properties", {})
        scale = props.get("scaleSettings", {})
        nodes = (
            (scale.get("manual") or {}).get("targetNodeCount")
            or (scale.get("autoScale") or {}).get("maximumNodeCount")
            or 0
        )
        asked = nodes * _cores(str(props.get("vmSize", "")))
        if asked <= self.core_quota:
            return None
        return Response(
            400,
            error_body(
                "QuotaExceeded",
                (
                    f"Operation results in exceeding quota limits of Core. Maximum allowed: {self.core_quota}, "
                    "Current in "
                    f"use: 0, Additional requested: {asked}. Please read more about quota increase at "
                    "https://aka.ms/quotaincrease."
                ),
            ),
        )

    def _allocate(self, cluster: dict[str, Any]) -> None:
        props = cluster["properties"]
        scale = props.get("scaleSettings", {})
        nodes = (
            (scale.get("manual") or {}).get("targetNodeCount")
            or (scale.get("autoScale") or {}).get("initialNodeCount")
            or 0
        )
        props.update(
            allocationState="steady",
            currentNodeCount=nodes,
            nodeStateCounts={
                "idleNodeCount": nodes,
                "runningNodeCount": 0,
                "preparingNodeCount": 0,
                "unusableNodeCount": 0,
                "leavingNodeCount": 0,
            },
        )

    # ------------------------------------------------------------ jobs
    def _job_problem(self, body: dict[str, Any]) -> str | None:
        props = body.get("properties", {})
        toolkits = [t for t in _TOOLKITS if t in props]
        if len(toolkits) != 1:
            return f"a job needs exactly one toolkit's settings; got {', '.join(toolkits) or 'none'}"
        with self._lock:
            cluster = self.resources.get(str(props["cluster"]["id"]).lower())
        if cluster is None:
            return f"the cluster {props['cluster']['id']} does not exist"
        return None

    def _queue(self, path: str, job: dict[str, Any], match: re.Match[str]) -> None:
        props = job["properties"]
        segment = (
            f"{match['sub']}/{match['rg']}/workspaces/{match['ws']}/experiments/{match['exp']}/jobs/"
            f"{match['job']}/{uuid.uuid4()}"
        )
        props.update(
            jobOutputDirectoryPathSegment=segment,
            executionState="queued",
            executionStateTransitionTime=_now(),
            toolType=_tool_type(props),
            schedulingPriority=props.get("schedulingPriority", "normal"),
        )
        props.setdefault("constraints", {"maxWallClockTime": "P7D"})
        run = _RunningJob()
        with self._lock:
            self._jobs[path.lower()] = run
        run.thread = threading.Thread(
            target=self._run, args=(path, run), name=f"batchai-job-{match['job']}", daemon=True
        )
        run.thread.start()

    def _set(self, path: str, **changes: Any) -> None:
        with self._lock:
            resource = self.resources.get(path.lower())
            if resource is not None:
                resource["properties"].update(changes)

    def _mount_root(self, cluster: dict[str, Any]) -> Path:
        """The cluster's $AZ_BATCHAI_MOUNT_ROOT: each mounted volume at its relative mount path."""
        root = self.root / "clusters" / cluster["name"].lower() / "mounts"
        root.mkdir(parents=True, exist_ok=True)
        volumes = (cluster["properties"].get("nodeSetup") or {}).get("mountVolumes") or {}
        for share in volumes.get("azureFileShares", []):
            account, name = self._share_of(share["azureFileUrl"])
            _link(root / share["relativeMountPath"], self.share_dir(account, name))
        for server in volumes.get("fileServers", []):
            server_name = server["fileServer"]["id"].rsplit("/", 1)[-1]
            _link(root / server["relativeMountPath"], self.file_server_dir(server_name))
        return root

    def _share_of(self, url: str) -> tuple[str, str]:
        parts = [p for p in url.split("://", 1)[-1].split("/")[1:] if p]
        host = url.split("://", 1)[-1].split("/")[0]
        if ".file." in host:
            return host.split(".")[0], parts[-1]
        return parts[0], parts[1]

    def _run(self, path: str, run: _RunningJob) -> None:
        time.sleep(self.queue_s)
        with self._lock:
            job = self.resources.get(path.lower())
            cluster = self.resources.get(str(job["properties"]["cluster"]["id"]).lower()) if job else None
        if job is None or run.terminated:
            return
        props = job["properties"]
        if cluster is None:
            self._end(path, None, [{"code": "ClusterNotFound", "message": "The job's cluster was deleted."}])
            return
        image = props["containerSettings"]["imageSourceRegistry"]["image"]
        if self.registry is not None and not self.registry.pullable(image):
            self._end(path, None, [{"code": "ImagePullFailed", "message": f"The nodes could not pull image {image}."}])
            return
        mounts = self._mount_root(cluster)
        nodes = int(props["nodeCount"])
        segment = props["jobOutputDirectoryPathSegment"]
        temp = self.root / "jobs" / segment.replace("/", "_") / "temp"
        temp.mkdir(parents=True, exist_ok=True)
        env = self._environment(props, mounts, temp, nodes)
        stdouterr = Path(_expand(props["stdOutErrPathPrefix"], env)) / segment / "stdouterr"
        stdouterr.mkdir(parents=True, exist_ok=True)
        self._set(
            path, executionState="running", executionStateTransitionTime=_now(), executionInfo={"startTime": _now()}
        )
        with open(stdouterr / "stdout.txt", "ab") as out, open(stdouterr / "stderr.txt", "ab") as err:
            preparation = (props.get("jobPreparation") or {}).get("commandLine")
            for _ in range(nodes if preparation else 0):  # on each node, before the toolkit
                code = self._execute(run, ["bash", "-c", preparation], env, out, err)
                if code != 0 or run.terminated:
                    self._end(
                        path,
                        code,
                        [
                            {
                                "code": "JobPreparationFailed",
                                "message": f"The job preparation task failed with exit code {code}.",
                            }
                        ]
                        if code != 0
                        else None,
                    )
                    return
            code = self._execute(run, self._command(props, env), env, out, err)
        self._end(
            path,
            code,
            [{"code": "JobTerminated", "message": "The job was terminated by the user."}] if run.terminated else None,
        )

    def _environment(self, props: Mapping[str, Any], mounts: Path, temp: Path, nodes: int) -> dict[str, str]:
        base = {k: os.environ[k] for k in ("HOME", "LANG", "PATH") if k in os.environ}
        env = {
            **base,
            "PATH": os.pathsep.join([str(Path(self.python).parent), base.get("PATH", os.defpath)]),
            "AZ_BATCHAI_MOUNT_ROOT": str(mounts),
            "AZ_BATCHAI_JOB_TEMP": str(temp),
            "AZ_BATCHAI_JOB_MOUNT_ROOT": str(temp / "mounts"),
            # the cluster's nodes: OpenMPI as root, loopback networking, yielding waits (several "nodes" share cores)
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "GLOO_SOCKET_IFNAME": "lo",
            "OMPI_MCA_mpi_yield_when_idle": "1",
        }
        for var in props.get("environmentVariables") or []:
            env[var["name"]] = var["value"]
        for var in props.get("secrets") or []:
            env[var["name"]] = var.get("value", "")
        for directory in props.get("inputDirectories") or []:
            env[f"AZ_BATCHAI_INPUT_{directory['id']}"] = _expand(directory["path"], env)
        for directory in props.get("outputDirectories") or []:
            out = (
                Path(_expand(directory["pathPrefix"], env))
                / props["jobOutputDirectoryPathSegment"]
                / directory.get("pathSuffix", "")
            )
            out.mkdir(parents=True, exist_ok=True)
            env[f"AZ_BATCHAI_OUTPUT_{directory['id']}"] = str(out)
        processes = self._process_count(props)
        hostfile = temp / "hostfile"
        hostfile.write_text(f"localhost slots={processes}\n")
        env["AZ_BATCHAI_MPI_HOST_FILE"] = str(hostfile)
        env["AZ_BATCHAI_JOB_NODE_COUNT"] = str(nodes)
        return env

    @staticmethod
    def _process_count(props: Mapping[str, Any]) -> int:
        for toolkit in ("customMpiSettings", "horovodSettings"):
            if toolkit in props:
                return int(props[toolkit].get("processCount") or props["nodeCount"])
        return int(props["nodeCount"])

    def _command(self, props: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
        # "the command line to be executed by mpi runtime on each compute node" (the API's words):
        # appended to the service's mpirun line, which the node's shell runs (exec: the job's command
        # is mpirun itself, which terminate spares)
        mpirun = shlex.join(
            [
                "exec",
                "mpirun",
                "-np",
                str(self._process_count(props)),
                "--hostfile",
                env["AZ_BATCHAI_MPI_HOST_FILE"],
                "--oversubscribe",
                "--bind-to",
                "none",
            ]
        )
        if "customMpiSettings" in props:
            return ["bash", "-c", f"{mpirun} {props['customMpiSettings']['commandLine']}"]
        if "horovodSettings" in props:
            h = props["horovodSettings"]
            python = h.get("pythonInterpreterPath") or "python"
            line = f"{python} {h['pythonScriptFilePath']} {h.get('commandLineArgs', '')}"
            return ["bash", "-c", f"{mpirun} {line}"]
        if "customToolkitSettings" in props:
            return ["bash", "-c", props["customToolkitSettings"].get("commandLine", "")]
        raise ValueError(f"the loopback runs custom, custom MPI and Horovod jobs, not {_tool_type(props)}")

    def _execute(self, run: _RunningJob, command: list[str], env: Mapping[str, str], out: Any, err: Any) -> int:
        with self._lock:
            if run.terminated:
                return -signal.SIGTERM
            run.process = subprocess.Popen(
                command,
                env=dict(env),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=env["AZ_BATCHAI_JOB_TEMP"],
                start_new_session=True,
            )
        code = run.process.wait()
        kill_session(run.process.pid, signal.SIGKILL)  # whatever the command left behind
        return code

    def _end(self, path: str, code: int | None, errors: list[dict[str, str]] | None) -> None:
        info = {"endTime": _now()}
        with self._lock:
            resource = self.resources.get(path.lower())
            if resource is not None:
                info = {**resource["properties"].get("executionInfo", {}), **info}
        if code is not None:
            info["exitCode"] = code if code >= 0 else 128 - code
        if errors:
            info["errors"] = errors
        state = "succeeded" if code == 0 and not errors else "failed"
        self._set(path, executionState=state, executionStateTransitionTime=_now(), executionInfo=info)

    def _terminate(self, request: Request, match: re.Match[str]) -> Response:
        if refused := self._refuse(request):
            return refused
        path = request.path.rsplit("/", 1)[0]
        with self._lock:
            run = self._jobs.get(path.lower())
            job = self.resources.get(path.lower())
        if job is None or run is None:
            return Response(404, error_body("NotFound", f"The job {path} was not found."))
        if job["properties"].get("executionState") in ("succeeded", "failed"):
            return Response(200)
        with self._lock:
            run.terminated = True
            process = run.process
        self._set(path, executionState="terminating", executionStateTransitionTime=_now())
        if process is not None and process.poll() is None:
            _stop(process, self.terminate_grace_s)
        elif process is None:
            self._end(path, None, [{"code": "JobTerminated", "message": "The job was terminated by the user."}])
        return self._accepted(match["sub"])

    def _list_output_files(self, request: Request, match: re.Match[str]) -> Response:
        if refused := self._refuse(request):
            return refused
        path = request.path.rsplit("/", 1)[0]
        with self._lock:
            job = self.resources.get(path.lower())
        if job is None:
            return Response(404, error_body("NotFound", f"The job {path} was not found."))
        props = job["properties"]
        wanted = request.param("outputdirectoryid")
        segment = props["jobOutputDirectoryPathSegment"]
        if wanted == "stdouterr":
            prefix, suffix = props["stdOutErrPathPrefix"], "stdouterr"
        else:
            found = [d for d in props.get("outputDirectories") or [] if d["id"] == wanted]
            if not found:
                return Response(400, error_body("InvalidOutputDirectory", f"The job has no output directory {wanted}."))
            prefix, suffix = found[0]["pathPrefix"], found[0].get("pathSuffix", "")
        share = self._share_for(prefix, props)
        if share is None:
            return Response(
                400,
                error_body(
                    "OutputDirectoryNotOnStorage",
                    "Output files can be listed only for "
                    "output directories on an Azure File Share or a Storage Container.",
                ),
            )
        account, name, below = share
        directory = (request.param("directory") or ".").strip("/")
        rel = "/".join(p for p in [below, segment, suffix, directory] if p and p != ".")
        base = self.share_dir(account, name) / rel
        expiry = int(request.param("linkexpiryinminutes") or 60)
        entries = []
        for item in sorted(base.iterdir()) if base.is_dir() else []:
            if item.is_dir():
                entries.append({"name": item.name, "fileType": "directory"})
                continue
            stat = item.stat()
            entries.append(
                {
                    "name": item.name,
                    "fileType": "file",
                    "downloadUrl": self._download_url(account, name, f"{rel}/{item.name}", expiry),
                    "properties": {
                        "lastModified": datetime.fromtimestamp(stat.st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "contentLength": stat.st_size,
                    },
                }
            )
        return Response(200, {"value": entries})

    def _share_for(self, prefix: str, props: Mapping[str, Any]) -> tuple[str, str, str] | None:
        """(account, share, folder below the share) of an output prefix on a mounted Azure Files share."""
        with self._lock:
            cluster = self.resources.get(str(props["cluster"]["id"]).lower())
        volumes = ((cluster or {}).get("properties", {}).get("nodeSetup") or {}).get("mountVolumes") or {}
        for share in volumes.get("azureFileShares", []):
            mount = f"$AZ_BATCHAI_MOUNT_ROOT/{share['relativeMountPath']}"
            if prefix.rstrip("/") == mount or prefix.startswith(mount + "/"):
                account, name = self._share_of(share["azureFileUrl"])
                return account, name, prefix.rstrip("/")[len(mount) :].strip("/")
        return None

    def _download_url(self, account: str, share: str, rel: str, minutes: int) -> str:
        sig = random_tokens.token_urlsafe(24)
        with self._lock:
            self._sas.add(sig)
        expiry = datetime.fromtimestamp(time.time() + 60 * minutes, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{self.server.url}/{account}/{share}/{rel}?sv=2017-04-17&sr=f&sp=r&se={expiry}&sig={sig}"

    # ------------------------------------------------------------ Azure Files
    def _files(self, request: Request, match: re.Match[str]) -> Response:
        signed = request.param("sig")
        if request.auth_scheme != "SharedKey" and (signed is None or signed not in self._sas):
            return Response(403, b"", {"x-ms-error-code": "AuthenticationFailed"})
        if request.method != "GET" and request.auth_scheme != "SharedKey":
            return Response(403, b"", {"x-ms-error-code": "AuthorizationPermissionMismatch"})
        root = self.share_dir(match["account"], match["share"])
        if not root.is_dir():
            return Response(404, b"", {"x-ms-error-code": "ShareNotFound"})
        rel = (match["path"] or "/").strip("/")
        target = (root / rel).resolve()
        if target != root.resolve() and root.resolve() not in target.parents:
            return Response(400, b"", {"x-ms-error-code": "InvalidResourceName"})
        stamp = {
            "ETag": f'"0x{time.monotonic_ns():X}"',
            "Last-Modified": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
            "x-ms-request-server-encrypted": "true",
        }
        if request.method == "PUT" and request.param("restype") == "directory":
            if not target.parent.is_dir():
                return Response(404, b"", {"x-ms-error-code": "ParentNotFound"})
            if target.exists():
                return Response(409, b"", {"x-ms-error-code": "ResourceAlreadyExists"})
            target.mkdir()
            return Response(201, b"", stamp)
        if request.method == "PUT" and request.param("comp") == "range":
            first, last = (int(x) for x in request.headers["x-ms-range"].removeprefix("bytes=").split("-"))
            with open(target, "r+b") as f:
                f.seek(first)
                f.write(request.data[: last - first + 1])
            return Response(201, b"", stamp)
        if request.method == "PUT":
            if not target.parent.is_dir():
                return Response(404, b"", {"x-ms-error-code": "ParentNotFound"})
            with open(target, "wb") as f:
                f.truncate(int(request.headers.get("x-ms-content-length", "0")))
            return Response(201, b"", stamp)
        if request.method == "HEAD" and request.param("restype") is None:
            # Get File Properties: the headers alone; 404 names what is missing, the file or its directory
            if target.is_file():
                size = str(target.stat().st_size)
                return Response(200, target.read_bytes(), {**stamp, "x-ms-type": "File", "x-ms-content-length": size})
            code = "ResourceNotFound" if target.parent.is_dir() else "ParentNotFound"
            return Response(404, b"", {"x-ms-error-code": code})
        if request.method == "GET" and target.is_file():
            data = target.read_bytes()
            asked = request.headers.get("range") or request.headers.get("x-ms-range")
            if not asked or self.ignore_range:
                return Response(200, data, stamp)
            first_text, _, last_text = asked.removeprefix("bytes=").partition("-")
            first = int(first_text)
            if first >= len(data):
                return Response(416, b"", {"x-ms-error-code": "InvalidRange"})
            last = min(int(last_text) if last_text else len(data) - 1, len(data) - 1)
            return Response(
                206, data[first : last + 1], {**stamp, "Content-Range": f"bytes {first}-{last}/{len(data)}"}
            )
        return Response(404, b"", {"x-ms-error-code": "ResourceNotFound"})


def _without_secrets(resource: Any) -> Any:
    if isinstance(resource, dict):
        out = {}
        for key, value in resource.items():
            if key in ("accountKey", "adminUserPassword", "password"):
                continue
            if key == "secrets" and isinstance(value, list):
                out[key] = [{k: v for k, v in s.items() if k != "value"} for s in value]
            else:
                out[key] = _without_secrets(value)
        return out
    if isinstance(resource, list):
        return [_without_secrets(v) for v in resource]
    return resource


def _tool_type(props: Mapping[str, Any]) -> str:
    names = {
        "customMpiSettings": "custommpi",
        "customToolkitSettings": "custom",
        "horovodSettings": "horovod",
        "cntkSettings": "cntk",
        "tensorFlowSettings": "tensorflow",
        "caffeSettings": "caffe",
        "caffe2Settings": "caffe2",
        "chainerSettings": "chainer",
        "pyTorchSettings": "pytorch",
    }
    return next((v for k, v in names.items() if k in props), "custom")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced from ``env``, as the node's shell would."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), m.group(0)), text)


def _link(link: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    if link.is_symlink():
        link.unlink()
    link.symlink_to(target, target_is_directory=True)


def _stop(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the job's processes but the command itself (``mpirun``, which would kill the
    ranks at once), then SIGKILL to everything after ``grace_s``: the ranks get the time to
    checkpoint."""
    kill_session(process.pid, signal.SIGTERM, spare=process.pid)

    def kill() -> None:
        if process.poll() is None:
            kill_session(process.pid, signal.SIGKILL)

    timer = threading.Timer(grace_s, kill)
    timer.daemon = True
    timer.start()
