"""ddlkit hooks for Azure Blob Storage (the entry-point target; imports no Azure SDK)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import ddlkit

from .storage import AzureBlobConfig, AzureBlobStorage

if TYPE_CHECKING:
    from omegaconf import DictConfig


@ddlkit.hookimpl
def ddlkit_storage_backends() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("azure", AzureBlobStorage, config=AzureBlobConfig,
                              description="Azure Blob Storage: blob:// data staged to local disk, results to "
                                          "a container")


#: what the ranks read from their environment to reach Blob Storage (credentials.py): the storage
#: account and its credential, and DefaultAzureCredential's service-principal variables
RANK_ENV_PREFIXES = ("AZURE_STORAGE_",)
RANK_ENV = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_AUTHORITY_HOST")


@ddlkit.hookimpl
def ddlkit_job_environment(config: DictConfig) -> dict[str, str] | None:
    """The ranks may run on another machine: pass on the Azure variables they read, when the job
    touches Blob Storage. Keys and tokens among them travel as secrets (their names say so)."""
    from omegaconf import OmegaConf

    if config.storage.name != "azure" and "blob://" not in str(OmegaConf.to_container(config, resolve=True)):
        return None
    return {k: v for k, v in os.environ.items() if k.startswith(RANK_ENV_PREFIXES) or k in RANK_ENV}
