"""A ``compute=azureml`` job's secrets in an Azure Key Vault instead of the job's definition.

Azure ML keeps a command job's environment variables in the job's definition, readable by any
Reader of the workspace. So the launcher puts each secret variable of the job into a Key Vault
(the workspace's own, or ``compute.key_vault``) as a secret of its own, named for the job, tagged
with it and expiring after :data:`EXPIRES_AFTER`; the job's environment carries only the vault's
URL (:data:`VAULT_ENV`) and the variable -> secret name map (:data:`NAMES_ENV`), no value. Each
process of the job (:mod:`ddlkit_azure.rank`) reads them with the job's identity
(``DefaultAzureCredential``: on Azure ML compute, the cluster's managed identity, which needs the
"Key Vault Secrets User" role on the vault) into the worker's environment only. The launcher
deletes them once the job has ended and its output is collected.

::

    names = store(vault, job_name, spec.secret_env, credential)   # the launcher, before the job is created
    variables |= read(os.environ)                                  # each rank, before the worker starts
    delete(vault, names.values(), credential)                      # the launcher, the job collected

The SDK (``azure-keyvault-secrets``, ``azure-identity``) is imported only when called.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: the job's variable naming the vault (``https://<name>.vault.azure.net``)
VAULT_ENV = "DDLKIT_AZURE_KEY_VAULT"
#: the job's variable mapping each secret variable to its Key Vault secret's name (JSON)
NAMES_ENV = "DDLKIT_AZURE_SECRETS"
#: how long a job's secret stays readable when the launcher never deletes it (a job never collected)
EXPIRES_AFTER = dt.timedelta(days=7)
#: the role the job's identity needs on the vault to read them
READER_ROLE = "Key Vault Secrets User"
#: the role the launcher's identity needs to write and delete them
WRITER_ROLE = "Key Vault Secrets Officer"
#: the tag that names the job on each of its secrets
JOB_TAG = "ddlkit_job"
_VAULT_ID = re.compile(r"/providers/Microsoft\.KeyVault/vaults/(?P<name>[^/]+)/?$", re.IGNORECASE)
_NOT_NAME = re.compile(r"[^0-9A-Za-z-]+")
#: Key Vault's longest secret name
_NAME_MAX = 127


class SecretsError(Exception):
    """A vault that refused, did not answer, or lacks a secret: one line (the vault, the secret, the role)."""


def vault_url_of(arm_id: str) -> str | None:
    """The URL of the vault whose ARM id is ``arm_id`` (a workspace's ``properties.keyVault``)."""
    found = _VAULT_ID.search(arm_id or "")
    return f"https://{found['name']}.vault.azure.net" if found else None


def secret_prefix(job_name: str) -> str:
    """What the names of a job's secrets start with: its Azure ML name (unique in the workspace) in
    alphanumerics and dashes, its random end kept when it is shortened."""
    base = _NOT_NAME.sub("-", job_name).strip("-")
    if len(base) > 90:  # the job name's random end keeps it unique
        base = base[:82] + "-" + base[-7:].lstrip("-")
    return base


def secret_names(job_name: str, variables: Iterable[str], *, prefix: str | None = None) -> dict[str, str]:
    """{variable: its Key Vault secret's name}: alphanumerics and dashes, unique to the job
    (:func:`secret_prefix`, or ``prefix``), then the variable's place and name."""
    base = secret_prefix(job_name) if prefix is None else prefix
    return {
        var: f"{base}-{i}-{_NOT_NAME.sub('-', var).strip('-')}"[:_NAME_MAX].rstrip("-")
        for i, var in enumerate(sorted(variables))
    }


def _client(vault: str, credential: Any) -> Any:
    from azure.keyvault.secrets import SecretClient

    for name in ("azure.keyvault", "azure.identity", "azure.core.pipeline.policies.http_logging_policy"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return SecretClient(vault_url=vault, credential=credential)


def _first_line(err: BaseException) -> str:
    message = getattr(getattr(err, "error", None), "message", None) or getattr(err, "message", None) or str(err)
    return next((ln.strip() for ln in str(message).splitlines() if ln.strip()), type(err).__name__)


def store(vault: str, job_name: str, secrets: Mapping[str, str], credential: Any) -> dict[str, str]:
    """Each of ``secrets`` into ``vault`` as a secret of its own, tagged with the job and expiring
    after :data:`EXPIRES_AFTER`; {variable: secret name}. A refusal is a :class:`SecretsError`
    (those already stored are deleted first)."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ServiceRequestError

    names = secret_names(job_name, secrets)
    client = _client(vault, credential)
    expires = dt.datetime.now(dt.UTC) + EXPIRES_AFTER
    stored: list[str] = []
    for var, name in names.items():
        try:
            client.set_secret(
                name,
                secrets[var],
                expires_on=expires,
                content_type="ddlkit job secret",
                tags={JOB_TAG: job_name, "variable": var},
            )
        except (ClientAuthenticationError, HttpResponseError, ServiceRequestError) as err:
            delete(vault, stored, credential)
            status = getattr(err, "status_code", None)
            raise SecretsError(
                f"storing the job's secret {var} in key vault {vault} as {name}: "
                + (f"refused ({status}: {_first_line(err)})" if status else _first_line(err))
                + f": the identity that submits needs the '{WRITER_ROLE}' role on the vault (or name another "
                "with compute.key_vault=https://<name>.vault.azure.net)."
            ) from None
        stored.append(name)
    return names


def delete(vault: str, names: Iterable[str], credential: Any) -> list[str]:
    """Delete ``names`` from ``vault`` (one already gone is deleted); the lines of those that were not."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    failed = []
    client = _client(vault, credential)
    for name in names:
        try:
            client.begin_delete_secret(name).wait(timeout=30)
        except ResourceNotFoundError:
            pass
        except AzureError as err:
            failed.append(f"{name} ({_first_line(err)})")
    return failed


def job_variables(vault: str, names: Mapping[str, str]) -> dict[str, str]:
    """What the job's definition carries instead of the secrets: the vault and the names, no value."""
    return {VAULT_ENV: vault, NAMES_ENV: json.dumps(dict(names), sort_keys=True)} if names else {}


def stored_in(env: Mapping[str, str] | None) -> tuple[str, dict[str, str]] | None:
    """(vault, {variable: secret name}) of a job's environment variables; None without secrets."""
    env = env or {}
    if not env.get(VAULT_ENV) or not env.get(NAMES_ENV):
        return None
    return str(env[VAULT_ENV]), {str(k): str(v) for k, v in json.loads(env[NAMES_ENV]).items()}


def read(env: Mapping[str, str], credential: Any = None) -> dict[str, str]:
    """The job's secret variables, read from its vault with ``credential`` (default: the job's
    identity through ``DefaultAzureCredential``); nothing when the job has none. A vault that
    refuses, does not answer or lacks a secret is a :class:`SecretsError`."""
    found = stored_in(env)
    if found is None:
        return {}
    vault, names = found
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if credential is None:
        from azure.identity import DefaultAzureCredential

        # Azure ML names the cluster's identity (a user-assigned one must be named) in DEFAULT_IDENTITY_CLIENT_ID
        credential = DefaultAzureCredential(
            exclude_interactive_browser_credential=True,
            managed_identity_client_id=env.get("DEFAULT_IDENTITY_CLIENT_ID") or None,
        )
    client = _client(vault, credential)
    grant = (
        f"the job's identity (the compute cluster's managed identity) needs the '{READER_ROLE}' role on the vault "
        f'(az role assignment create --role "{READER_ROLE}" --assignee <its principal id> --scope <the vault\'s id>)'
    )
    values = {}
    for var, name in names.items():
        what = f"reading the job's secret {var} (key vault secret {name}) from key vault {vault}"
        try:
            values[var] = str(client.get_secret(name).value)
        except ResourceNotFoundError:
            raise SecretsError(
                f"{what}: the vault has no such secret (deleted once its job was collected, or never stored); "
                f"if it is there, {grant}."
            ) from None
        except ClientAuthenticationError as err:
            raise SecretsError(f"{what}: no token for the job's identity ({_first_line(err)}); {grant}.") from None
        except HttpResponseError as err:
            raise SecretsError(f"{what}: refused ({err.status_code}: {_first_line(err)}); {grant}.") from None
        except (ServiceRequestError, ServiceResponseError) as err:
            raise SecretsError(f"{what}: no answer from the vault ({_first_line(err)}); {grant}.") from None
    return values
