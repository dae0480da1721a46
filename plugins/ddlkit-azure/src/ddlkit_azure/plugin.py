"""ddlkit hooks for Azure: ``storage=azure`` (Blob Storage) and ``compute=azureml`` (Azure Machine
Learning command jobs). The entry-point target; imports no Azure SDK."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import ddlkit

if TYPE_CHECKING:
    from omegaconf import DictConfig


@ddlkit.hookimpl
def ddlkit_storage_backends() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration(
        "azure",
        "ddlkit_azure.storage:AzureBlobStorage",
        config="ddlkit_azure.storage:AzureBlobConfig",
        packages=("azure-storage-blob", "azure-identity"),
        description="Azure Blob Storage: blob:// data staged to local disk, results to a container",
    )


@ddlkit.hookimpl
def ddlkit_compute_targets() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration(
        "azureml",
        "ddlkit_azure.azureml:AzureMLTarget",
        config="ddlkit_azure.azureml:AzureMLConfig",
        packages=("azure-ai-ml", "azure-identity"),
        description="one Azure Machine Learning command job per ddlkit job on a compute "
        "cluster: nodes x procs_per_node ranks, MPI or PyTorch distribution",
    )
    yield ddlkit.Registration(
        "batchai",
        "ddlkit_azure.batchai:BatchAITarget",
        config="ddlkit_azure.batchai:BatchAIConfig",
        packages=("azure-mgmt-batchai", "azure-storage-file-share", "azure-identity"),
        description="Azure Batch AI (retired 2019; API 2018-05-01): workspace, NFS file "
        "server and GPU cluster created or reused, one MPI job per ddlkit job",
    )


#: what the ranks read from their environment to reach Blob Storage (credentials.py): the storage
#: account and its credential, and DefaultAzureCredential's service-principal variables
RANK_ENV_PREFIXES = ("AZURE_STORAGE_",)
RANK_ENV = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_AUTHORITY_HOST")


@ddlkit.hookimpl
def ddlkit_job_environment(config: DictConfig) -> dict[str, str] | None:
    """The ranks may run on another machine: pass on the Azure variables they read, when the job
    touches Blob Storage. Keys and tokens among them travel as secrets (their names say so)."""
    from omegaconf import OmegaConf

    from .credentials import ACCOUNT_URL_ENV, SAS_ENV, split_sas  # here: loading the plugin imports none of it

    if config.storage.name != "azure" and "blob://" not in str(OmegaConf.to_container(config, resolve=True)):
        return None
    env = {k: v for k, v in os.environ.items() if k.startswith(RANK_ENV_PREFIXES) or k in RANK_ENV}
    if config.storage.name == "azure" and config.storage.get("account_url"):
        # a blob:// URL elsewhere in the run (data.root) opens from the environment: in the storage's account
        url, sas = split_sas(str(config.storage.account_url))
        env[ACCOUNT_URL_ENV] = url
        if sas:  # after a SAS from the environment, as storage=azure itself takes them (credentials.resolve)
            env.setdefault(SAS_ENV, sas)
    return env
