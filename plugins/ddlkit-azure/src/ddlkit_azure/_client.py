"""Everything that touches ``azure-storage-blob`` (imported only when a blob is first read or
written, never when ddlkit composes a config or lists plugins).

SDK errors are translated into the errors ddlkit acts on: missing -> ``FileNotFoundError``,
refused -> ``ConfigError`` (the user fixes the credential), throttling / timeouts / 5xx ->
``TransientStorageError`` (retried), and every message is scrubbed of the secret first.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
import requests
from azure.core.exceptions import (AzureError, ClientAuthenticationError, HttpResponseError, ResourceExistsError,
                                   ResourceNotFoundError, ServiceRequestError, ServiceResponseError)
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContainerClient, ContentSettings

from ddlkit import ConfigError, RunError
from ddlkit.builtin.transfer import TransientStorageError
from ddlkit.secrets import scrub

from .credentials import Auth, Credential, check_tls

#: blob metadata key holding the content's sha256 (what `ddlkit data upload` compares)
SHA256_KEY = "ddlkit_sha256"
_CHUNK = 4 << 20
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def service_client(cred: Credential, *, connections: int) -> BlobServiceClient:
    """One client per backend, shared by its threads, with a connection pool that fits them."""
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=connections, pool_maxsize=connections)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    options = dict(transport=RequestsTransport(session=session, session_owner=True), connection_timeout=20,
                   read_timeout=300)
    if cred.kind is Auth.connection_string:
        client = BlobServiceClient.from_connection_string(cred.secret, **options)
        check_tls(client.url)
        return client
    if cred.kind is Auth.sas:
        return BlobServiceClient(cred.account_url, credential=cred.secret, **options)
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigError("storage.auth=default_credential (or no SAS token / connection string found) needs "
                          "azure-identity: pip install 'ddlkit-azure[identity]'.") from None
    return BlobServiceClient(cred.account_url, credential=DefaultAzureCredential(), **options)


class Container:
    """Blobs under ``prefix`` in one container, addressed by keys relative to the prefix."""

    def __init__(self, service: BlobServiceClient, container: str, prefix: str, cred: Credential,
                 max_concurrency: int) -> None:
        self.client: ContainerClient = service.get_container_client(container)
        self.name, self.prefix = container, prefix.strip("/")
        self.max_concurrency = max_concurrency
        self._secrets = {"secret": cred.secret} if cred.secret else {}
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
            raise ConfigError(f"{what}: Azure refused the credentials ({self._message(err)}). Check the SAS token's "
                              "permissions and expiry, or the connection string.") from None
        except HttpResponseError as err:
            if err.status_code in _TRANSIENT_STATUS:
                raise TransientStorageError(f"{what}: {self._message(err)}") from None
            if err.status_code == 403:
                raise ConfigError(f"{what}: access denied ({self._message(err)}). The SAS token needs read, write, "
                                  "list and create permissions on the container and must not have expired.") from None
            raise RunError(f"{what}: {self._message(err)}", component="storage") from None
        except (ServiceRequestError, ServiceResponseError) as err:
            raise TransientStorageError(f"{what}: {self._message(err)}") from None
        except AzureError as err:
            raise RunError(f"{what}: {self._message(err)}", component="storage") from None

    def _message(self, err: Exception) -> str:
        text = str(getattr(err, "reason", None) or err).splitlines()[0] if str(err) else type(err).__name__
        return scrub(text, self._secrets)

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
            self.client.upload_blob(self.blob_name(key), f, overwrite=True, max_concurrency=self.max_concurrency,
                                    metadata={SHA256_KEY: sha.hexdigest()},
                                    content_settings=ContentSettings(content_md5=bytearray(md5.digest())))

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
                    found[blob.name[len(base):]] = (blob.size, (blob.metadata or {}).get(SHA256_KEY))
        except FileNotFoundError:  # no container yet: nothing in it
            return {}
        return found
