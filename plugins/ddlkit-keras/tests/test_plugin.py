"""The light side of the plugin: registration, lazy imports, config errors. None of these tests
imports Keras or TensorFlow into the test process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import ddlkit
from ddlkit.testing import horovod_at
from ddlkit.testing.core import Precision, TrainerConfig
from ddlkit_keras.framework import KerasConfig, KerasFramework


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_plugin_modules_import_neither_tensorflow_nor_keras(tmp_path: Path) -> None:
    proc = python(
        "-c",
        "import ddlkit_tensorflow.plugin, ddlkit_keras.plugin, sys; "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr


def test_composing_a_keras_run_imports_no_tensorflow(tmp_path: Path) -> None:
    proc = python(
        "-c",
        "import sys\nfrom ddlkit.launch.cli import main\n"
        "code = main(['framework=keras', '--cfg', 'job'])\n"
        "print('TF' if 'tensorflow' in sys.modules or 'keras' in sys.modules else 'NOTF', code)",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "name: keras" in proc.stdout and "backend: tensorflow" in proc.stdout
    assert proc.stdout.strip().endswith("NOTF 0")


def test_without_ddlkit_tensorflow_choosing_keras_says_what_to_install(tmp_path: Path) -> None:
    proc = python(
        "-c",
        "import sys; sys.modules['ddlkit_tensorflow'] = None\nfrom ddlkit.launch.cli import main\n"
        "sys.exit(main(['framework=keras', '--cfg', 'job']))",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "unknown framework 'keras'" in proc.stderr
    assert "ddlkit-keras needs the ddlkit-tensorflow plugin" in proc.stderr
    assert "pip install -e plugins/ddlkit-tensorflow" in proc.stderr


def test_the_entry_point_registers_framework_keras() -> None:
    from ddlkit.testing.core import Registry, new_plugin_manager

    registration = Registry.collect(new_plugin_manager()).get("framework", "keras")
    assert registration.factory is KerasFramework and registration.config is KerasConfig


def test_an_unsupported_backend_is_refused_by_the_launcher(tmp_path: Path) -> None:
    proc = python(
        "-m", "ddlkit", "framework=keras", "framework.backend=torch", f"hydra.run.dir={tmp_path / 'job'}", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "framework.backend=torch is not supported" in proc.stderr and "framework=pytorch" in proc.stderr
    assert not (tmp_path / "job" / "job.json").exists()


def test_configure_shares_the_tensorflow_checks() -> None:
    framework = KerasFramework(OmegaConf.structured(KerasConfig(device="cpu")))
    trainer = OmegaConf.structured(TrainerConfig(precision=Precision.fp16))
    with pytest.raises(ddlkit.ConfigError, match="fp16 needs a GPU"):
        framework.configure(OmegaConf.create({"trainer": trainer, "dist": {"backend": "none"}}))
    horovod = OmegaConf.create({"trainer": OmegaConf.structured(TrainerConfig()), "dist": {"backend": "horovod"}})
    with pytest.raises(ddlkit.ConfigError, match="framework.xla=true cannot run with dist=horovod.*framework=keras"):
        KerasFramework(OmegaConf.structured(KerasConfig(xla=True))).configure(horovod)


def test_horovod_not_installed_is_refused_with_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    horovod_at(monkeypatch, None)
    config = OmegaConf.create({"trainer": OmegaConf.structured(TrainerConfig()), "dist": {"backend": "horovod"}})
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"^dist=horovod with framework=keras needs Horovod, which is not "
        r"installed\. Build it .* with scripts/install_horovod.sh",
    ):
        KerasFramework(OmegaConf.structured(KerasConfig())).check_environment(config)


def test_dist_native_is_refused_pointing_to_horovod_and_framework_tensorflow() -> None:
    framework = KerasFramework(OmegaConf.structured(KerasConfig()))
    config = OmegaConf.create({"trainer": OmegaConf.structured(TrainerConfig()), "dist": {"backend": "native"}})
    with pytest.raises(ddlkit.ConfigError, match="keras-team/keras#20585.*use dist=horovod, or framework=tensorflow"):
        framework.configure(config)


def test_accumulation_under_fp16_is_refused() -> None:
    framework = KerasFramework(OmegaConf.structured(KerasConfig()))
    trainer = OmegaConf.structured(TrainerConfig(precision=Precision.fp16, accumulate_batches=2))
    config = OmegaConf.create({"trainer": trainer, "dist": {"backend": "none"}, "framework": {"num_threads": "auto"}})
    with pytest.raises(
        ddlkit.ConfigError,
        match="framework=keras cannot accumulate gradients under trainer.precision=fp16.*Use framework=tensorflow",
    ):
        framework.configure(config)
