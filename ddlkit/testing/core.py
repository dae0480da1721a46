"""What a plugin's test suite checks against in the core, named here so that the suite imports public
modules only, as the plugin itself does.

The modules these names come from -- ``ddlkit.checkpoint``, ``ddlkit.config``, ``ddlkit.plugins``,
``ddlkit.registry``, ``ddlkit.resize``, ``ddlkit.builtin`` and the launcher wing ``ddlkit.launch`` -- are
the core's own and may change without notice; the test kit keeps these names working for its users.

* checkpoints a job left: :func:`latest_checkpoint`, :func:`verify` (a checkpoint matches its manifest),
  :func:`checkpoint_step`, :data:`BEST` (the best checkpoint's name);
* the config's core schemas, to build a config by hand: :class:`TrainerConfig`, :class:`DistConfig`,
  :class:`Precision`;
* the installed plugins and their registrations: :func:`new_plugin_manager`, :func:`get_plugin_manager`,
  :class:`DdlkitPluginManager`, :class:`Registry` (``Registry.collect(new_plugin_manager())``);
* the launcher's steps, to test a plugin's part in them without running a job: :func:`main` (the
  ``ddlkit`` command in this process), :func:`validate`, :func:`job_name`, :func:`job_environment`, and
  :func:`upload` (``ddlkit data upload``);
* the image-folder data source, for a framework's loader over it: :class:`ImageFolderConfig`,
  :class:`ImageFolderData`; and :data:`PLANNED_WORLD_SIZE_ENV`, the world size a job was planned for.
"""

from __future__ import annotations

from ..builtin.imagefolder import ImageFolderConfig, ImageFolderData
from ..checkpoint import BEST, checkpoint_step, latest_checkpoint, verify
from ..config import DistConfig, Precision, TrainerConfig
from ..launch.cli import main
from ..launch.data_cli import upload
from ..launch.prepare import job_environment, job_name
from ..launch.validate import validate
from ..plugins import DdlkitPluginManager, get_plugin_manager, new_plugin_manager
from ..registry import Registry
from ..resize import PLANNED_WORLD_SIZE_ENV

__all__ = [
    "BEST",
    "PLANNED_WORLD_SIZE_ENV",
    "DdlkitPluginManager",
    "DistConfig",
    "ImageFolderConfig",
    "ImageFolderData",
    "Precision",
    "Registry",
    "TrainerConfig",
    "checkpoint_step",
    "get_plugin_manager",
    "job_environment",
    "job_name",
    "latest_checkpoint",
    "main",
    "new_plugin_manager",
    "upload",
    "validate",
    "verify",
]
