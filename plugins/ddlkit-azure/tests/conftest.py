"""The plugin's suite uses ddlkit's test kit and its own Azurite fixtures, as a third party would,
and the loopback HTTPS kit (:mod:`ddlkit_azure.testing.loopback`) for the services Azurite does not emulate."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ddlkit_azure.testing import Azurite
from ddlkit_azure.testing.azureml import LoopbackWorkspace
from ddlkit_azure.testing.loopback import (
    CREDENTIAL_ENV,
    Certificate,
    LoopbackServer,
    install_az,
    make_certificate,
    sdk_environment,
)

if TYPE_CHECKING:
    from ddlkit.testing.registry import LoopbackRegistry

pytest_plugins = ["ddlkit.testing", "ddlkit_azure.testing"]


@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation: None) -> None:
    """Environment restored, own working directory, fresh plugin manager (ddlkit.testing)."""


@pytest.fixture(scope="session")
def loopback_certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    """A self-signed certificate for 127.0.0.1/localhost (one per session: key generation is not free)."""
    return make_certificate(tmp_path_factory.mktemp("loopback-tls"))


@pytest.fixture
def https_loopback(loopback_certificate: Certificate, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackServer]:
    """A started :class:`LoopbackServer` (no routes yet), and ``REQUESTS_CA_BUNDLE``/``SSL_CERT_FILE``
    set so that the real SDKs (and subprocesses started by the test) trust it."""
    for name, value in sdk_environment(loopback_certificate).items():
        monkeypatch.setenv(name, value)
    with LoopbackServer(loopback_certificate) as server:
        yield server
        assert not server.errors, "a loopback handler raised:\n" + "\n".join(server.errors)


@pytest.fixture
def azure_cli_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Signed in as far as ``DefaultAzureCredential`` can tell: a stand-in ``az`` first on ``PATH``
    (it prints a token), ``AZURE_TOKEN_CREDENTIALS=AzureCliCredential``, and no other credential's
    variables. Returns the stand-in's directory; ``<it>/az.log`` has one line per ``az`` call."""
    for name in CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    bin_dir = install_az(tmp_path / "az-bin")
    for name, value in sdk_environment(az_bin=bin_dir).items():
        monkeypatch.setenv(name, value)
    return bin_dir


@pytest.fixture
def azureml_workspace(
    https_loopback: LoopbackServer,
    azurite: Azurite,
    azure_cli_login: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[LoopbackWorkspace]:
    """A loopback Azure ML workspace (:mod:`ddlkit_azure.testing.azureml`) whose jobs run on this
    machine, its storage in Azurite; the SDK (in this process and in subprocesses) signed in and
    pointed at it."""
    with LoopbackWorkspace(https_loopback, azurite, tmp_path / "azureml", grace_period_s=20.0) as workspace:
        for name, value in workspace.environment.items():
            monkeypatch.setenv(name, value)
        # MLClient records the cloud it chose in the process's environment
        monkeypatch.setenv("AZUREML_CURRENT_CLOUD", "AzureCloud")
        yield workspace


@dataclass
class UserProject:
    """A launch directory holding a researcher's own data package, ``my_pkg``, that exists nowhere
    else: a job reaches it only as the code snapshot of this directory."""

    root: Path
    #: what trains on it: 8x8 images of 4 classes from my_pkg.data:samples, an epoch of n / 8 steps
    overrides: tuple[str, ...] = (
        "data=custom",
        "data.target=my_pkg.data:samples",
        "data.num_classes=4",
        "data.image_size=8",
        "trainer.batch_size=8",
        "trainer.epochs=1",
    )

    def write(self, n: int = 32) -> None:
        """The package, its function making ``n`` samples per split by default."""
        (self.root / "my_pkg").mkdir(parents=True, exist_ok=True)
        (self.root / "my_pkg" / "__init__.py").write_text("")
        (self.root / "my_pkg" / "data.py").write_text(self.data_module(n))

    @staticmethod
    def data_module(n: int) -> str:
        return (
            "import numpy as np\n\n\n"
            f"def samples(split, n={n}):\n"
            "    rng = np.random.default_rng(0 if split == 'train' else 1)\n"
            "    return rng.uniform(0, 1, (n, 8, 8, 3)).astype('float32'), rng.integers(0, 4, n)\n"
        )


@pytest.fixture
def user_project(tmp_path: Path) -> UserProject:
    """``tmp_path/project`` with ``my_pkg`` (32 samples per split)."""
    project = UserProject(tmp_path / "project")
    project.write()
    return project


@pytest.fixture
def oci_registry(https_loopback: LoopbackServer, loopback_certificate: Certificate) -> Iterator[LoopbackRegistry]:
    """A loopback container registry (:mod:`ddlkit.testing.registry`, token auth) on the loopback
    certificate, which ``https_loopback`` makes the clients trust."""
    # imported here: importing ddlkit's test kit before pytest loads it as a plugin keeps its asserts unrewritten
    from ddlkit.testing.registry import LoopbackRegistry

    with LoopbackRegistry((loopback_certificate.cert_file, loopback_certificate.key_file)) as registry:
        yield registry
