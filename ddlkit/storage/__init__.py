"""The SDK for storage plugins: what a storage backend, and a compute target that moves data, may build on.

A storage plugin implements :class:`ddlkit.StorageBackend` (and registers it with
``ddlkit_storage_backends``); a backend for a remote object store declares its URL schemes
(:attr:`~ddlkit.StorageBackend.url_schemes`) so that :func:`open_storage` finds it. Everything it
needs beyond the interface is here:

* URLs -- :func:`open_storage` (a path or ``<scheme>://container/prefix`` -> a backend whose keys
  are relative to it), :func:`is_url`, :func:`split_url`;
* retries -- :func:`retry` retries :class:`TransientStorageError` (raise it for timeouts,
  throttling and 5xx answers) with exponential backoff, announcing each retry;
* staging -- :func:`stage` copies a dataset into a local directory, in parallel, each file
  verified against the manifest before it is renamed into place, resumable, and a no-op when the
  copy already matches (:func:`is_staged`, :class:`StagingReport`);
* manifests -- :class:`Manifest` (``manifest.tsv``, :data:`MANIFEST_NAME`: an :class:`Entry` per
  file with its size, sha256 and label), :func:`build_manifest`, :func:`sha256_file`; a backend that can list
  its objects' hashes without reading them implements :class:`HashListing`;
* publishing -- :func:`result_files` (``result.json`` last), :func:`checkpoint_files`,
  :func:`publish_files` (the last file after all the others), and :class:`CheckpointPublisher`
  for a backend that copies each checkpoint as soon as it is written;
* :class:`StagingStorage` with :class:`LocalSsdConfig` (and its :class:`Verify` choices) -- the
  base of ``storage=local_ssd`` and of remote object-store backends (``ddlkit-azure``): data staged
  to each node's disk (under :func:`dataset_dirname`), results published to ``results``. Subclass
  it and add ``put``/``get``/``exists``/``list``.

The built-in storages (``nfs``, ``local_ssd``) use this module as any plugin does. It imports no
cloud SDK: a URL's backend is found among the installed plugins when :func:`open_storage` is called.
"""

from ._manifest import MANIFEST_NAME, Entry, HashListing, Manifest, build_manifest, sha256_file
from ._publish import CheckpointPublisher, checkpoint_files, publish_files, result_files
from ._retry import TransientStorageError, retry
from ._staging import LocalSsdConfig, StagingReport, StagingStorage, Verify, dataset_dirname, is_staged, stage
from ._urls import is_url, open_storage, split_url

__all__ = [
    "MANIFEST_NAME",
    "CheckpointPublisher",
    "Entry",
    "HashListing",
    "LocalSsdConfig",
    "Manifest",
    "StagingReport",
    "StagingStorage",
    "TransientStorageError",
    "Verify",
    "build_manifest",
    "checkpoint_files",
    "dataset_dirname",
    "is_staged",
    "is_url",
    "open_storage",
    "publish_files",
    "result_files",
    "retry",
    "sha256_file",
    "split_url",
    "stage",
]
