"""Signing in to Azure Resource Manager, for the compute targets of this plugin.

Credentials never come from a config: :func:`management_credential` is ``DefaultAzureCredential``
(environment service principal, workload identity, managed identity, ``az login``), and
:func:`signed_in` turns its failure -- or ARM refusing the token -- into one line that says how
to sign in. Imports ``azure-identity`` only when called. :func:`missing_scope` reads ARM's answer
that the subscription or the resource group a request names does not exist. :func:`unreachable` is
the one line for an endpoint that refused or dropped the connection once the SDK's retries gave up.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from ddlkit import ConfigError

#: ARM's error codes for a 404 whose subscription or resource group does not exist (the resource asked
#: for was never looked at)
SUBSCRIPTION_NOT_FOUND, RESOURCE_GROUP_NOT_FOUND = "SubscriptionNotFound", "ResourceGroupNotFound"
#: how to sign in, for every "no credential" message
SIGN_IN = (
    "sign in with `az login`, run where a managed identity is assigned, or set AZURE_CLIENT_ID, "
    "AZURE_TENANT_ID and AZURE_CLIENT_SECRET (a service principal) in the environment"
)


#: what went wrong on the socket, out of urllib3's wrapper text (pool, URL, retries)
_SOCKET_ERROR = re.compile(
    r"(\[Errno -?\d+\][^\"')]*|Read timed out|timed out|Connection aborted|Connection refused|"
    r"Connection reset by peer|Remote end closed connection without response)"
)


class Unreachable(ConfigError):
    """A service that refused or dropped the connection, or did not answer, its retries spent."""


def endpoint_of(err: BaseException) -> str | None:
    """The host (and port) a failed request went to, from the transport's error under the SDK's."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        url = getattr(getattr(current, "request", None), "url", None)
        if isinstance(url, str) and url:
            return urlsplit(url).netloc or None
        # urllib3's error for a connection it could not make names the connection
        conn = getattr(current, "conn", None) or getattr(current, "pool", None)
        if isinstance(getattr(conn, "host", None), str):
            return f"{conn.host}:{conn.port}" if getattr(conn, "port", None) else conn.host
        inner = getattr(current, "inner_exception", None)
        current = inner if isinstance(inner, BaseException) else current.__cause__ or current.__context__
    return None


def network_reason(err: BaseException) -> str:
    """What went wrong on the socket (refused, closed with no response, timed out), in a few words."""
    found = _SOCKET_ERROR.search(str(err))
    if found and found.group(1) == "Connection aborted" and "Remote end closed" in str(err):
        return "the connection was closed with no response"
    return found.group(1).strip() if found else first_line(err)


def unreachable(
    what: str,
    err: BaseException,
    *,
    service: str,
    then: str = "",
    again: bool = True,
    secrets: Mapping[str, str] | None = None,
) -> Unreachable:
    """A connection that was refused, dropped without an answer or timed out, after the SDK's
    retry policy (azure-core's: refused and dropped connections and 408/429/5xx answers, retried
    with back-off) gave up: one line naming the endpoint and what to check; ``then``: what else to
    say (a job that may still be running); ``again``: whether running the command again is the remedy."""
    from ddlkit.redact import scrub

    host = endpoint_of(err) or service
    reason = network_reason(err)
    text = (
        f"{what}: no answer from {service} at {host} ({reason}), retried and given up: check the network to "
        f"{host} (proxy, firewall, DNS) and the service's status (https://status.azure.com)"
        f"{', then run the command again' if again else ''}.{' ' + then if then else ''}"
    )
    return Unreachable(scrub(text, dict(secrets or {})))


def management_credential() -> Any:
    """``DefaultAzureCredential`` without its interactive browser fallback (a launcher may run
    unattended)."""
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigError("signing in to Azure needs azure-identity: pip install 'ddlkit-azure[identity]'.") from None
    # its warning when no credential works is several lines that signed_in() says in one
    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    return DefaultAzureCredential(exclude_interactive_browser_credential=True)


#: the Azure CLI's words (Microsoft Entra's AADSTS codes) for a sign-in that has expired
_EXPIRED = re.compile(r"(AADSTS\d+): ([^.\n]*\bexpired\b[^.\n]*)", re.IGNORECASE)


def no_credential(what: str, err: BaseException) -> ConfigError:
    """No token: the CLI's sign-in expired (its AADSTS code and words, and `az login`), or no
    credential at all (the ways to sign in)."""
    expired = _EXPIRED.search(str(err))
    if expired:
        return ConfigError(
            f"{what}: the Azure CLI's sign-in has expired ({expired.group(1)}: {expired.group(2).strip()}): "
            "sign in again with `az login`."
        )
    return ConfigError(f"{what}: no Azure credential found; {SIGN_IN}.")


@contextmanager
def signed_in(what: str) -> Iterator[None]:
    """Around calls that need a token: no credential, or a token Azure refuses, is a
    :class:`ConfigError` naming ``what`` was being done and how to sign in."""
    from azure.core.exceptions import ClientAuthenticationError

    try:
        yield
    except ClientAuthenticationError as err:
        status = getattr(err, "status_code", None)
        if status in (401, 403):
            raise ConfigError(
                f"{what}: Azure refused the credential (HTTP {status}: {first_line(err)}); check that "
                "the signed-in identity has the Contributor role on the resource group."
            ) from None
        raise no_credential(what, err) from None


def first_line(err: BaseException) -> str:
    """An SDK error as one line: its ARM error message when it has one, else its first line."""
    error = getattr(err, "error", None)
    message = getattr(error, "message", None) or str(getattr(err, "message", "") or err)
    code = error_code(err)
    line = next((ln.strip() for ln in str(message).splitlines() if ln.strip()), type(err).__name__)
    line = line.removeprefix("(").split(") ", 1)[-1] if code and line.startswith(f"({code})") else line
    return f"{code}: {line}" if code and not line.startswith(str(code)) else line


def error_code(err: BaseException) -> str | None:
    """The ``error.code`` of an ARM error answer (``ResourceNotFound``, ``ResourceGroupNotFound``, ...)."""
    return getattr(getattr(err, "error", None), "code", None)


def missing_scope(err: BaseException, what: str, *, subscription: str, resource_group: str) -> ConfigError | None:
    """The error for a 404 that says the subscription or the resource group of the request does not
    exist (the config names the wrong one); None for any other answer."""
    code = error_code(err)
    if code == SUBSCRIPTION_NOT_FOUND:
        return ConfigError(
            f"{what}: subscription {subscription} was not found ({first_line(err)}): check "
            "compute.subscription_id (`az account list` shows the subscriptions you can use)."
        )
    if code == RESOURCE_GROUP_NOT_FOUND:
        return ConfigError(
            f"{what}: resource group {resource_group} was not found in subscription {subscription} "
            f"({first_line(err)}): check compute.resource_group and compute.subscription_id, or "
            f"create it (az group create --name {resource_group} --location <region>)."
        )
    return None
