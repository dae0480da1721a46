r"""Azure Blob Storage: `blob://container/prefix` datasets staged to
each node's local disk (never trained from blob-fuse: too slow), results to
`blob://<storage.container>/<storage.prefix>/results/<job>` (or `storage.results`), and
`blob://` URLs wherever ddlkit takes a location (`data.root`, `storage.results` of
`storage=local_ssd`, `ddlkit data upload`). A `data.root` that is a directory is read in place.

    export AZURE_STORAGE_ACCOUNT_URL=https://<account>.blob.core.windows.net
    export AZURE_STORAGE_SAS_TOKEN='sv=...&sig=...'      # or AZURE_STORAGE_CONNECTION_STRING
    ddlkit data upload /data/imagenet blob://datasets/imagenet
    ddlkit data=imagefolder data.root=blob://datasets/imagenet storage=azure storage.scratch=/mnt/resource/ddlkit \
        storage.container=results

Set `storage.scratch` for `blob://` datasets: they are staged as
[storage=local_ssd stages them](local_ssd.md#staging). Which credentials it takes, in which
order, and how secrets are kept out of every file: [Credentials](../credentials.md). Results are
published as for every backend ([Results](../datasets.md#results)).

Every blob is written all-or-nothing (one Put Blob, or a block list committed at the end) with
its SHA-256 in the metadata, which is what `ddlkit data upload` compares to skip blobs. Plain
`http` is refused except to the local emulator (Azurite) on 127.0.0.1.

## Before the dataset is staged

Rank 0 writes and deletes a probe blob where the results will go and prints which credential it
used (`ddlkit: storage=azure: blob://ddlkit/results/JOB is writable with the SAS token`, or
`DefaultAzureCredential (ManagedIdentityCredential)`); a credential that may not write stops the
job there, with exit status 2 and what the credential lacks, not after hours of training.

## A storage account that stops answering

It is found out in bounded time, loudly: every request to Blob Storage waits at most 10 s to
connect and 30 s for an answer, the SDK's own silent retries are off, and each of ddlkit's retries
prints a line with its delay (`ddlkit: uploading ... failed (... no answer from HOST: Read timed
out); retrying in 2 s (attempt 4 of 5)`). With the default `storage.attempts=5` the job gives up
after 7.5 s of back-off plus five attempts: measured, 8.2 s when the endpoint refuses connections
and 158 s when it accepts them and never answers (before: over 10 minutes of silence).

## How it works

Imports no Azure SDK: the client is built on first use, in `ddlkit_azure._client`, and SDK error
messages are scrubbed of secrets. `AzureBlobStorage` is a `ddlkit.storage.StagingStorage`, so it
stages and publishes as `storage=local_ssd` does, and its options add to `local_ssd`'s.

The plugin's tests run against a real Azurite, the Blob Storage emulator
([Development](../../development.md#the-azure-plugins-test-kit)).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlkit import ConfigError, StorageBackend
from ddlkit.storage import LocalSsdConfig, StagingStorage, is_url, open_storage, retry, split_url

from .credentials import ACCOUNT_URL_ENV, CONNECTION_STRING_ENV, Auth, resolve

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
        # a connection string given here reaches the ranks: a malformed one is said here, not by each rank
        given = c.connection_string_file or os.environ.get(CONNECTION_STRING_ENV)
        if (url and str(url).startswith("http://")) or (given and c.auth in ("auto", "connection_string")):
            resolve(
                c.auth,
                account_url=url,
                sas_token_file=c.sas_token_file,
                connection_string_file=c.connection_string_file,
            )

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
                cred = resolve(
                    c.auth,
                    account_url=c.account_url,
                    sas_token_file=c.sas_token_file,
                    connection_string_file=c.connection_string_file,
                )
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
        retry(
            lambda: backend.container.check_write(backend._key(f"{prefix}/.ddlkit-write-check")),
            what=f"checking that {where} is writable",
            attempts=self.cfg.attempts,
            small=True,
        )
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
