"""ddlkit.compute.containers.default_image names the images; scripts/build_images.sh tags with it and refuses bad
input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ddlkit
from ddlkit.compute.containers import default_image, release_frameworks

REPO = Path(__file__).resolve().parents[2]
BUILD_IMAGES = REPO / "scripts" / "build_images.sh"

# the tests marked plugins name the images of ddlkit-pytorch, ddlkit-tensorflow and ddlkit-keras: ddlkit's images
# are those of the frameworks whose plugins say they have one (release_frameworks)


@pytest.mark.parametrize(
    ("framework", "gpu", "registry", "image"),
    [
        ("pytorch", True, "docker.io/ddlkit", f"docker.io/ddlkit/pytorch:{ddlkit.__version__}-cuda"),
        ("tensorflow", False, "docker.io/ddlkit", f"docker.io/ddlkit/tensorflow:{ddlkit.__version__}-cpu"),
        ("keras", True, "myregistry.azurecr.io/", f"myregistry.azurecr.io/keras:{ddlkit.__version__}-cuda"),
        (
            "pytorch",
            False,
            "localhost:5000/team/ddlkit",
            f"localhost:5000/team/ddlkit/pytorch:{ddlkit.__version__}-cpu",
        ),
    ],
)
@pytest.mark.plugins
def test_default_image(framework: str, gpu: bool, registry: str, image: str) -> None:
    assert default_image(framework, gpu=gpu, registry=registry) == image


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.plugins
def test_the_image_with_horovod_has_a_tag_of_its_own(gpu: bool) -> None:
    """dist=horovod's image (scripts/build_images.sh --horovod) is told apart from the one without."""
    variant = "cuda" if gpu else "cpu"
    assert default_image("keras", gpu=gpu, horovod=True) == (
        f"docker.io/ddlkit/keras:{ddlkit.__version__}-{variant}-horovod"
    )


@pytest.mark.plugins
def test_the_default_is_the_cuda_image_on_docker_hub() -> None:
    assert default_image("pytorch") == f"docker.io/ddlkit/pytorch:{ddlkit.__version__}-cuda"


@pytest.mark.plugins
def test_a_framework_without_an_image_names_the_ones_with_and_the_fix() -> None:
    with pytest.raises(ddlkit.ConfigError) as err:
        default_image("jax")
    assert str(err.value) == (
        "ddlkit builds no image for framework=jax; its images are for keras, pytorch, tensorflow. "
        "Set compute.image to an image that has ddlkit and your framework's plugin installed."
    )


@pytest.mark.parametrize("registry", ["https://myregistry.azurecr.io", "MyRegistry.azurecr.io", "", "a b"])
@pytest.mark.plugins
def test_a_registry_that_makes_no_image_name_is_refused(registry: str) -> None:
    with pytest.raises(ddlkit.ConfigError, match="is not a registry for an image name: give host"):
        default_image("pytorch", registry=registry)


@pytest.mark.plugins
def test_naming_an_image_imports_no_framework() -> None:
    probe = (
        "import sys; from ddlkit.compute.containers import default_image; default_image('pytorch'); "
        "print(sorted({'torch', 'tensorflow', 'keras'} & set(sys.modules)))"
    )
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )


def build_images(*args: str) -> subprocess.CompletedProcess[str]:
    # the input is checked before the engine is looked for: these need no podman
    return subprocess.run(
        ["bash", str(BUILD_IMAGES), "--engine", "podman", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["jax"],
            (
                "build_images.sh: error: ddlkit builds no image for framework=jax; its images are for "
                f"{', '.join(release_frameworks())}."
            ),
        ),
        (["--variant", "gpu"], "build_images.sh: error: --variant is cuda or cpu, not 'gpu'"),
        pytest.param(
            ["--registry", "https://myregistry.azurecr.io"],
            "build_images.sh: error: 'https://myregistry.azurecr.io' is not a registry for an image name",
            marks=pytest.mark.plugins,
        ),
        (["--engine", "rkt"], "build_images.sh: error: --engine is docker or podman, not 'rkt'"),
        (["--squash"], "build_images.sh: error: unknown option --squash"),
        (["--registry"], "build_images.sh: error: --registry needs one"),
        (
            ["--horovod"],
            "build_images.sh: error: --horovod builds the CPU images only (add --variant cpu): Horovod's NCCL "
            "build needs the CUDA toolkit",
        ),
    ],
)
def test_build_images_refuses_bad_input_in_one_line(args: list[str], message: str) -> None:
    proc = build_images(*args)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith(message)
    assert proc.stderr.count("\n") == 1
