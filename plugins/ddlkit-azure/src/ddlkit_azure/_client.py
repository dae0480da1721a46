"""Everything that touches ``azure-storage-blob`` (imported only when a blob is first read or
written, never when ddlkit composes a config or lists plugins).

SDK errors are translated into the errors ddlkit acts on: missing -> ``FileNotFoundError``,
refused -> ``ConfigError`` (the user fixes the credential), throttling / timeouts / 5xx ->
``TransientStorageError`` (retried), and every message is scrubbed of the secret first.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

import requests
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContainerClient, ContentSettings

from ddlkit import ConfigError, RunError
from ddlkit.redact import scrub
from ddlkit.storage import TransientStorageError

from .credentials import Auth, Credential, check_tls

#: blob metadata key holding the content's sha256 (what `ddlkit data upload` compares)
SHA256_KEY = "ddlkit_sha256"
_CHUNK = 4 << 20
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
_SOCKET_ERROR = re.compile(
    r"(\[Errno -?\d+\][^\"')]*|Read timed out|timed out|Connection aborted|"
    r"Connection reset by peer|Remote end closed connection without response)"
)
#: Every network wait is bounded, and the SDK does not retry on its own: ddlkit's retry loop
#: (ddlkit.storage.retry) is the only one, and it prints each retry with its delay. The
#: SDK's default (3 silent retries with 15-24 s back-off, 20 s connects, 300 s reads) kept a run
#: quiet for over 10 minutes when the endpoint was down. A read is the wait for the answer to one
#: 4 MiB block or one small request, which a working endpoint gives in a second or two: 20 s of
#: silence is a hung endpoint (5 attempts: given up after ~110 s, was ~160 s with 30 s).
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 20


_CREDENTIAL_NAMES = {Auth.sas: "the SAS token", Auth.connection_string: "the connection string"}
#: what to do about a refusal, per credential kind
_FIXES = {
    Auth.sas: "The SAS token needs read, write, create and list permissions on the container and must not have "
    "expired.",
    Auth.connection_string: "Check the connection string's account key (regenerated keys invalidate it).",
    Auth.default_credential: "Give the identity the 'Storage Blob Data Contributor' role on the storage account "
    "(or sign in as one that has it: az login).",
}


def service_client(cred: Credential, *, connections: int) -> BlobServiceClient:
    """One client per backend, shared by its threads, with a connection pool that fits them."""
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=connections, pool_maxsize=connections)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    # the timeouts go to the transport itself: a client given a transport does not pass its own on
    transport = RequestsTransport(
        session=session, session_owner=True, connection_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S
    )
    options = dict(transport=transport, retry_total=0)
    if cred.kind is Auth.connection_string:
        client = BlobServiceClient.from_connection_string(cred.secret, **options)
        check_tls(client.url)
        return client
    if cred.kind is Auth.sas:
        return BlobServiceClient(cred.account_url, credential=cred.secret, **options)
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigError(
            "storage.auth=default_credential (or no SAS token / connection string found) needs "
            "azure-identity: pip install 'ddlkit-azure[identity]'."
        ) from None
    return BlobServiceClient(cred.account_url, credential=DefaultAzureCredential(), **options)


class Container:
    """Blobs under ``prefix`` in one container, addressed by keys relative to the prefix."""

    def __init__(
        self, service: BlobServiceClient, container: str, prefix: str, cred: Credential, max_concurrency: int
    ) -> None:
        self.client: ContainerClient = service.get_container_client(container)
        self.name, self.prefix = container, prefix.strip("/")
        self.max_concurrency = max_concurrency
        self._secrets = {"secret": cred.secret} if cred.secret else {}
        self._auth = cred.kind
        self._service = service
        self._created = False

    def blob_name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except ResourceNotFoundError:
            raise FileNotFoundError(f"{what}: not found in container {self.name!r}") from None
        except ClientAuthenticationError as err:
            raise ConfigError(
                f"{what}: Azure refused {self.credential} ({self._message(err)}). {_FIXES[self._auth]}"
            ) from None
        except HttpResponseError as err:
            if err.status_code in _TRANSIENT_STATUS:
                raise TransientStorageError(f"{what}: {self._message(err)}") from None
            if err.status_code == 403:
                raise ConfigError(
                    f"{what}: access denied to {self.credential} ({self._message(err)}). {_FIXES[self._auth]}"
                ) from None
            raise RunError(f"{what}: {self._message(err)}", component="storage") from None
        except (ServiceRequestError, ServiceResponseError) as err:
            raise TransientStorageError(f"{what}: {self._network_message(err)}") from None
        except AzureError as err:
            raise RunError(f"{what}: {self._message(err)}", component="storage") from None

    def _network_message(self, err: Exception) -> str:
        """urllib3's wrapper text (pool, URL, retries) reduced to what went wrong and where."""
        found = _SOCKET_ERROR.search(str(err))
        host = urlsplit(self.client.url).netloc
        return f"no answer from {host}: {found.group(1).strip()}" if found else self._message(err)

    def _message(self, err: Exception) -> str:
        text = str(getattr(err, "reason", None) or err).splitlines()[0] if str(err) else type(err).__name__
        return scrub(text, self._secrets)

    @property
    def credential(self) -> str:
        """Which credential this client signs with, for messages: DefaultAzureCredential names the
        one of its chain that answered (environment, managed identity, Azure CLI, ...)."""
        if self._auth is not Auth.default_credential:
            return _CREDENTIAL_NAMES[self._auth]
        used = getattr(self._service.credential, "_successful_credential", None)
        return f"DefaultAzureCredential ({type(used).__name__})" if used else "DefaultAzureCredential"

    def check_write(self, key: str) -> None:
        """Write an empty blob at ``key`` (the credential may create and write here), then delete
        it; a SAS without delete permission (which ddlkit does not need) leaves it there, empty."""
        self.ensure_container()
        blob = self.client.get_blob_client(self.blob_name(key))
        with self._errors(f"writing a probe blob {key}"):
            blob.upload_blob(b"", overwrite=True)
        with suppress(HttpResponseError):
            blob.delete_blob()

    def ensure_container(self) -> None:
        if self._created:
            return
        with self._errors(f"creating container {self.name}"):
            try:
                self.client.create_container()
            except ResourceExistsError:
                pass
        self._created = True

    def upload(self, local_path: Path, key: str) -> None:
        """One blob, all or nothing: a single Put Blob, or blocks committed by one Put Block List
        at the end, so a failed upload never replaces the previous blob with part of a new one."""
        sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
        with open(local_path, "rb") as f:
            while chunk := f.read(_CHUNK):
                sha.update(chunk)
                md5.update(chunk)
        self.ensure_container()
        with self._errors(f"uploading {key}"), open(local_path, "rb") as f:
            self.client.upload_blob(
                self.blob_name(key),
                f,
                overwrite=True,
                max_concurrency=self.max_concurrency,
                metadata={SHA256_KEY: sha.hexdigest()},
                content_settings=ContentSettings(content_md5=bytearray(md5.digest())),
            )

    def download(self, key: str, local_path: Path) -> None:
        """To a temporary sibling, then renamed: ``local_path`` is the whole blob or untouched."""
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = local_path.with_name(f".{local_path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with self._errors(f"downloading {key}"), open(tmp, "wb") as f:
                self.client.download_blob(self.blob_name(key), max_concurrency=self.max_concurrency).readinto(f)
            os.replace(tmp, local_path)
        finally:
            tmp.unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        with self._errors(f"checking {key}"):
            return self.client.get_blob_client(self.blob_name(key)).exists()

    def list(self, prefix: str = "") -> dict[str, tuple[int, str | None]]:
        """``{key: (size, sha256 or None)}`` of the blobs whose key starts with ``prefix``."""
        base = f"{self.prefix}/" if self.prefix else ""
        found: dict[str, tuple[int, str | None]] = {}
        try:
            with self._errors(f"listing {base}{prefix}"):
                for blob in self.client.list_blobs(name_starts_with=base + prefix, include=["metadata"]):
                    found[blob.name[len(base) :]] = (blob.size, (blob.metadata or {}).get(SHA256_KEY))
        except FileNotFoundError:  # no container yet: nothing in it
            return {}
        return found
