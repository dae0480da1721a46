"""``storage=azure``: objects in an Azure Blob Storage container; ``blob://`` datasets staged to
node-local scratch (never trained from blob-fuse: too slow); results to ``results/<job>/`` in the
container. Opens ``blob://container/prefix`` URLs for ``ddlkit data upload``, for
``storage=local_ssd`` staging and for results, with credentials from the environment.

Imports no Azure SDK: the client is built on first use, in :mod:`._client`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlkit import ConfigError, StorageBackend
from ddlkit.storage import LocalSsdConfig, StagingStorage, is_url, open_storage, retry, split_url

from .credentials import ACCOUNT_URL_ENV, Auth, resolve

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ddlkit import RunContext

    from ._client import Container

SCHEME = "blob"


@dataclass
class AzureBlobConfig(LocalSsdConfig):
    # https://<account>.blob.core.windows.net; null: $AZURE_STORAGE_ACCOUNT_URL, $AZURE_STORAGE_ACCOUNT
    # or the connection string's
    account_url: str | None = None
    # container (created if missing) and key prefix of this backend's objects; results go to
    # <prefix>/results/<job> unless storage.results says otherwise
    container: str = "ddlkit"
    prefix: str = ""
    # auto (SAS token, else connection string, else DefaultAzureCredential), sas, connection_string,
    # default_credential. The secrets come from the environment or these files, never from the config
    auth: Auth = Auth.auto
    sas_token_file: str | None = None
    connection_string_file: str | None = None
    # connections per large blob (the SDK splits blobs over 4 MB); files are transferred `workers` at a time
    max_concurrency: int = 4


class AzureBlobStorage(StagingStorage):
    url_schemes = (SCHEME,)
    cfg: AzureBlobConfig

    def __init__(self, cfg: AzureBlobConfig) -> None:
        super().__init__(cfg)
        self._container: Container | None = None
        self._lock = threading.Lock()

    def configure(self, config: DictConfig) -> None:
        """At a plain-http endpoint (the local emulator) the ranks need a SAS token or a connection
        string, which they get from this environment: said before anything runs, in one line. (At
        an https endpoint the ranks may sign in with an identity of their own machine: not checked here.)"""
        c = self.cfg
        url = c.account_url or os.environ.get(ACCOUNT_URL_ENV)
        if url and str(url).startswith("http://"):
            resolve(c.auth, account_url=url, sas_token_file=c.sas_token_file,
                    connection_string_file=c.connection_string_file)

    @classmethod
    def from_url(cls, url: str) -> AzureBlobStorage:
        scheme, container, prefix = split_url(url)
        if scheme != SCHEME:
            raise ConfigError(f"{url}: storage=azure opens {SCHEME}:// URLs")
        return cls(AzureBlobConfig(container=container, prefix=prefix))

    def sibling(self, url: str) -> AzureBlobStorage:
        """Another place in the same account, with the same credentials (``blob://c/p``)."""
        _, container, prefix = split_url(url)
        return AzureBlobStorage(AzureBlobConfig(**{**_fields(self.cfg), "container": container, "prefix": prefix}))

    @property
    def container(self) -> Container:
        with self._lock:
            if self._container is None:
                from ._client import Container, service_client

                c = self.cfg
                cred = resolve(c.auth, account_url=c.account_url,
                               sas_token_file=c.sas_token_file, connection_string_file=c.connection_string_file)
                service = service_client(cred, connections=max(c.workers, 1) * max(c.max_concurrency, 1))
                self._container = Container(service, c.container, c.prefix, cred, c.max_concurrency)
            return self._container

    @staticmethod
    def _key(key: str) -> str:
        parts = key.split("/")
        if key.startswith("/") or ".." in parts or "" in parts:
            raise ValueError(f"key {key!r} escapes the container prefix (no leading '/', empty or '..' segments)")
        return key

    # ------------------------------------------------------------ objects
    def put(self, local_path: Path, key: str) -> None:
        self.container.upload(Path(local_path), self._key(key))

    def get(self, key: str, local_path: Path) -> None:
        self.container.download(self._key(key), Path(local_path))

    def exists(self, key: str) -> bool:
        return self.container.exists(self._key(key))

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self.container.list(prefix))

    def list_hashes(self, prefix: str = "") -> dict[str, tuple[int, str | None]]:
        """``{key: (size, sha256)}``; the hash is None for blobs not written by ddlkit."""
        return self.container.list(prefix)

    # ------------------------------------------------------------ data and results
    def open_source(self, root: str) -> StorageBackend:
        return self.sibling(root) if root.startswith(f"{SCHEME}://") else open_storage(root)

    def prepare_data(self, root: str, run: RunContext) -> Path:
        if not is_url(root):
            return Path(root).expanduser()  # a directory every node sees (a share) is read in place
        return super().prepare_data(root, run)

    def results_target(self, job_name: str) -> tuple[StorageBackend, str]:
        results = self.cfg.results
        if results and results.startswith(f"{SCHEME}://"):
            return self.sibling(results), job_name
        if results:
            return open_storage(results), job_name
        return self, f"results/{job_name}"

    def check_access(self, job_name: str) -> str | None:
        backend, prefix = self.results_target(job_name)
        if not isinstance(backend, AzureBlobStorage):
            return backend.check_access(job_name)
        where = self.describe_results(job_name)
        retry(lambda: backend.container.check_write(backend._key(f"{prefix}/.ddlkit-write-check")),
              what=f"checking that {where} is writable", attempts=self.cfg.attempts, small=True)
        return f"storage=azure: {where} is writable with {backend.container.credential}"

    def describe_results(self, job_name: str) -> str:
        if self.cfg.results:
            return super().describe_results(job_name)
        prefix = f"{self.cfg.prefix.strip('/')}/" if self.cfg.prefix.strip("/") else ""
        return f"{SCHEME}://{self.cfg.container}/{prefix}results/{job_name}"


def _fields(cfg: Any) -> dict[str, Any]:
    from dataclasses import fields, is_dataclass

    if is_dataclass(cfg):
        return {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    return {f.name: cfg[f.name] for f in fields(AzureBlobConfig) if f.name in cfg}
