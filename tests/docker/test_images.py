"""ddlkit's images, really built and run: scripts/build_images.sh builds the CPU image of each framework
from docker/Dockerfile with podman, and ddlkit trains inside it, under OpenMPI where the framework can;
and the build context compute=azureml uploads is the one podman's own build takes from the repository.

No Docker daemon runs here, so the build takes what works without one (README, "Docker images"):
a Debian 12 base made by debootstrap from Debian's packages and imported into podman (passed as the
BASE build argument; the Dockerfile's default stays the production base), podman's overlay storage
(vfs where overlay cannot be mounted) and chroot isolation, `buildah run` to run inside the image,
and pip offline from a directory of wheels fetched on this machine (torch from this machine's CPU
wheel: the index's torch is the multi-GB CUDA build). The base image, the wheels and (with overlay)
the image layers are cached in $DDLKIT_DOCKER_CACHE (default ~/.cache/ddlkit/docker), so a second
run rebuilds only what changed."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddlkit.compute.containers import default_image, image_context
from ddlkit.redact import has_credentials, is_secret_key

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/ddlkit-test-base:bookworm"
REGISTRY = "localhost/ddlkit-test"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# 4 steps of a small ResNet; a warm-up of 1 step leaves 3 measured, so images/sec is a real figure
TRAINING = [
    "model=resnet18",
    "data.image_size=32",
    "data.num_classes=10",
    "data.length=64",
    "data.val_length=16",
    "trainer.batch_size=8",
    "trainer.epochs=1",
    "trainer.max_steps=4",
    "trainer.warmup_steps=1",
    "trainer.log_every=1",
    "hydra.run.dir=job",
]


def missing_tools() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "debootstrap and podman's chroot builds need root on Linux"
    missing = [tool for tool in ("podman", "buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install podman buildah debootstrap; .ci/run does)"
    if sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64":
        return "the wheels are downloaded for this Python, which must be the image's (Debian 12: 3.11, x86_64)"
    return None


if reason := missing_tools():
    pytestmark = [pytestmark, pytest.mark.skip(reason=reason)]


def check(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def cache() -> Path:
    directory = Path(os.environ.get("DDLKIT_DOCKER_CACHE") or Path.home() / ".cache" / "ddlkit" / "docker")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@dataclass(frozen=True)
class Podman:
    #: the environment podman and buildah run in: CONTAINERS_STORAGE_CONF names their image store
    env: dict[str, str]
    #: overlay, or vfs where overlay cannot be mounted (vfs copies the whole file system for every
    #: layer: there each image is built as one layer and removed after its test)
    driver: str

    @property
    def build_options(self) -> list[str]:
        return [] if self.driver == "overlay" else ["--layers=false"]


@pytest.fixture(scope="module")
def podman(cache: Path) -> Iterator[Podman]:
    """podman and buildah with their own image store in the cache; its dangling images pruned at the end."""
    for driver in ("overlay", "vfs"):
        storage_conf = cache / f"storage-{driver}.conf"
        storage_conf.write_text(
            f'[storage]\ndriver = "{driver}"\ngraphroot = "{cache / f"storage-{driver}"}"\n'
            f'runroot = "{Path(tempfile.gettempdir()) / f"ddlkit-docker-{driver}"}"\n'
        )
        env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(storage_conf), "PYTHON": sys.executable}
        if subprocess.run(["podman", "info"], capture_output=True, env=env).returncode == 0:
            break
    yield Podman(env, driver)
    subprocess.run(["podman", "image", "prune", "--force"], capture_output=True, env=env)


@pytest.fixture(scope="module")
def base_image(cache: Path, podman: Podman) -> str:
    """Debian 12 as debian:bookworm-slim is made (debootstrap's minbase), imported once."""
    if subprocess.run(["podman", "image", "exists", BASE_IMAGE], env=podman.env).returncode == 0:
        return BASE_IMAGE
    with tempfile.TemporaryDirectory(dir=cache) as work:
        rootfs = Path(work) / "rootfs"
        check(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR])
        # as the slim image: no package lists, no downloaded packages
        for leftovers in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for path in (rootfs / leftovers).glob("*"):
                if path.is_file():
                    path.unlink()
        tarball = Path(work) / "rootfs.tar"
        check(["tar", "-C", str(rootfs), "-cf", str(tarball), "."])
        check(["podman", "import", "--change", 'CMD ["bash"]', str(tarball), BASE_IMAGE], env=podman.env)
    return BASE_IMAGE


@pytest.fixture(scope="module")
def wheels(cache: Path, dockerfile_args: dict[str, str]) -> Path:
    """Every wheel the images install: the frameworks at the Dockerfile's pins, and the dependencies of
    ddlkit and of all its plugins, for this Python. Fetched again only when a pin or a pyproject changes."""
    directory = cache / "wheels"
    directory.mkdir(exist_ok=True)
    projects = [REPO, *sorted(p.parent for p in (REPO / "plugins").glob("*/pyproject.toml"))]
    build_backends = sorted(
        {
            requirement
            for project in projects
            for requirement in tomllib.loads((project / "pyproject.toml").read_text())["build-system"]["requires"]
        }
    )
    torch = f"torch=={dockerfile_args['TORCH_VERSION']}"
    tensorflow = f"tensorflow-cpu=={dockerfile_args['TENSORFLOW_VERSION']}"
    stamp = hashlib.sha256(
        json.dumps(
            [torch, tensorflow, *build_backends, *((project / "pyproject.toml").read_text() for project in projects)]
        ).encode()
    ).hexdigest()
    if (directory / "stamp").is_file() and (directory / "stamp").read_text() == stamp:
        return directory
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(directory)]
    check([*pip, "--no-deps", torch])
    torch_wheels = sorted(directory.glob(f"torch-{dockerfile_args['TORCH_VERSION']}+cpu-*.whl"))
    assert torch_wheels, (
        f"pip found no CPU build of {torch} (the index has the multi-GB CUDA build): "
        "put its wheel in a --find-links directory of pip's, where requirements.txt's comes from"
    )
    check([*pip, str(torch_wheels[-1]), tensorflow, *build_backends, *map(str, projects)], cwd=REPO)
    (directory / "stamp").write_text(stamp)
    return directory


def test_the_context_a_workspace_builds_from_is_what_podman_sends(
    base_image: str, podman: Podman, tmp_path: Path
) -> None:
    """image_context (what compute=azureml uploads for the workspace to build from) reads .dockerignore
    as a real build does: its files are the ones podman copies out of the repository."""
    recipe = tmp_path / "Dockerfile"
    recipe.write_text(f"FROM {base_image}\nCOPY . /context\n")
    tag = "localhost/ddlkit-test-context:latest"
    check(
        ["podman", "build", *podman.build_options, "--isolation", "chroot", "-f", str(recipe), "-t", tag, str(REPO)],
        env=podman.env,
    )
    container = check(["buildah", "from", tag], env=podman.env).stdout.strip()
    try:
        root = Path(check(["buildah", "mount", container], env=podman.env).stdout.strip()) / "context"
        copied = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, env=podman.env)
        subprocess.run(["podman", "rmi", tag], capture_output=True, env=podman.env)
    assert copied == list(image_context("pytorch").files)


@pytest.mark.parametrize(
    ("framework", "launch", "world_size"),
    [
        ("pytorch", ["compute=local_mpi", "compute.procs_per_node=2", "dist=native"], 2),
        # one rank: TensorFlow's 2 ranks under the image's mpirun are trained by the Horovod image's test below
        # (the same image plus one layer), and MultiWorkerMirroredStrategy's start alone costs CI a minute and
        # a half here; its 2 native ranks are checked outside images (plugins/ddlkit-tensorflow/tests/test_dist.py)
        ("tensorflow", ["compute=local"], 1),
        # Keras refuses dist=native (README, "Distributed training"): one rank
        ("keras", ["compute=local"], 1),
    ],
)
def test_the_cpu_image_builds_and_trains(
    framework: str, launch: list[str], world_size: int, base_image: str, wheels: Path, podman: Podman
) -> None:
    build_and_train(framework, launch, world_size, base_image, wheels, podman)


@pytest.fixture(scope="module")
def horovod_wheel(wheels: Path, dockerfile_args: dict[str, str]) -> Path:
    """The Horovod wheel scripts/install_horovod.sh built on this machine for the Dockerfile's torch and
    TensorFlow (both bindings; CI builds it before the tests), put among the build's wheels with what the
    script installs beside it: the images install it instead of building Horovod (5-9 minutes)."""
    cache = Path(os.environ.get("DDLKIT_HOROVOD_CACHE") or Path.home() / ".cache" / "ddlkit" / "horovod")
    key = (
        f"horovod-0.28.1-torch-{dockerfile_args['TORCH_VERSION']}_cpu-tf-{dockerfile_args['TENSORFLOW_VERSION']}"
        f"-cp{sys.version_info[0]}{sys.version_info[1]}"
    )
    built = sorted((cache / key).glob("horovod-0.28.1-*.whl"))
    if not built:
        pytest.skip(
            f"no Horovod wheel in {cache / key}: run scripts/install_horovod.sh with the Dockerfile's torch "
            "and TensorFlow installed (CI does)"
        )
    shutil.copy2(built[-1], wheels / built[-1].name)
    check(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--dest",
            str(wheels),
            "cloudpickle",
            "psutil",
            "pyyaml",
            "packaging",
        ]
    )
    return wheels / built[-1].name


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow", "keras"])
def test_the_cpu_image_with_horovod_trains_2_ranks(
    framework: str, base_image: str, wheels: Path, horovod_wheel: Path, podman: Podman
) -> None:
    """scripts/build_images.sh --horovod: the image tagged ...-cpu-horovod trains with dist=horovod on 2
    ranks started by the image's own mpirun (without Horovod, or without the framework's binding, the
    job is refused before it starts: Framework.check_environment)."""
    build_and_train(
        framework,
        ["compute=local_mpi", "compute.procs_per_node=2", "dist=horovod"],
        2,
        base_image,
        wheels,
        podman,
        horovod=True,
    )


def build_and_train(
    framework: str,
    launch: list[str],
    world_size: int,
    base_image: str,
    wheels: Path,
    podman: Podman,
    *,
    horovod: bool = False,
) -> None:
    """Build the framework's CPU image (with Horovod: --horovod) with scripts/build_images.sh, train in it,
    and check what it left."""
    image = default_image(framework, gpu=False, registry=REGISTRY, horovod=horovod)
    build = check(
        [
            "bash",
            str(REPO / "scripts" / "build_images.sh"),
            "--engine",
            "podman",
            "--variant",
            "cpu",
            *(["--horovod"] if horovod else []),
            "--registry",
            REGISTRY,
            framework,
            "--",
            *podman.build_options,
            "--isolation",
            "chroot",
            "--build-arg",
            f"BASE={base_image}",
            "--volume",
            f"{wheels}:/wheels:ro",
            "--build-arg",
            "PIP_FIND_LINKS=/wheels",
            "--build-arg",
            "PIP_NO_INDEX=1",
        ],
        env=podman.env,
    )
    print(build.stdout.splitlines()[-1], f"({podman.driver})")  # build_images.sh: built <image> in N s
    container = check(["buildah", "from", image], env=podman.env).stdout.strip()
    inside = ["buildah", "run", "--isolation", "chroot", container, "--"]
    try:
        train = subprocess.run(
            [*inside, "ddlkit", f"framework={framework}", *launch, *TRAINING],
            capture_output=True,
            text=True,
            env=podman.env,
        )
        assert train.returncode == 0, train.stdout[-6000:] + train.stderr[-6000:]
        result = json.loads(check([*inside, "cat", "job/result.json"], env=podman.env).stdout)
        user = check([*inside, "id", "-u"], env=podman.env).stdout.strip()
        config = json.loads(check(["podman", "image", "inspect", image], env=podman.env).stdout)[0]["Config"]
        history = check(["podman", "history", "--no-trunc", "--format", "{{.CreatedBy}}", image], env=podman.env).stdout
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, env=podman.env)
        if podman.driver == "vfs":  # 1.5 to 2.5 GB each there, and no layer to reuse
            subprocess.run(["podman", "rmi", image], capture_output=True, env=podman.env)
    assert (result["status"], result["framework"], result["steps"], result["world_size"]) == (
        "completed",
        framework,
        4,
        world_size,
    )
    assert result["images_per_sec"] > 0
    assert user == "1000"
    # what the image carries besides its files: its environment, and the build arguments in its history
    assert [variable for variable in config["Env"] if is_secret_key(variable.partition("=")[0])] == []
    assert not has_credentials(json.dumps(config) + history)
