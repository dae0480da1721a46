"""The light side of the plugin: registration, lazy imports, config errors, the distribution seam.
None of these tests imports TensorFlow into the test process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import ddlkit
from ddlkit.testing import horovod_at
from ddlkit.testing.core import DistConfig, Precision, TrainerConfig
from ddlkit_tensorflow.framework import TensorflowConfig, TensorflowFramework
from ddlkit_tensorflow.runtime import distribution_strategy, import_tensorflow


def python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_plugin_modules_import_neither_tensorflow_nor_keras(tmp_path: Path) -> None:
    proc = python(
        "import sys, ddlkit_tensorflow.plugin, ddlkit_tensorflow.runtime\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_composing_a_tensorflow_run_imports_no_tensorflow(tmp_path: Path) -> None:
    proc = python(
        "import sys\nfrom ddlkit.launch.cli import main\n"
        "code = main(['framework=tensorflow', 'framework.xla=true', '--cfg', 'job'])\n"
        "print('TF' if 'tensorflow' in sys.modules else 'NOTF', code)",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "name: tensorflow" in proc.stdout and "xla: true" in proc.stdout
    assert proc.stdout.strip().endswith("NOTF 0")


def test_the_entry_point_registers_framework_tensorflow() -> None:
    from ddlkit.testing.core import Registry, new_plugin_manager

    registry = Registry.collect(new_plugin_manager())
    registration = registry.get("framework", "tensorflow")
    assert registration.factory is TensorflowFramework and registration.config is TensorflowConfig
    assert registry.names_for("model", "tensorflow") == [
        "custom",
        "resnet101",
        "resnet152",
        "resnet18",
        "resnet34",
        "resnet50",
    ]
    assert registry.names_for("optimizer", "tensorflow") == ["adamw", "lamb", "lars", "sgd"]


def test_missing_tensorflow_is_a_config_error_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` fail
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # import_tensorflow sets it when unset; keep the env clean
    with pytest.raises(ddlkit.ConfigError) as err:
        import_tensorflow("tensorflow")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("framework=tensorflow needs TensorFlow")
    assert "pip install tensorflow-cpu==2.21.0" in message


def _config(precision: str = "fp32", deterministic: bool = False) -> object:
    """The trainer part of a config as the launcher composes it (precision an enum member)."""
    trainer = TrainerConfig(precision=Precision(precision), deterministic=deterministic)
    return OmegaConf.create({"trainer": OmegaConf.structured(trainer), "dist": OmegaConf.structured(DistConfig())})


@pytest.mark.parametrize(
    ("framework_cfg", "config", "fragment"),
    [
        (TensorflowConfig(device="cpu"), _config("fp16"), "trainer.precision=fp16 needs a GPU"),
        (TensorflowConfig(device="tpu"), _config(), "framework.device=tpu is invalid"),
        (TensorflowConfig(xla=True), _config(deterministic=True), "XLA has no deterministic max-pool gradient"),
    ],
)
def test_configure_rejects_what_cannot_run(framework_cfg: TensorflowConfig, config: object, fragment: str) -> None:
    framework = TensorflowFramework(OmegaConf.structured(framework_cfg))
    with pytest.raises(ddlkit.ConfigError, match=fragment.replace(".", r"\.")):
        framework.configure(config)


def test_configure_reads_precision_from_the_job_file_too() -> None:
    framework = TensorflowFramework(OmegaConf.structured(TensorflowConfig(device="cpu")))
    with pytest.raises(ddlkit.ConfigError, match="fp16 needs a GPU"):
        framework.configure(
            OmegaConf.create({"trainer": {"precision": "fp16", "deterministic": False}, "dist": {"backend": "none"}})
        )


def test_configure_accepts_bf16_with_xla_on_the_cpu() -> None:
    framework = TensorflowFramework(OmegaConf.structured(TensorflowConfig(device="cpu", xla=True)))
    framework.configure(_config("bf16"))


def _horovod_config() -> object:
    config = _config()
    config.dist.backend = "horovod"
    return config


def test_horovod_not_installed_is_refused_with_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    horovod_at(monkeypatch, None)
    with pytest.raises(ddlkit.ConfigError) as info:
        TensorflowFramework(OmegaConf.structured(TensorflowConfig())).check_environment(_horovod_config())
    assert str(info.value) == (
        "dist=horovod with framework=tensorflow needs Horovod, which is not installed. Build it against the "
        "installed TensorFlow (and torch, if installed) with scripts/install_horovod.sh (Horovod 0.28.1 patched for "
        "C++17 and TensorFlow 2.21; about 9 minutes on 2 cores, then the wheel is cached), or use dist=native."
    )


def test_horovod_without_its_tensorflow_build_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so").touch()  # another framework's binding
    horovod_at(monkeypatch, tmp_path)
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"^dist=horovod with framework=tensorflow: the installed Horovod "
        r"was built without TensorFlow support\. Build it against the "
        r"installed TensorFlow .* with scripts/install_horovod.sh",
    ):
        TensorflowFramework(OmegaConf.structured(TensorflowConfig())).check_environment(_horovod_config())


def test_a_horovod_built_for_tensorflow_is_accepted_without_xla(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "mpi_lib.cpython-311-x86_64-linux-gnu.so").touch()
    horovod_at(monkeypatch, tmp_path)
    TensorflowFramework(OmegaConf.structured(TensorflowConfig())).check_environment(_horovod_config())
    with pytest.raises(
        ddlkit.ConfigError,
        match=r"^framework\.xla=true cannot run with dist=horovod: Horovod's "
        r"collectives have no XLA kernels here",
    ):
        TensorflowFramework(OmegaConf.structured(TensorflowConfig(xla=True))).configure(_horovod_config())


@pytest.mark.parametrize("backend", ["native", "horovod"])
def test_a_job_of_one_rank_trains_with_the_default_strategy_whatever_the_backend(backend: str) -> None:
    import tensorflow as tf

    run = SimpleNamespace(cfg=OmegaConf.create({"dist": {"backend": backend}}), dist=ddlkit.DistContext())
    assert distribution_strategy(run, "tensorflow").strategy is tf.distribute.get_strategy()


def test_backend_none_refuses_several_ranks() -> None:
    run = SimpleNamespace(
        cfg=OmegaConf.create({"dist": {"backend": "none"}}), dist=ddlkit.DistContext(rank=0, world_size=2)
    )
    with pytest.raises(ddlkit.ConfigError, match="2 ranks"):
        distribution_strategy(run, "tensorflow")
