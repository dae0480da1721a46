"""Everything ``compute=batchai`` sends: Batch AI (``azure-mgmt-batchai`` 7.0.0, the ``BatchAI``
client, API 2018-05-01, which imports only with ``msrest`` installed) and the Azure Files share
(``azure-storage-file-share``). Imported on first use, never when ddlkit composes a config.

The SDK accepts 200 and 202 on creates (a 201 is an error); a 202 carries a ``Location`` the SDK
polls until it answers 200, waiting ``Retry-After`` seconds between polls (30 without it).

``Service(cfg, planning=True)`` runs the same code with the SDK's requests captured instead of
sent: an in-process stand-in answers as a service with nothing in it would (404 to every look-up,
success to every create), so ``ddlkit plan`` prints the exact requests, in order, with their
bodies, secrets redacted, with no credential and no network.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import posixpath
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3
from azure.core.credentials import AccessToken
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import HttpRequest, RequestsTransport
from azure.mgmt.batchai import BatchAI
from azure.mgmt.batchai import models as m

from ddlkit import ConfigError, JobSpec, RunError
from ddlkit.atomic import atomic_path, write_json
from ddlkit.compute.containers import default_image, horovod_image_note
from ddlkit.compute.gang import world_size
from ddlkit.compute.layout import CONTROL_ADDR_ENV, control_port
from ddlkit.compute.state import state_dir
from ddlkit.jobdir import CANCEL_FILE, CODE_DIR, CODE_FILE, RANKS_DIR, STATE_DIR
from ddlkit.redact import REDACTED, is_secret_key, scrub

from .arm import endpoint_of, first_line, management_credential, missing_scope, network_reason, signed_in, unreachable
from .batchai import (
    API_VERSION,
    JOB_DIRECTORY_ID,
    STDOUTERR,
    BatchAIConfig,
    Scale,
    batchai_name,
)
from .ranged import LogUnreadable, bytes_from, get_with_retries, range_header

#: the account key of the Azure Files share, when compute.file_share.account_key_file is not set
ACCOUNT_KEY_ENV = "AZURE_STORAGE_KEY"
#: the ranks' command runs in the job's output directory, copied from its input directory (and the
#: job's code snapshot from its folder on the share, ``{snapshot}``) once per job (the first node to
#: make the marker directory copies; the others wait for it)
PREPARE = (
    'out="$AZ_BATCHAI_OUTPUT_{id}"; mkdir -p "$out/{state}"; '
    'if mkdir "$out/{state}/copy" 2>/dev/null; then cp -a "$AZ_BATCHAI_INPUT_{id}/." "$out/"{snapshot} '
    '&& touch "$out/{state}/copied"; else while [ ! -e "$out/{state}/copied" ]; do sleep 1; done; fi'
)
#: the folder of the share (below compute.file_share.directory) that keeps the code snapshots, one per digest
SNAPSHOTS = "code"
#: what the ranks need to find rank 0: the first host of the service's MPI host file
RENDEZVOUS = (
    'export MASTER_ADDR="$(awk \'NF && $1 !~ /^#/ {{print $1; exit}}\' "$AZ_BATCHAI_MPI_HOST_FILE")" '
    'MASTER_PORT={port} PYTHONUNBUFFERED=1; export {control_env}="$MASTER_ADDR:{control}"; '
    'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-'
    '$(( $(nproc) / {per_node} > 0 ? $(nproc) / {per_node} : 1 ))}}"'
)
#: body keys whose values are secrets in Batch AI's requests
_SECRET_BODY_KEYS = {"accountKey", "adminUserPassword", "password"}
_PROGRESS_EVERY_S = 30.0
#: the methods azure-core retries when a connection drops (its own, and POST for requests that only read)
_READ_METHODS = frozenset({"HEAD", "GET", "PUT", "DELETE", "OPTIONS", "TRACE", "POST"})
#: tries of each request to the Azure Files share (ddlkit.storage.retry's back-off: 0.5 s, doubled each time)
SHARE_ATTEMPTS = 5
_TAIL_BYTES = 16384


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Recorded:
    """A request a plan would send."""

    method: str
    url: str
    body: Any = None
    note: str = ""


# ---------------------------------------------------------------------------- planning
class _PlanToken:
    """What the SDK's auth policy asks for while planning: no credential is read."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("planning-sends-nothing", int(time.time()) + 3600)


class EmptyService(requests.adapters.BaseAdapter):
    """The SDK's requests captured, not sent, and answered as a Batch AI service with nothing in
    it would: a look-up is 404 until a create (200, provisioned at once) made the resource."""

    def __init__(self, recorded: list[Recorded]) -> None:
        super().__init__()
        self.recorded = recorded
        self.resources: dict[str, dict[str, Any]] = {}

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        body = json.loads(request.body) if request.body else None
        self.recorded.append(Recorded(str(request.method), str(request.url), body))
        path = urlsplit(str(request.url)).path.rstrip("/")
        if request.method == "PUT":
            properties = {
                **(body or {}).get("properties", {}),
                "provisioningState": "succeeded",
                "executionState": "succeeded",
            }
            self.resources[path.lower()] = {
                **(body or {}),
                "id": path,
                "name": path.rsplit("/", 1)[-1],
                "properties": properties,
            }
            return self._answer(request, 200, self.resources[path.lower()])
        if request.method == "GET" and path.lower() in self.resources:
            return self._answer(request, 200, self.resources[path.lower()])
        if request.method == "GET" and path.lower().endswith("/fileservers"):
            found = [r for p, r in self.resources.items() if p.startswith(path.lower() + "/")]
            return self._answer(request, 200, {"value": found})
        if request.method == "POST":
            return self._answer(request, 200, {"value": []})
        return self._answer(request, 404, {"error": {"code": "NotFound", "message": "planning: nothing exists"}})

    @staticmethod
    def _answer(request: requests.PreparedRequest, status: int, body: Any) -> requests.Response:
        content = json.dumps(body).encode()
        response = requests.Response()
        response.status_code, response.reason = status, "OK" if status == 200 else "Not Found"
        response.raw = urllib3.HTTPResponse(
            body=io.BytesIO(content), status=status, preload_content=False, headers={"Content-Type": "application/json"}
        )
        response._content = content
        response.headers["Content-Type"] = "application/json"
        response.url, response.request, response.encoding = str(request.url), request, "utf-8"
        return response

    def close(self) -> None:
        pass


def redact_body(body: Any) -> Any:
    """A request body with its secrets replaced by ``***``: the account key and passwords, and the
    values of the job's ``secrets``."""
    if isinstance(body, dict):
        out = {}
        for key, value in body.items():
            if key in _SECRET_BODY_KEYS:
                out[key] = REDACTED
            elif key == "secrets" and isinstance(value, list):
                out[key] = [{**v, "value": REDACTED} if isinstance(v, dict) and "value" in v else v for v in value]
            else:
                out[key] = redact_body(value)
        return out
    if isinstance(body, list):
        return [redact_body(v) for v in body]
    return body


# ---------------------------------------------------------------------------- what ddlkit created
class Ledger:
    """The resources ddlkit created in one workspace (so that ``ddlkit compute down`` deletes only
    those): ``<state dir>/batchai/<subscription>/<resource group>/<workspace>.json``."""

    def __init__(self, cfg: BatchAIConfig) -> None:
        self.path = state_dir() / "batchai" / cfg.subscription_id / cfg.resource_group / f"{cfg.workspace}.json"

    def load(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))["created"]
        except (OSError, ValueError, KeyError):
            return {}

    def add(self, kind: str, resource_id: str, name: str) -> None:
        created = self.load()
        created[resource_id.lower()] = {"kind": kind, "name": name, "id": resource_id, "created": time.time()}
        write_json(self.path, {"created": created})

    def remove(self, resource_id: str) -> None:
        created = self.load()
        created.pop(resource_id.lower(), None)
        write_json(self.path, {"created": created})


# ---------------------------------------------------------------------------- the Azure Files share
@dataclass(frozen=True)
class FileShare:
    """``https://<account>.file.core.windows.net/<share>``, or path-style ``https://host:port/<account>/<share>``."""

    url: str

    @property
    def _parts(self) -> tuple[str, str, str]:
        parts = urlsplit(self.url.rstrip("/"))
        segments = [s for s in parts.path.split("/") if s]
        if parts.scheme != "https" or not segments:
            raise ConfigError(
                f"compute.file_share.url={self.url} is not an Azure Files share URL: write "
                "https://<account>.file.core.windows.net/<share>."
            )
        if ".file." in (parts.hostname or ""):
            return f"https://{parts.netloc}", parts.hostname.split(".")[0], segments[-1]
        if len(segments) != 2:
            raise ConfigError(
                f"compute.file_share.url={self.url}: a share URL without the account in its host "
                "names it first: https://<host>/<account>/<share>."
            )
        return f"https://{parts.netloc}/{segments[0]}", segments[0], segments[1]

    @property
    def account(self) -> str:
        return self._parts[1]

    def client(self, key: str) -> Any:
        from azure.storage.fileshare import ShareClient

        # an answer without a body (a HEAD refused 403) makes the SDK log a 12-line traceback of its XML
        # parser before raising; the error it raises is what ddlkit says, in one line
        logging.getLogger("azure.storage.fileshare").setLevel(logging.ERROR)
        account_url, account, share = self._parts
        # no silent retries of the SDK's own (15 s and more between them): ddlkit's retry loop
        # (ddlkit.storage.retry, as for Blob Storage) is the only one, and it says each retry
        return ShareClient(
            account_url=account_url,
            share_name=share,
            credential={"account_name": account, "account_key": key},
            retry_total=0,
        )


# ---------------------------------------------------------------------------- the service
class Service:
    """One workspace's resources and jobs, as ``cfg`` (``compute=batchai``) describes them."""

    def __init__(self, cfg: BatchAIConfig, *, planning: bool = False, say: Callable[[str], None] | None = None) -> None:
        self.cfg, self.planning = cfg, planning
        # a plan only describes: it creates nothing to speak of
        self.say = (lambda text: None) if planning else say or _stderr
        self.poll_interval_s = float(cfg.poll_interval_s)
        self.recorded: list[Recorded] = []
        self.share = FileShare(cfg.file_share.url)
        # the wait between polls of a long-running operation when the service sends no Retry-After
        # (azure-core also takes a Retry-After of 0 for none)
        options: dict[str, Any] = {"polling_interval": self.poll_interval_s}
        if planning:
            self._capture = EmptyService(self.recorded)
            session = requests.Session()
            session.mount("https://", self._capture)
            session.mount("http://", self._capture)
            options["transport"] = RequestsTransport(session=session, session_owner=True)
            credential: Any = _PlanToken()
        else:
            credential = management_credential()
        self.client = BatchAI(credential, cfg.subscription_id, base_url=cfg.endpoint.rstrip("/"), **options)
        self.ledger = Ledger(cfg)
        #: secret values this service knows (scrubbed from every message)
        self._secrets: dict[str, str] = {}
        self._stdout_url: dict[str, tuple[str, int]] = {}

    # ------------------------------------------------------------ errors and waiting
    @contextlib.contextmanager
    def _calling(self, what: str, *, missing_ok: bool = False) -> Iterator[None]:
        """The service's refusals as one-line errors. A 404 of the resource asked for passes as
        ``ResourceNotFoundError`` where the caller expects it (``missing_ok``: a look-up, a delete);
        a missing subscription or resource group, or a 404 nobody expects, is a ``ConfigError``."""
        with signed_in(what):
            try:
                yield
            except ClientAuthenticationError:
                raise  # signed_in's
            except ResourceNotFoundError as err:
                c = self.cfg
                wrong = missing_scope(err, what, subscription=c.subscription_id, resource_group=c.resource_group)
                if wrong is not None:
                    raise wrong from None
                if missing_ok:
                    raise
                raise ConfigError(f"{what}: Batch AI answered 404: {scrub(first_line(err), self._secrets)}") from None
            except HttpResponseError as err:
                raise ConfigError(
                    f"{what}: Batch AI answered {err.status_code}: {scrub(first_line(err), self._secrets)}"
                ) from None
            except (ServiceRequestError, ServiceResponseError) as err:
                # refused or dropped connections, once azure-core's retry policy gave up
                raise unreachable(what, err, service="Batch AI", secrets=self._secrets) from None

    def _look_up(self, what: str, get: Callable[[], Any]) -> Any | None:
        """What ``get()`` reads, or None when Batch AI answers that it does not exist."""
        with contextlib.suppress(ResourceNotFoundError), self._calling(what, missing_ok=True):
            return get()
        return None

    def _wait(self, poller: Any, what: str, *, limit_s: float | None = None) -> Any:
        """The long-running operation's result; a progress line every 30 s while it lasts."""
        started = time.monotonic()
        while not poller.done():
            poller.wait(timeout=_PROGRESS_EVERY_S)
            if not poller.done():
                minutes = (time.monotonic() - started) / 60
                self.say(f"ddlkit: {what}: still in progress ({minutes:.0f} min so far)")
                if limit_s is not None and time.monotonic() - started > limit_s:
                    raise ConfigError(
                        f"{what} has not finished within {limit_s:.0f} s; run again later (ddlkit "
                        "reuses what is there)."
                    )
        return poller.result()

    @property
    def _rg_ws(self) -> tuple[str, str]:
        return self.cfg.resource_group, self.cfg.workspace

    # ------------------------------------------------------------ resources
    def account_key(self) -> str:
        c = self.cfg.file_share
        if self.planning:
            return REDACTED
        if c.account_key_file:
            path = Path(c.account_key_file).expanduser()
            try:
                key = path.read_text(encoding="utf-8").strip()
            except OSError as err:
                raise ConfigError(
                    f"cannot read compute.file_share.account_key_file={path}: {err.strerror or err}"
                ) from None
        else:
            key = os.environ.get(ACCOUNT_KEY_ENV, "").strip()
        if not key:
            raise ConfigError(
                f"the cluster mounts the Azure Files share {c.url} with its account key: set "
                f"${ACCOUNT_KEY_ENV} or compute.file_share.account_key_file."
            )
        self._secrets["account_key"] = key
        return key

    def ssh_public_key(self) -> str:
        path = Path(self.cfg.cluster.ssh_public_key_file).expanduser()
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError:
            if self.planning:
                return f"<the public key in {path}>"
            raise ConfigError(
                f"compute.cluster.ssh_public_key_file={path} cannot be read: the nodes' admin user "
                f"signs in with a public key; create one (ssh-keygen -t rsa) or name yours."
            ) from None

    def users(self) -> m.UserAccountSettings:
        return m.UserAccountSettings(
            admin_user_name=self.cfg.cluster.admin_user, admin_user_ssh_public_key=self.ssh_public_key()
        )

    def needs_file_server(self) -> bool:
        return self.cfg.storage == "nfs" or self.cfg.stage_from is not None

    def ensure_workspace(self) -> Any:
        rg, ws = self._rg_ws
        found = self._look_up(f"looking up workspace {ws}", lambda: self.client.workspaces.get(rg, ws))
        if found is not None:
            return found
        self.say(f"ddlkit: creating Batch AI workspace {ws} in {self.cfg.location}")
        with self._calling(f"creating workspace {ws}"):
            workspace = self._wait(
                self.client.workspaces.begin_create(rg, ws, m.WorkspaceCreateParameters(location=self.cfg.location)),
                f"creating workspace {ws}",
            )
        self._created("workspace", workspace)
        return workspace

    def ensure_experiment(self) -> Any:
        rg, ws = self._rg_ws
        name = self.cfg.experiment
        found = self._look_up(f"looking up experiment {name}", lambda: self.client.experiments.get(rg, ws, name))
        if found is not None:
            return found
        with self._calling(f"creating experiment {name}"):
            experiment = self._wait(self.client.experiments.begin_create(rg, ws, name), f"creating experiment {name}")
        self._created("experiment", experiment)
        return experiment

    def _created(self, kind: str, resource: Any) -> None:
        if not self.planning:
            self.ledger.add(kind, resource.id, resource.name)

    def find_file_server(self) -> Any | None:
        """The file server of ``compute.file_server.name`` (API 2018-05-01's SDK lists file servers
        but cannot get one by name)."""
        rg, ws = self._rg_ws
        name = self.cfg.file_server.name
        with self._calling(f"listing the file servers of workspace {ws}"):
            return next(
                (f for f in self.client.file_servers.list_by_workspace(rg, ws) if str(f.name).lower() == name.lower()),
                None,
            )

    def file_server_parameters(self) -> m.FileServerCreateParameters:
        c = self.cfg.file_server
        return m.FileServerCreateParameters(
            vm_size=c.vm_size,
            ssh_configuration=m.SshConfiguration(user_account_settings=self.users()),
            data_disks=m.DataDisks(
                disk_size_in_gb=c.disk_size_gb, disk_count=c.disk_count, storage_account_type=c.disk_type
            ),
        )

    def ensure_file_server(self) -> Any:
        c = self.cfg.file_server
        rg, ws = self._rg_ws
        found = self.find_file_server()
        if found is None:
            self.say(
                f"ddlkit: creating NFS file server {c.name} ({c.vm_size}, {c.disk_count} x {c.disk_size_gb} GB "
                f"{c.disk_type})"
            )
            with self._calling(f"creating file server {c.name}"):
                found = self._wait(
                    self.client.file_servers.begin_create(rg, ws, c.name, self.file_server_parameters()),
                    f"creating file server {c.name}",
                    limit_s=c.wait_s,
                )
            self._created("file server", found)
        different = _differences(
            [
                ("compute.file_server.vm_size", found.vm_size, c.vm_size, str.lower),
                ("compute.file_server.disk_count", found.data_disks.disk_count, c.disk_count, None),
                ("compute.file_server.disk_size_gb", found.data_disks.disk_size_in_gb, c.disk_size_gb, None),
                ("compute.file_server.disk_type", found.data_disks.storage_account_type, c.disk_type, str.lower),
            ]
        )
        if different:
            raise ConfigError(
                f"file server {c.name} exists with other settings: {'; '.join(different)}. Use it as "
                "it is (set those options to its values), delete it with `ddlkit compute down` (if "
                "ddlkit created it), or choose another compute.file_server.name."
            )
        started, said = time.monotonic(), 0.0
        while str(found.provisioning_state).lower() in ("creating", "updating"):
            waited = time.monotonic() - started
            if waited > c.wait_s:
                raise ConfigError(
                    f"file server {c.name} is still being created after {waited:.0f} s: run again later, "
                    "or raise compute.file_server.wait_s."
                )
            if waited - said >= _PROGRESS_EVERY_S or said == 0.0:
                said = waited or 1e-9
                self.say(
                    f"ddlkit: file server {c.name} is still being created ({waited / 60:.0f} min so far); "
                    f"waiting up to compute.file_server.wait_s={c.wait_s:.0f} s"
                )
            time.sleep(min(self.poll_interval_s, _PROGRESS_EVERY_S))
            found = self.find_file_server()
            if found is None:
                raise ConfigError(f"file server {c.name} disappeared while it was being created; run again.")
        if str(found.provisioning_state).lower() != "succeeded":
            raise ConfigError(
                f"file server {c.name} is {found.provisioning_state}: delete it (`ddlkit compute down`, "
                "if ddlkit created it) and run again, or choose another compute.file_server.name."
            )
        return found

    def cluster_parameters(self, file_server: Any | None) -> m.ClusterCreateParameters:
        c, share = self.cfg.cluster, self.cfg.file_share
        nodes = self.cfg.nodes
        if c.scale == Scale.auto:
            scale = m.ScaleSettings(
                auto_scale=m.AutoScaleSettings(
                    minimum_node_count=c.min_nodes,
                    maximum_node_count=c.max_nodes or nodes,
                    initial_node_count=c.min_nodes,
                )
            )
        else:
            scale = m.ScaleSettings(
                manual=m.ManualScaleSettings(target_node_count=c.max_nodes or nodes, node_deallocation_option="requeue")
            )
        mounts = m.MountVolumes(
            azure_file_shares=[
                m.AzureFileShareReference(
                    account_name=self.share.account,
                    azure_file_url=share.url.rstrip("/"),
                    credentials=m.AzureStorageCredentialsInfo(account_key=self.account_key()),
                    relative_mount_path=share.mount_path,
                    file_mode="0777",
                    directory_mode="0777",
                )
            ]
        )
        if file_server is not None:
            mounts.file_servers = [
                m.FileServerReference(
                    file_server=m.ResourceId(id=file_server.id),
                    relative_mount_path=self.cfg.file_server.mount_path,
                    mount_options="rw",
                )
            ]
        return m.ClusterCreateParameters(
            vm_size=c.vm_size,
            vm_priority=c.vm_priority,
            scale_settings=scale,
            node_setup=m.NodeSetup(mount_volumes=mounts),
            user_account_settings=self.users(),
        )

    def ensure_cluster(self, file_server: Any | None) -> Any:
        c = self.cfg.cluster
        rg, ws = self._rg_ws
        existing = self._look_up(f"looking up cluster {c.name}", lambda: self.client.clusters.get(rg, ws, c.name))
        if existing is not None:
            self._check_cluster(existing, file_server)
            return existing
        self.say(
            f"ddlkit: creating cluster {c.name} ({self.cfg.nodes} x {c.vm_size}, {c.vm_priority}, {c.scale} scale)"
        )
        with self._calling(f"creating cluster {c.name}"):
            begun = self.client.clusters.begin_create(rg, ws, c.name, self.cluster_parameters(file_server))
            cluster = self._wait(begun, f"creating cluster {c.name}")
        self._created("cluster", cluster)
        if cluster.errors:
            raise ConfigError(
                f"cluster {c.name} was created but Batch AI reports: "
                + "; ".join(f"{e.code}: {e.message}" for e in cluster.errors)
                + " -- fix that (e.g. ask for more quota), then run again."
            )
        return cluster

    def _check_cluster(self, cluster: Any, file_server: Any | None) -> None:
        c = self.cfg.cluster
        nodes = self.cfg.nodes
        scale = cluster.scale_settings
        mode = "auto" if scale is not None and scale.auto_scale is not None else "manual"
        checks = [
            ("compute.cluster.vm_size", cluster.vm_size, c.vm_size, str.lower),
            ("compute.cluster.vm_priority", cluster.vm_priority, c.vm_priority, str.lower),
            ("compute.cluster.scale", mode, c.scale, None),
        ]
        different = _differences(checks)
        most = (
            (scale.auto_scale.maximum_node_count if mode == "auto" else scale.manual.target_node_count)
            if scale is not None
            else 0
        )
        if not different and most < nodes:
            different.append(f"it has at most {most} nodes (compute.nodes={nodes} asks for {nodes})")
        volumes = cluster.node_setup.mount_volumes if cluster.node_setup else None
        file_shares = (volumes.azure_file_shares or []) if volumes else []
        shares = {str(s.azure_file_url).rstrip("/").lower() for s in file_shares}
        if self.cfg.file_share.url.rstrip("/").lower() not in shares:
            different.append(f"it does not mount the Azure Files share {self.cfg.file_share.url}")
        servers = {str(f.file_server.id).lower() for f in (volumes.file_servers or [])} if volumes else set()
        if file_server is not None and str(file_server.id).lower() not in servers:
            different.append(f"it does not mount file server {self.cfg.file_server.name}")
        if different:
            raise ConfigError(
                f"cluster {c.name} exists with other settings: {'; '.join(different)}. Use it as it is "
                "(set those options to its values), delete it with `ddlkit compute down` (if ddlkit "
                "created it), or choose another compute.cluster.name."
            )
        if str(cluster.provisioning_state).lower() == "failed":
            raise ConfigError(
                f"cluster {c.name} failed to provision; delete it with `ddlkit compute down` (if ddlkit "
                "created it) and run again."
            )

    def prepare(self) -> tuple[Any, Any | None]:
        """The workspace, the experiment, the file server (when needed) and the cluster: created
        or reused. Returns (cluster, file server)."""
        self.ensure_workspace()
        self.ensure_experiment()
        file_server = self.ensure_file_server() if self.needs_file_server() else None
        return self.ensure_cluster(file_server), file_server

    # ------------------------------------------------------------ jobs
    def get_job(self, name: str) -> Any:
        found = self._job_exists(name)
        if found is None:
            raise ConfigError(
                f"Batch AI has no job {name} in experiment {self.cfg.experiment} of workspace "
                f"{self.cfg.workspace} (deleted, or another workspace?)."
            )
        return found

    def _job_exists(self, name: str) -> Any | None:
        rg, ws = self._rg_ws
        return self._look_up(f"looking up job {name}", lambda: self.client.jobs.get(rg, ws, self.cfg.experiment, name))

    def _create_job(self, name: str, parameters: m.JobCreateParameters) -> Any:
        rg, ws = self._rg_ws
        with self._calling(f"creating job {name}"):
            return self._wait(
                self.client.jobs.begin_create(rg, ws, self.cfg.experiment, name, parameters), f"creating job {name}"
            )

    def mount(self, path: str) -> str:
        return f"$AZ_BATCHAI_MOUNT_ROOT/{path}"

    @property
    def horovod(self) -> bool:
        """dist=horovod: the ranks need Horovod, which the job's image brings."""
        return self.cfg.dist == "horovod"

    def image(self) -> str:
        return self.cfg.image or default_image(
            self.cfg.framework, gpu=self.cfg.gpu, registry=self.cfg.registry, horovod=self.horovod
        )

    def _base_job(self, cluster: Any, nodes: int) -> dict[str, Any]:
        constraints = None
        if self.cfg.max_wall_clock_time:
            import isodate

            try:
                constraints = m.JobBasePropertiesConstraints(
                    max_wall_clock_time=isodate.parse_duration(self.cfg.max_wall_clock_time)
                )
            except (isodate.ISO8601Error, ValueError):
                raise ConfigError(
                    f"compute.max_wall_clock_time={self.cfg.max_wall_clock_time} is not an ISO 8601 "
                    "duration such as P7D or PT12H."
                ) from None
        return {
            "scheduling_priority": "normal",
            "cluster": m.ResourceId(id=cluster.id),
            "node_count": nodes,
            "container_settings": m.ContainerSettings(image_source_registry=m.ImageSourceRegistry(image=self.image())),
            "std_out_err_path_prefix": self.mount(self.cfg.file_share.mount_path),
            "constraints": constraints,
        }

    def job_parameters(self, spec: JobSpec, name: str, cluster: Any) -> m.JobCreateParameters:
        c = self.cfg
        python = c.python
        rank = [
            python,
            "-m",
            "ddlkit_mpi.rank",
            "--job-dir",
            ".",
            "--node-sizes",
            ",".join([str(c.procs_per_node)] * c.nodes),
            "--scratch",
            "$AZ_BATCHAI_JOB_TEMP/ddlkit",
            "--cancel-file",
            CANCEL_FILE,
            "--",
            *spec.command(python),
        ]
        # the node's variables stay for its shell to expand
        quoted = " ".join(f'"{a}"' if a.startswith("$AZ_BATCHAI") else shlex.quote(a) for a in rank)
        # the service's mpirun starts every rank in its own directory; the rank minder checks that it
        # runs where mpirun meant it to, so it is told the job directory is that place
        script = (
            RENDEZVOUS.format(
                port=c.master_port,
                control=control_port(c.master_port),
                control_env=CONTROL_ADDR_ENV,
                per_node=c.procs_per_node,
            )
            + f'; cd "$AZ_BATCHAI_OUTPUT_{JOB_DIRECTORY_ID}" && export OMPI_MCA_initial_wdir="$PWD" '
            f"&& exec {quoted}"
        )
        # mpirun starts the command line's program on every rank: the script is shell syntax, so
        # that program is a shell (the node's variables are expanded there, on each rank)
        command = shlex.join(["bash", "-c", script])
        job_dir = posixpath.join(self.mount(c.file_share.mount_path), self.job_folder(name))
        snapshot = ""
        if spec.code_digest:
            # the snapshot's folder holds code/ and code.json, as the job directory does
            folder = posixpath.join(self.mount(c.file_share.mount_path), self.snapshot_folder(spec.code_digest))
            snapshot = f' && cp -a "{folder}/." "$out/"'
        return m.JobCreateParameters(
            **self._base_job(cluster, c.nodes),
            custom_mpi_settings=m.CustomMpiSettings(command_line=command, process_count=world_size(c)),
            job_preparation=m.JobPreparation(
                command_line=PREPARE.format(id=JOB_DIRECTORY_ID, state=STATE_DIR, snapshot=snapshot)
            ),
            input_directories=[m.InputDirectory(id=JOB_DIRECTORY_ID, path=job_dir)],
            output_directories=[
                m.OutputDirectory(
                    id=JOB_DIRECTORY_ID, path_prefix=self.mount(c.file_share.mount_path), path_suffix="job"
                )
            ],
            environment_variables=[m.EnvironmentVariable(name=k, value=v) for k, v in sorted(spec.env.items())],
            secrets=[m.EnvironmentVariableWithSecretValue(name=k, value=v) for k, v in sorted(spec.secret_env.items())],
        )

    def job_folder(self, name: str) -> str:
        return posixpath.join(self.cfg.file_share.directory.strip("/"), "jobs", name)

    def snapshot_folder(self, digest: str) -> str:
        """Where the code snapshot with ``digest`` is kept on the share, for every job that ships it."""
        return posixpath.join(self.cfg.file_share.directory.strip("/"), SNAPSHOTS, digest)

    def free_job_name(self, base: str) -> str:
        """The job's name, or ``<name>-rN`` for a re-run of the same job directory (a Batch AI job
        cannot be created twice)."""
        name = batchai_name(base)
        attempt = 1
        while self._job_exists(name) is not None:
            attempt += 1
            name = batchai_name(base, f"-r{attempt}")
        return name

    def upload_job_dir(self, spec: JobSpec, name: str) -> None:
        """The job directory to ``<share>/<directory>/jobs/<name>/``: all but the launcher's
        ``STATE_DIR``, the exit records of an earlier run's ranks (``RANKS_DIR``: this job's ranks
        write their own) and the code snapshot, which has a folder of its own (:meth:`upload_snapshot`)."""
        folder = self.job_folder(name)
        if self.planning:
            self.recorded.append(
                Recorded(
                    "PUT",
                    f"{self.cfg.file_share.url.rstrip('/')}/{folder}/...",
                    None,
                    "Azure Files: the job directory (job.json, config.yaml, overrides.yaml, "
                    "environment.json, and checkpoints of a resumed job), file by file",
                )
            )
            return
        files = [
            p
            for p in sorted(Path(spec.job_dir).rglob("*"))
            if p.is_file() and p.relative_to(spec.job_dir).parts[0] not in (STATE_DIR, RANKS_DIR, CODE_DIR, CODE_FILE)
        ]
        self._upload(spec.job_dir, files, folder, "the job directory")

    def upload_snapshot(self, spec: JobSpec) -> None:
        """The job's code snapshot (``code/`` and ``code.json`` of its directory) to
        ``<share>/<directory>/code/<digest>/``, unless that digest's ``code.json`` is there: it is
        uploaded last, so its presence says every file before it arrived, and an unchanged tree
        is uploaded once. The job's preparation copies it into the job's directory."""
        folder = self.snapshot_folder(str(spec.code_digest))
        url = f"{self.cfg.file_share.url.rstrip('/')}/{folder}"
        if self.planning:
            self.recorded += [
                Recorded(
                    "HEAD",
                    f"{url}/{CODE_FILE}",
                    None,
                    "Azure Files: is the job's code snapshot there already? "
                    f"(then nothing of it is uploaded; its {CODE_FILE} is uploaded last)",
                ),
                Recorded(
                    "PUT",
                    f"{url}/...",
                    None,
                    f"Azure Files: the code snapshot, when it is not there: {CODE_DIR}/ file by file, then {CODE_FILE}",
                ),
            ]
            return
        share = self.share.client(self.account_key())
        try:
            there = self._share_retried(
                f"looking for the code snapshot at {url}",
                lambda: share.get_file_client(posixpath.join(folder, CODE_FILE)).exists(),
            )
            if there:
                return
        except HttpResponseError as err:
            raise ConfigError(
                f"looking for the code snapshot at {url}: {scrub(first_line(err), self._secrets)} "
                "(check the share and its account key)."
            ) from None
        code = Path(spec.job_dir) / CODE_DIR
        self._upload(
            spec.job_dir,
            [*(p for p in sorted(code.rglob("*")) if p.is_file()), Path(spec.job_dir) / CODE_FILE],
            folder,
            "the code snapshot",
        )

    def _upload(self, root: Path, files: Sequence[Path], folder: str, what: str) -> None:
        """``files`` (below ``root``) to ``folder`` of the share, at their paths relative to ``root``, in order."""
        share = self.share.client(self.account_key())
        made: set[str] = set()

        def put(rel: str) -> None:
            self._make_directories(share, posixpath.dirname(posixpath.join(folder, rel)), made)
            with open(root / rel, "rb") as f:
                share.get_file_client(posixpath.join(folder, rel)).upload_file(f)

        try:
            for path in files:
                rel = path.relative_to(root).as_posix()
                where = f"{self.cfg.file_share.url.rstrip('/')}/{folder}"
                self._share_retried(f"uploading {rel} to {where}", lambda rel=rel: put(rel))
        except HttpResponseError as err:
            raise ConfigError(
                f"uploading {what} to {self.cfg.file_share.url}/{folder}: "
                f"{scrub(first_line(err), self._secrets)} "
                "(check the share and its account key)."
            ) from None

    def _share_retried(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()`` (a request to the share), a refused or dropped connection and a 408/429/5xx
        answer retried by ddlkit's retry loop (``ddlkit.storage.retry``, the one Blob Storage's
        requests go through: each retry said with its delay); given up: one line naming the share's
        endpoint (:class:`~ddlkit_azure.arm.Unreachable`). Other refusals pass as the SDK raised them."""
        from ddlkit.storage import TransientStorageError, retry

        from .arm import Unreachable

        def once() -> Any:
            try:
                return call()
            except (ServiceRequestError, ServiceResponseError) as err:
                host = endpoint_of(err) or urlsplit(self.cfg.file_share.url).netloc
                raise TransientStorageError(f"no answer from Azure Files at {host} ({network_reason(err)})") from err
            except HttpResponseError as err:
                if err.status_code in (408, 429, 500, 502, 503, 504):
                    raise TransientStorageError(
                        f"Azure Files answered {err.status_code}: {scrub(first_line(err), self._secrets)}"
                    ) from err
                raise

        try:
            return retry(once, what=what, attempts=SHARE_ATTEMPTS)
        except RunError as err:
            raise Unreachable(
                f"{scrub(str(err), self._secrets)}: check the network to the share (proxy, firewall, DNS), its "
                "account key and the service's status (https://status.azure.com), then run the command again."
            ) from None

    @staticmethod
    def _make_directories(share: Any, directory: str, made: set[str]) -> None:
        parts = [p for p in directory.split("/") if p]
        for i in range(1, len(parts) + 1):
            path = "/".join(parts[:i])
            if path in made:
                continue
            with contextlib.suppress(ResourceExistsError):
                share.get_directory_client(path).create_directory()
            made.add(path)

    def run_job(self, spec: JobSpec) -> str:
        """Everything a job needs, then the job; returns its name."""
        cluster, _ = self.prepare()
        if self.cfg.stage_from is not None:
            self.stage(cluster)
        name = self.free_job_name(spec.name)
        self._secrets.update({f"env:{k}": v for k, v in spec.secret_env.items()})
        if spec.code_digest:
            self.upload_snapshot(spec)
        self.upload_job_dir(spec, name)
        self._create_job(name, self.job_parameters(spec, name, cluster))
        return name

    # ------------------------------------------------------------ staging
    def staging_destination(self) -> str:
        return posixpath.join(self.mount(self.cfg.file_server.mount_path), str(self.cfg.data_root).strip("/"))

    def staging_job_name(self) -> str:
        """Named after the source, the destination and the manifest's content: a later job with
        the same dataset finds this job done, and a changed dataset gets a new one."""
        where = hashlib.sha256(f"{self.cfg.stage_from} {self.cfg.data_root}".encode()).hexdigest()[:10]
        if self.planning:
            return f"stage-{where}-MANIFESTSHA256"
        from ddlkit.storage import MANIFEST_NAME, Manifest, open_storage

        source = open_storage(str(self.cfg.stage_from))
        with tempfile.TemporaryDirectory(prefix="ddlkit-batchai-") as tmp:
            try:
                source.get(MANIFEST_NAME, Path(tmp) / MANIFEST_NAME)
            except FileNotFoundError:
                raise ConfigError(
                    f"{self.cfg.stage_from} has no {MANIFEST_NAME}, so it cannot be staged and verified: "
                    "upload it with `ddlkit data upload`, which writes one."
                ) from None
            digest = Manifest.read(Path(tmp) / MANIFEST_NAME).digest
        return f"stage-{where}-{digest[:16]}"

    def staging_parameters(self, cluster: Any) -> m.JobCreateParameters:
        from .plugin import RANK_ENV, RANK_ENV_PREFIXES

        blob = {k: v for k, v in os.environ.items() if k.startswith(RANK_ENV_PREFIXES) or k in RANK_ENV}
        if self.planning:
            blob = {k: REDACTED for k in blob}
        self._secrets.update({f"env:{k}": v for k, v in blob.items() if is_secret_key(k)})
        command = (
            shlex.join([self.cfg.python, "-m", "ddlkit_azure.batchai_stage", str(self.cfg.stage_from)])
            + f' "{self.staging_destination()}"'
        )
        return m.JobCreateParameters(
            **self._base_job(cluster, 1),
            custom_toolkit_settings=m.CustomToolkitSettings(command_line=command),
            environment_variables=[
                m.EnvironmentVariable(name=k, value=v) for k, v in sorted(blob.items()) if not is_secret_key(k)
            ],
            secrets=[
                m.EnvironmentVariableWithSecretValue(name=k, value=v)
                for k, v in sorted(blob.items())
                if is_secret_key(k)
            ],
        )

    def stage(self, cluster: Any) -> None:
        """The dataset onto the file server, once: by a staging job on the cluster."""
        name = self.staging_job_name()
        if self.planning:
            self.recorded.append(
                Recorded(
                    "#",
                    f"staging job {name}",
                    None,
                    "named after the sha256 of the dataset's manifest.tsv, read from Blob Storage when the job runs",
                )
            )
        found = self._job_exists(name)
        if found is not None and str(found.execution_state).lower() == "succeeded":
            self.say(
                f"ddlkit: {self.cfg.stage_from} is already on file server {self.cfg.file_server.name} "
                f"({self.staging_destination()}): staging skipped"
            )
            return
        if found is not None and str(found.execution_state).lower() == "failed":
            self._delete_job(name)
            found = None
        if found is None:
            self.say(
                f"ddlkit: staging {self.cfg.stage_from} onto file server {self.cfg.file_server.name} "
                f"({self.staging_destination()}) with job {name}"
            )
            self._create_job(name, self.staging_parameters(cluster))
        started = said = time.monotonic()
        while (job := self.get_job(name)) and str(job.execution_state).lower() not in ("succeeded", "failed"):
            if time.monotonic() - said >= _PROGRESS_EVERY_S:
                said = time.monotonic()
                self.say(
                    f"ddlkit: staging job {name} is {job.execution_state} ({(said - started) / 60:.0f} min so far)"
                )
            time.sleep(self.poll_interval_s)
        if str(job.execution_state).lower() == "failed":
            tail = "\n".join("    " + ln for ln in self.stdout_tail(name))
            raise RunError(
                f"staging {self.cfg.stage_from} onto the file server failed (job {name}); its last lines:\n"
                f"{tail}\n  the next run tries again.",
                component="compute",
            )
        self.say(
            f"ddlkit: staged {self.cfg.stage_from} -> {self.staging_destination()} "
            f"({(time.monotonic() - started):.1f} s)"
        )

    def _delete_job(self, name: str) -> None:
        rg, ws = self._rg_ws
        with contextlib.suppress(ResourceNotFoundError), self._calling(f"deleting job {name}", missing_ok=True):
            self._wait(self.client.jobs.begin_delete(rg, ws, self.cfg.experiment, name), f"deleting job {name}")

    # ------------------------------------------------------------ a job's files
    def output_files(self, name: str, directory_id: str, directory: str = ".") -> list[Any]:
        rg, ws = self._rg_ws
        options = m.JobsListOutputFilesOptions(
            outputdirectoryid=directory_id, directory=directory, linkexpiryinminutes=60
        )
        listed = self._look_up(
            f"listing the files of job {name}",
            # a POST that only reads: retried as a GET is when its connection drops (azure-core
            # retries no POST that the service may have received, unless told it may)
            lambda: list(
                self.client.jobs.list_output_files(
                    rg, ws, self.cfg.experiment, name, options, retry_on_methods=_READ_METHODS
                )
            ),
        )
        return listed or []

    def _fetch(self, url: str, *, start: int = 0, what: str = "downloading a job file") -> bytes:
        """The file at ``url`` from byte ``start`` on (a ranged read when ``start`` > 0), retried as
        the SDK's calls are (:func:`~ddlkit_azure.ranged.get_with_retries`)."""
        try:
            response = get_with_retries(url, headers=range_header(start) if start else {})
        except (ServiceRequestError, ServiceResponseError) as err:
            raise unreachable(
                what, err, service="Batch AI's file storage", secrets={**self._secrets, "url": url}
            ) from None
        data = bytes_from(response, start)
        if data is None:
            raise RunError(f"downloading a job file: HTTP {response.status_code}", component="compute")
        return data

    def read_stdout(self, name: str, offset: int) -> bytes:
        """``stdout.txt`` of the job from ``offset`` on (b"" when there is nothing new); a read that
        fails (its retries spent) is :class:`~ddlkit_azure.ranged.LogUnreadable`."""
        what = f"reading the log (stdout.txt) of job {name}"
        try:
            if name not in self._stdout_url:
                found = {f.name: f for f in self.output_files(name, STDOUTERR)}
                if "stdout.txt" not in found:
                    return b""
                self._stdout_url[name] = (
                    found["stdout.txt"].download_url,
                    int(found["stdout.txt"].content_length or 0),
                )
            url = self._stdout_url[name][0]
            try:
                return self._fetch(url, start=offset, what=what)
            except (RunError, ConfigError):
                self._stdout_url.pop(name, None)  # the link expired: list again next time
                raise
        except LogUnreadable:
            raise
        except (RunError, ConfigError) as err:
            raise LogUnreadable(str(err) if str(err).startswith(what) else f"{what}: {err}") from None

    def stdout_tail(self, name: str, lines: int = 15) -> list[str]:
        found = {f.name: f for f in self.output_files(name, STDOUTERR)}
        if "stdout.txt" not in found:
            return ["(no stdout.txt)"]
        size = int(found["stdout.txt"].content_length or 0)
        data = self._fetch(found["stdout.txt"].download_url, start=max(0, size - _TAIL_BYTES))
        return data.decode("utf-8", errors="replace").splitlines()[-lines:] or ["(empty)"]

    def output_file(self, name: str, directory_id: str, filename: str) -> bytes | None:
        """The file ``filename`` at the top of the job's output directory ``directory_id`` as it is
        now; None when it is not there (yet)."""
        entry = next(
            (
                f
                for f in self.output_files(name, directory_id)
                if f.name == filename and str(f.file_type).lower() != "directory"
            ),
            None,
        )
        return None if entry is None else self._fetch(entry.download_url, what=f"reading {filename} of job {name}")

    def download_outputs(self, name: str, job_dir: Path, *, skip: Sequence[str] = ()) -> None:
        """The ``JOB`` output directory into ``job_dir``, file by file (each written atomically)."""
        pending = ["."]
        while pending:
            directory = pending.pop()
            for entry in self.output_files(name, JOB_DIRECTORY_ID, directory):
                rel = posixpath.normpath(posixpath.join(directory, entry.name))
                if rel.split("/")[0] in skip:
                    continue
                if str(entry.file_type).lower() == "directory":
                    pending.append(rel)
                    continue
                with atomic_path(Path(job_dir) / rel) as tmp:
                    tmp.write_bytes(self._fetch(entry.download_url))

    def terminate(self, name: str) -> None:
        rg, ws = self._rg_ws
        with self._calling(f"terminating job {name}"):
            self._wait(self.client.jobs.begin_terminate(rg, ws, self.cfg.experiment, name), f"terminating job {name}")

    # ------------------------------------------------------------ teardown
    def down(self, confirm: Callable[[Sequence[str]], bool]) -> list[str]:
        """Delete the cluster and the file server this config names, if ddlkit created them."""
        rg, ws = self._rg_ws
        if self._look_up(f"looking up workspace {ws}", lambda: self.client.workspaces.get(rg, ws)) is None:
            # its clusters and file servers went with it (Batch AI answers 404 to listing them)
            self.say(f"ddlkit: nothing to delete: workspace {ws} does not exist in resource group {rg}.")
            return []
        created = self.ledger.load()
        doomed: list[tuple[str, Any]] = []
        cluster = self._look_up(
            f"looking up cluster {self.cfg.cluster.name}",
            lambda: self.client.clusters.get(rg, ws, self.cfg.cluster.name),
        )
        if cluster is not None:
            doomed.append(("cluster", cluster))
        file_server = self.find_file_server()
        if file_server is not None:
            doomed.append(("file server", file_server))
        lines, keep = [], []
        for kind, resource in doomed:
            record = created.get(str(resource.id).lower())
            if record is None:
                self.say(f"ddlkit: {kind} {resource.name} was not created by ddlkit: kept")
                continue
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["created"]))
            lines.append(f"{kind} {resource.name} ({resource.vm_size}; created by ddlkit on {when}): {resource.id}")
            keep.append((kind, resource))
        if not keep:
            self.say(
                f"ddlkit: nothing to delete in workspace {ws}: ddlkit created no cluster "
                f"{self.cfg.cluster.name} nor file server {self.cfg.file_server.name} that still exists."
            )
            return []
        if not confirm(lines):
            return []
        deleted = []
        for (kind, resource), line in zip(keep, lines, strict=True):  # the cluster first: it mounts the file server
            self.say(f"ddlkit: deleting {kind} {resource.name}")
            if kind == "cluster":
                with self._calling(f"deleting cluster {resource.name}"):
                    self._wait(
                        self.client.clusters.begin_delete(rg, ws, resource.name), f"deleting cluster {resource.name}"
                    )
            else:
                self._delete_file_server(resource)
            self.ledger.remove(resource.id)
            deleted.append(line)
        return deleted

    def _delete_file_server(self, resource: Any) -> None:
        """FileServers_Delete is in the published API (2018-05-01) but not in the SDK's 7.0.0
        operations: the same request, sent through the SDK's own pipeline (auth, retries)."""
        url = f"{self.cfg.endpoint.rstrip('/')}{resource.id}?api-version={API_VERSION}"
        with self._calling(f"deleting file server {resource.name}"):
            response = self.client._send_request(HttpRequest("DELETE", url))
            if response.status_code not in (200, 202, 204):
                raise HttpResponseError(response=response)
        deadline = time.monotonic() + self.cfg.file_server.wait_s
        while self.find_file_server() is not None:
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"file server {resource.name} is still being deleted after "
                    f"{self.cfg.file_server.wait_s:.0f} s; run `ddlkit compute down` again later."
                )
            time.sleep(self.poll_interval_s)

    # ------------------------------------------------------------ the plan
    def describe_plan(self) -> str:
        shown = []
        for r in self.recorded:
            shown.append(Recorded(r.method, r.url, redact_body(r.body), r.note))
        text = (
            f"compute=batchai: the requests to {self.cfg.endpoint} (Batch AI API {API_VERSION}) for a job whose "
            "resources do not exist yet; existing ones with the same settings are reused (only their look-up "
            "is sent). Batch AI was retired in 2019: a Batch AI-compatible endpoint is needed to run it.\n"
            + self._describe_image()
            + describe_requests(shown)
        )
        return scrub(text, self._secrets)

    def _describe_image(self) -> str:
        """The job's image, and for dist=horovod where the ranks' Horovod comes from."""
        line = f"  the ranks run in image {self.image()}"
        if self.horovod:
            where = (
                "compute.image, which must have Horovod built in; the launcher needs none"
                if self.cfg.image
                else horovod_image_note(gpu=self.cfg.gpu)
            )
            line += (
                f"; dist=horovod: Horovod comes from the image ({where}); the service's mpirun (custom MPI "
                f"settings) starts processCount={world_size(self.cfg)} ranks, "
                f"{self.cfg.procs_per_node} per node"
            )
        return line + "\n"


def describe_requests(requests_: Sequence[Recorded]) -> str:
    lines = []
    number = 0
    for r in requests_:
        if r.method == "#":
            lines.append(f"      -- {r.url} ({r.note})")
            continue
        number += 1
        lines.append(f"  {number:2d}. {r.method} {r.url}")
        if r.body is not None:
            lines.extend("        " + ln for ln in json.dumps(r.body, indent=2, sort_keys=True).splitlines())
        if r.note:
            lines.append(f"        ({r.note})")
    return "\n".join(lines)


def _differences(checks: Sequence[tuple[str, Any, Any, Callable[[str], str] | None]]) -> list[str]:
    out = []
    for key, have, want, norm in checks:
        a, b = (norm(str(have)), norm(str(want))) if norm else (have, want)
        if a != b:
            out.append(f"{key.rsplit('.', 1)[-1]} is {have} ({key}={want} asks for {want})")
    return out
