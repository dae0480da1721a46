"""ddlkit's container images (built from ``docker/Dockerfile``): their names, their build context,
and whether a registry has one.

One image per framework and variant, tagged with ddlkit's version: a remote compute target
uses :func:`default_image` when the user sets no ``compute.image``, and
``scripts/build_images.sh`` tags what it builds with the same names. A service that builds
images itself (an Azure ML workspace) gets :func:`image_context`: the files ``docker build``
would send, with the build arguments written into the Dockerfile, and a digest of them all.
Before a target submits a job that pulls an image, :func:`ensure_pullable` asks the image's
registry (:func:`check_image`, the OCI distribution API) and refuses one it does not have.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .._version import __version__
from ..errors import ConfigError
from ._dockerignore import DockerIgnore
from ._oci import ImageCheck, ImageReference, Pullable, check_image
from .snapshot import _digest as files_digest  # the code snapshot's: one way to digest a tree of files

__all__ = [
    "CHECKOUT",
    "DEFAULT_REGISTRY",
    "DOCKERFILE",
    "HOROVOD_SUFFIX",
    "ImageCheck",
    "ImageContext",
    "Pullable",
    "check_image",
    "default_image",
    "ensure_pullable",
    "horovod_image_note",
    "image_context",
    "release_frameworks",
]

#: where the release images are pushed
DEFAULT_REGISTRY = "docker.io/ddlkit"
#: the end of the tag of an image with Horovod built in (``0.1.0-cpu-horovod``)
HOROVOD_SUFFIX = "-horovod"

# host[:port][/namespace...]: what may stand before "/<framework>:<tag>" in an image reference
_REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*")


def default_image(framework: str, *, gpu: bool = True, registry: str = DEFAULT_REGISTRY, horovod: bool = False) -> str:
    """The image of ``framework`` at this ddlkit's version, e.g. ``docker.io/ddlkit/pytorch:0.1.0-cuda``.

    :param gpu: the CUDA variant (``-cuda``) or the CPU one (``-cpu``).
    :param registry: host and namespace to pull from, e.g. ``myregistry.azurecr.io/ddlkit``.
    :param horovod: the image with Horovod built in (``-horovod``: ``scripts/build_images.sh --horovod``),
        for ``dist=horovod``; the others have none.
    :raises ConfigError: a framework ddlkit builds no image for, or a malformed registry.
    """
    frameworks = release_frameworks()
    if framework not in frameworks:
        raise ConfigError(
            f"ddlkit builds no image for framework={framework}; its images are for {', '.join(frameworks)}. "
            "Set compute.image to an image that has ddlkit and your framework's plugin installed."
        )
    registry = registry.rstrip("/")
    if not _REGISTRY.fullmatch(registry):
        raise ConfigError(
            f"{registry!r} is not a registry for an image name: give host[/namespace] in lowercase, without "
            "https://, e.g. myregistry.azurecr.io/ddlkit."
        )
    return f"{registry}/{framework}:{__version__}-{'cuda' if gpu else 'cpu'}{HOROVOD_SUFFIX if horovod else ''}"


def horovod_image_note(*, gpu: bool) -> str:
    """Where the Horovod of ddlkit's image for ``dist=horovod`` comes from, for a plan to say: the
    ranks import it from the image, so the launcher needs none."""
    if not gpu:
        return (
            "ddlkit's CPU image with Horovod 0.28.1 (Gloo and MPI) built in (scripts/build_images.sh --horovod "
            "--variant cpu); the launcher needs no Horovod"
        )
    return (
        "a CUDA image with Horovod built with NCCL, which ddlkit's docker/Dockerfile does not build (its "
        "Horovod is CPU-only: docs/how-to/docker.md says which base image to build it on); push it under "
        "this name or set compute.image; the launcher needs no Horovod"
    )


def release_frameworks() -> list[str]:
    """The installed frameworks that ddlkit's release images are built for (``Framework.release_image``)."""
    from ..plugins import installed_registry

    registry = installed_registry()
    return [
        name
        for name in registry.names("framework")
        if getattr(registry.get("framework", name).factory, "release_image", False)
    ]


# ---------------------------------------------------------------------------- the build context
#: the recipe, relative to a ddlkit checkout (and to the build context)
DOCKERFILE = "docker/Dockerfile"
#: the checkout this ddlkit is installed from, which its image is built from (an editable install's;
#: a wheel's installation has no recipe there)
CHECKOUT = Path(__file__).resolve().parents[2]
_DOCKERIGNORE = ".dockerignore"


@dataclass(frozen=True)
class ImageContext:
    """What ``docker build -f docker/Dockerfile --build-arg ... .`` sends from a ddlkit checkout: the
    files ``.dockerignore`` lets in, the ``.dockerignore`` itself, and ``docker/Dockerfile`` with the
    build arguments written in as its defaults (for a builder that takes no build arguments)."""

    #: the checkout the files are read from
    root: Path
    #: the files let in, relative to ``root`` (POSIX), sorted
    files: tuple[str, ...]
    #: ``docker/Dockerfile`` with the build arguments as its defaults
    dockerfile: str
    #: what was written into it: ``FRAMEWORK`` and ``VARIANT`` (and ``HOROVOD`` for an image with Horovod)
    build_args: Mapping[str, str]
    #: SHA-256 over the files' paths and contents, the ``.dockerignore`` and the Dockerfile: the same
    #: checkout and arguments give the same digest, any change another
    digest: str

    @property
    def size(self) -> int:
        return sum((self.root / rel).stat().st_size for rel in self.files) + len(self.dockerfile.encode())

    def write(self, into: Path) -> Path:
        """The context as a directory (``into``, created); ``DOCKERFILE`` is the one to build."""
        for rel in (*self.files, _DOCKERIGNORE):
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.root / rel, into / rel)
        (into / DOCKERFILE).parent.mkdir(parents=True, exist_ok=True)
        (into / DOCKERFILE).write_text(self.dockerfile, encoding="utf-8")
        return into


def image_context(framework: str, *, gpu: bool = True, horovod: bool = False) -> ImageContext:
    """The build context of ddlkit's image of ``framework`` (CUDA or CPU; with Horovod built in when
    ``horovod``: ``HOROVOD=1``), from the checkout this ddlkit is installed from.

    :raises ConfigError: a framework ddlkit builds no image for, an installation without its checkout
        (a wheel has no ``docker/Dockerfile``), or a Dockerfile without the build arguments to set.
    """
    default_image(framework, gpu=gpu)  # refuses a framework without an image, naming the ones with
    root = CHECKOUT
    if not (root / DOCKERFILE).is_file() or not (root / "plugins").is_dir():
        raise ConfigError(
            f"ddlkit's image is built from {DOCKERFILE} of a ddlkit checkout, and this ddlkit is installed without "
            f"one ({root} has no {DOCKERFILE}): install ddlkit from its repository (pip install -e <checkout>), or "
            "set compute.image to an image that has ddlkit and your framework's plugin installed."
        )
    build_args = {"FRAMEWORK": framework, "VARIANT": "cuda" if gpu else "cpu"}
    if horovod:
        build_args["HOROVOD"] = "1"
    dockerfile = (root / DOCKERFILE).read_text(encoding="utf-8")
    for name, value in build_args.items():
        dockerfile, found = re.subn(rf"^ARG {name}=.*$", f"ARG {name}={value}", dockerfile, flags=re.MULTILINE)
        if found != 1:
            raise ConfigError(
                f"{root / DOCKERFILE} has no line `ARG {name}=<default>` to set {name}={value} in: "
                f"restore it from ddlkit's repository, or set compute.image."
            )
    ignore = DockerIgnore.read(root / _DOCKERIGNORE)
    files = tuple(sorted(rel for rel in ignore.files(root) if rel not in (DOCKERFILE, _DOCKERIGNORE)))
    total = hashlib.sha256(files_digest(root, [*files, _DOCKERIGNORE]).encode())
    total.update(b"\0" + DOCKERFILE.encode() + b"\0" + dockerfile.encode())
    return ImageContext(root, files, dockerfile, build_args, total.hexdigest())


# ---------------------------------------------------------------------------- is it there?
def ensure_pullable(
    image: str,
    *,
    username: str | None = None,
    password: str | None = None,
    refusal_is_final: bool = True,
    timeout: float = 10.0,
    say: Callable[[str], None] | None = None,
) -> ImageCheck:
    """Ask ``image``'s registry for it (:func:`check_image`) before a job that pulls it is submitted.

    :param refusal_is_final: the nodes pull with the credentials given here (none: anonymously), so a
        registry that refuses them refuses the nodes too. False where the nodes have credentials of
        their own (an Azure ML workspace's for its registry): a refusal is then an answer that cannot be had.
    :param say: where a check that cannot be made is told, one line (default: stderr); the job is
        submitted anyway.
    :raises ConfigError: the registry has no such image (or, with ``refusal_is_final``, refuses it).
    """
    check = check_image(image, username=username, password=password, timeout=timeout)
    ref = ImageReference.parse(image)
    registry = "/".join(filter(None, (ref.registry, ref.repository.rpartition("/")[0])))
    fix = (
        f"Build and push it (ddlkit's images: scripts/build_images.sh --registry {registry} --push), or set "
        "compute.image to an image that exists."
    )
    if check.answer is Pullable.NOT_FOUND:
        raise ConfigError(f"image {image} does not exist ({check.reason}). {fix}")
    if check.answer is Pullable.DENIED and refusal_is_final:
        raise ConfigError(f"image {image} cannot be pulled: {check.reason}, so it does not exist or is private. {fix}")
    if check.answer is not Pullable.YES:
        (say or _stderr)(
            f"ddlkit: note: could not check that image {image} can be pulled ({check.reason}); submitting anyway"
        )
    return check


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
