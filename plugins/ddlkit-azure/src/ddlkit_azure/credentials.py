"""Where the Azure credentials come from: the environment or a file, never the config.

A config holds only *references* (``storage.sas_token_file``) and the kind to use
(``storage.auth``); the secret itself never enters a config, a job file, a log or an error
message. In order of preference (``auth=auto`` takes the first one present):

1. a SAS token (least privilege, expires): ``storage.sas_token_file`` or ``$AZURE_STORAGE_SAS_TOKEN``;
2. a connection string: ``storage.connection_string_file`` or ``$AZURE_STORAGE_CONNECTION_STRING``;
3. ``DefaultAzureCredential`` (managed identity, workload identity, ``az login``), which needs
   ``pip install ddlkit-azure[identity]``.

The account comes from ``storage.account_url``, ``$AZURE_STORAGE_ACCOUNT_URL``,
``$AZURE_STORAGE_ACCOUNT`` (``https://<name>.blob.core.windows.net``) or the connection string.
An account URL that carries a SAS in its query string (``https://<name>.blob.core.windows.net?sv=...&sig=...``)
is split: the SAS is used as the SAS token (after one from a file or the environment), and ddlkit
redacts it from every copy of the config (see :mod:`ddlkit.redact`).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ddlkit import ConfigError
from ddlkit.redact import has_credentials

SAS_ENV = "AZURE_STORAGE_SAS_TOKEN"
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_URL_ENV = "AZURE_STORAGE_ACCOUNT_URL"
ACCOUNT_ENV = "AZURE_STORAGE_ACCOUNT"


class Auth(StrEnum):
    auto = "auto"
    sas = "sas"
    connection_string = "connection_string"
    default_credential = "default_credential"


@dataclass(frozen=True)
class Credential:
    kind: Auth
    #: the SAS token or connection string; None for DefaultAzureCredential
    secret: str | None
    account_url: str | None

    def __repr__(self) -> str:  # never show the secret, even in a debugger or a traceback's locals
        return f"Credential(kind={self.kind.value}, account_url={self.account_url!r})"


def _read_secret(file: str | None, env_name: str, env: Mapping[str, str]) -> str | None:
    if file:
        path = Path(file).expanduser()
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise ConfigError(f"cannot read the credential file {path}: {err.strerror or err}") from None
        if not value:
            raise ConfigError(f"the credential file {path} is empty")
        return value
    return env.get(env_name, "").strip() or None


def resolve(
    auth: str,
    *,
    account_url: str | None = None,
    sas_token_file: str | None = None,
    connection_string_file: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Credential:
    env = os.environ if env is None else env
    kind = Auth(auth)
    url = (
        account_url
        or env.get(ACCOUNT_URL_ENV)
        or (f"https://{env[ACCOUNT_ENV]}.blob.core.windows.net" if env.get(ACCOUNT_ENV) else None)
    )
    url, url_sas = split_sas(url) if url else (url, None)
    if kind in (Auth.auto, Auth.sas):
        sas = _read_secret(sas_token_file, SAS_ENV, env) or url_sas
        if sas:
            if url is None:
                raise ConfigError(f"a SAS token needs the account: set storage.account_url or ${ACCOUNT_URL_ENV}.")
            return Credential(Auth.sas, sas.lstrip("?"), check_tls(url))
        if kind is Auth.sas:
            raise ConfigError(f"storage.auth=sas but there is no SAS token: set ${SAS_ENV} or storage.sas_token_file.")
    if kind in (Auth.auto, Auth.connection_string):
        conn = _read_secret(connection_string_file, CONNECTION_STRING_ENV, env)
        if conn:
            _check_connection_string(conn, connection_string_file or f"${CONNECTION_STRING_ENV}")
            return Credential(Auth.connection_string, conn, check_tls(url) if url else None)
        if kind is Auth.connection_string:
            raise ConfigError(
                f"storage.auth=connection_string but there is none: set ${CONNECTION_STRING_ENV} or "
                "storage.connection_string_file."
            )
    looked_for = (
        f"no Azure storage credential found: looked for ${SAS_ENV} and ${CONNECTION_STRING_ENV} in the "
        "environment and storage.sas_token_file, storage.connection_string_file in the config"
    )
    if url is None:
        raise ConfigError(
            f"{looked_for}: set ${SAS_ENV} (preferred) or ${CONNECTION_STRING_ENV}, or set "
            f"storage.account_url (or ${ACCOUNT_URL_ENV}) to sign in with DefaultAzureCredential."
        )
    if urlsplit(url).scheme == "http":
        # the SDK refuses a sign-in's token over plain http (the emulator): a ValueError from deep inside it
        raise ConfigError(
            f"{looked_for}, and a sign-in (DefaultAzureCredential) cannot be used over plain http "
            f"({url}): export {SAS_ENV}=<a SAS token> or {CONNECTION_STRING_ENV}=<a connection "
            "string>."
        )
    return Credential(Auth.default_credential, None, check_tls(url))


def _check_connection_string(conn: str, source: str) -> None:
    """A malformed connection string is one line naming where it came from, before any rank
    starts (the SDK's ValueError came from a rank, inside a 43-line traceback). The string itself
    is never shown: it holds the account key."""
    from azure.storage.blob import BlobServiceClient

    try:
        BlobServiceClient.from_connection_string(conn)  # parses only: no request is made
    except ValueError as err:
        raise ConfigError(
            f"the Azure storage connection string in {source} is malformed ({err}): it is name=value pairs "
            "joined by ';', among them DefaultEndpointsProtocol, AccountName and AccountKey: copy it whole from "
            f"the portal (the storage account's Access keys), or give a SAS token in ${SAS_ENV} instead"
        ) from None


def split_sas(url: str) -> tuple[str, str | None]:
    """``(url without its query, the SAS)`` for an account URL with a SAS (``...?sv=..&sig=..``),
    else ``(url, None)``."""
    parts = urlsplit(url)
    if parts.query and has_credentials(parts.query):
        return urlunsplit(parts._replace(query="")), parts.query
    return url, None


def check_tls(url: str) -> str:
    """Refuse plain HTTP except to this machine (the Azurite emulator): data and tokens travel over TLS."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return url
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme == "http" and loopback:
        return url
    raise ConfigError(
        f"the storage account URL must use https (got {parts.scheme}://{host}); plain http is allowed "
        "only to the local emulator on 127.0.0.1."
    )
