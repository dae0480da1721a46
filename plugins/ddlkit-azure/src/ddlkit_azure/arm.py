"""Signing in to Azure Resource Manager, for the compute targets of this plugin.

Credentials never come from a config: :func:`management_credential` is ``DefaultAzureCredential``
(environment service principal, workload identity, managed identity, ``az login``), and
:func:`signed_in` turns its failure -- or ARM refusing the token -- into one line that says how
to sign in. Imports ``azure-identity`` only when called. :func:`missing_scope` reads ARM's answer
that the subscription or the resource group a request names does not exist.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ddlkit import ConfigError

#: ARM's error codes for a 404 whose subscription or resource group does not exist (the resource asked
#: for was never looked at)
SUBSCRIPTION_NOT_FOUND, RESOURCE_GROUP_NOT_FOUND = "SubscriptionNotFound", "ResourceGroupNotFound"
#: how to sign in, for every "no credential" message
SIGN_IN = (
    "sign in with `az login`, run where a managed identity is assigned, or set AZURE_CLIENT_ID, "
    "AZURE_TENANT_ID and AZURE_CLIENT_SECRET (a service principal) in the environment"
)


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
        raise ConfigError(f"{what}: no Azure credential found; {SIGN_IN}.") from None


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
