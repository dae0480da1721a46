"""ddlkit hooks for Azure Blob Storage (the entry-point target; imports no Azure SDK)."""

from __future__ import annotations

from collections.abc import Iterator

import ddlkit

from .storage import AzureBlobConfig, AzureBlobStorage


@ddlkit.hookimpl
def ddlkit_storage_backends() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration("azure", AzureBlobStorage, config=AzureBlobConfig,
                              description="Azure Blob Storage: blob:// data staged to local disk, results to "
                                          "a container")
