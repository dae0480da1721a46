"""``compute=azureml``'s environment: ddlkit's image built by the workspace, or ``compute.image``.

**Built by the workspace** (no ``compute.image``): the environment ``ddlkit-<framework>-<cpu|cuda>``
at the version of its build context's digest (:func:`ddlkit.compute.containers.image_context`:
ddlkit's ``docker/Dockerfile`` with the framework and variant written in, and the files of this
checkout it installs, as ``.dockerignore`` lets them in). A job asks the workspace for that version
first; only when it does not exist is it created: the SDK uploads the context to the workspace's
default datastore and PUTs the version with ``build.contextUri``, and the workspace builds the image
into its registry when the first job needs it. Every later job with the same files finds the version
and reuses that image; a changed checkout (another ddlkit, an edited plugin) is a new version.

With ``dist=horovod`` the workspace builds the image with Horovod (``HOROVOD=1``,
``ddlkit-<framework>-cpu-horovod``); ddlkit's recipe builds Horovod for the CPU only, so a GPU job
with Horovod needs ``compute.image`` (refused otherwise, before anything is sent).

**compute.image**: that image, as the job's anonymous environment; its registry is asked for it
first (:func:`ddlkit.compute.containers.ensure_pullable`). The workspace pulls with credentials of
its own (its registry's, its identity's), which ddlkit does not have: a registry that refuses ddlkit
is told on the console, and the job is submitted.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ddlkit
from ddlkit.compute.containers import DOCKERFILE, HOROVOD_SUFFIX, ImageContext, ensure_pullable, image_context

if TYPE_CHECKING:
    from ._azureml import Workspace
    from .azureml import AzureMLTarget

#: hex digits of the context's digest in the environment's version (64 bits: no two contexts meet)
VERSION_DIGITS = 16


@dataclass(frozen=True)
class WorkspaceBuild:
    """The environment a workspace builds ddlkit's image of a framework and variant in."""

    name: str
    context: ImageContext

    @property
    def version(self) -> str:
        return self.context.digest[:VERSION_DIGITS]

    @property
    def reference(self) -> str:
        """How a job names it: ``azureml:<name>:<version>``."""
        return f"azureml:{self.name}:{self.version}"

    def describe(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in self.context.build_args.items())
        return (
            f"{self.name}:{self.version}, built by the workspace from {DOCKERFILE} ({args}) with "
            f"{len(self.context.files)} files, {self.context.size / 1e6:.1f} MB, of {self.context.root}; "
            "created by the first job that finds no such version, reused by every later one"
        )


def workspace_build(target: AzureMLTarget) -> WorkspaceBuild | None:
    """The environment the workspace builds for ``target``'s jobs, or None with ``compute.image``.
    With ``dist=horovod`` it is the image with Horovod built in (``HOROVOD=1``), an environment of
    its own (``ddlkit-<framework>-cpu-horovod``): the ranks import Horovod from it."""
    cfg = target.cfg
    if cfg.image:
        return None
    horovod = target.horovod
    name = f"ddlkit-{cfg.framework}-{'cuda' if cfg.gpu else 'cpu'}" + (HOROVOD_SUFFIX if horovod else "")
    return WorkspaceBuild(name, image_context(str(cfg.framework), gpu=bool(cfg.gpu), horovod=horovod))


def job_environment(workspace: Workspace, target: AzureMLTarget) -> Any:
    """What the job names as its environment, ready to be used: the built environment's reference
    (created when the workspace has no such version), or ``compute.image`` once its registry was asked."""
    from azure.ai.ml.entities import BuildContext, Environment
    from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

    from ._azureml import sdk_uploading

    build = workspace_build(target)
    if build is None:
        ensure_pullable(str(target.cfg.image), refusal_is_final=False)
        return Environment(image=str(target.cfg.image))
    with workspace.errors(f"reading environment {build.name}:{build.version}"):
        try:
            workspace.client.environments.get(build.name, build.version)
            return build.reference
        except ResourceNotFoundError:
            pass
    print(
        f"ddlkit: creating environment {build.name}:{build.version} in workspace {target.cfg.workspace}: the "
        f"workspace builds ddlkit's image from it for the first job (this takes a while), later jobs reuse it",
        file=sys.stderr,
        flush=True,
    )
    what = f"creating environment {build.name}:{build.version}"
    with (
        tempfile.TemporaryDirectory(prefix="ddlkit-azureml-") as tmp,
        workspace.errors(what),
        sdk_uploading(f"{what}: uploading its build context"),
    ):
        environment = Environment(
            name=build.name,
            version=build.version,
            build=BuildContext(path=str(build.context.write(Path(tmp) / "context")), dockerfile_path=DOCKERFILE),
            description=f"ddlkit {ddlkit.__version__}'s image, built from {DOCKERFILE}",
            tags={"ddlkit_version": ddlkit.__version__, "sha256": build.context.digest, **build.context.build_args},
        )
        try:
            workspace.uploader.environments.create_or_update(environment)
        except ResourceExistsError:
            pass  # another launcher created the same version meanwhile: the same files, the same image
    return build.reference
