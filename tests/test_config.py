"""Config composition and validation: every option of every group composes and validates,
wrong values fail early with messages that name the key, experiments and multi-select loggers
work, and secrets never reach the job directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import MISSING, OmegaConf

import ddlkit
from ddlkit import ConfigError, Registration, redact
from ddlkit.compute import secret_env
from ddlkit.config import Precision, rebuild, store_schemas, to_container
from ddlkit.launch.prepare import prepare
from ddlkit.launch.validate import validate
from ddlkit.optim import AdamWConfig, LRScaling, SGDConfig
from ddlkit.plugins import DdlkitPluginManager
from ddlkit.rank.worker import load_job
from ddlkit.registry import HOOK_POINTS, Registry
from ddlkit.testing import FAKES_MODULE, add_plugin, compose, fakes, with_default_framework
from ddlkit.testing.fakes import FakeFramework

CORE_GROUPS = ("trainer", "dist")
TOKEN = "sv=2026&sig=very-secret-signature"


@pytest.fixture
def pm(ddlkit_pm: DdlkitPluginManager) -> DdlkitPluginManager:
    add_plugin(ddlkit_pm, fakes, name=FAKES_MODULE)
    return ddlkit_pm


def composed(pm: DdlkitPluginManager, *overrides: str):
    return compose(Registry.collect(pm), with_default_framework(overrides))


def checked(pm: DdlkitPluginManager, *overrides: str) -> dict:
    """Compose and validate; returns the resolved container."""
    registry = Registry.collect(pm)
    return validate(compose(registry, with_default_framework(overrides)), registry, pm)


def test_every_option_of_every_group_composes_and_validates(pm: DdlkitPluginManager) -> None:
    store_schemas(Registry.collect(pm))
    cs = ConfigStore.instance()
    options = {g: sorted(n.removesuffix(".yaml") for n in cs.list(g)) for g in (*HOOK_POINTS, *CORE_GROUPS)}
    assert options == {
        "data": ["custom", "imagefolder", "synthetic"],
        "storage": ["local", "local_ssd", "memory", "nfs"],
        "compute": ["elsewhere", "local"],
        "framework": ["fake"],
        "logger": ["console", "jsonl", "recording"],
        "model": ["resnet101", "resnet152", "resnet18", "resnet34", "resnet50", "softmax"],
        "optimizer": ["sgd"],
        "trainer": ["default"],
        "dist": ["fsdp", "horovod", "native", "none"],
    }
    for group, names in options.items():
        for name in names:
            if HOOK_POINTS.get(group, None) is not None and HOOK_POINTS[group].multi:
                container = checked(pm, f"{group}=[{name}]")
                assert list(container[group]) == [name]
            else:
                # an option with a mandatory value gets one, as a user must give it
                required = {
                    ("data", "imagefolder"): ["data.root=/data/imagenet"],
                    ("data", "custom"): ["data.target=json:loads"],
                    ("storage", "nfs"): ["storage.root=/mnt/nfs"],
                }.get((group, name), [])
                container = checked(pm, f"{group}={name}", *required)
                if group in HOOK_POINTS:
                    assert container[group]["name"] == name, (group, name)


def test_the_default_config(pm: DdlkitPluginManager) -> None:
    container = checked(pm)
    assert {k: container[k]["name"] for k in ("compute", "storage", "framework", "data", "model")} == {
        "compute": "local",
        "storage": "local",
        "framework": "fake",
        "data": "synthetic",
        "model": "resnet18",
    }
    assert container["trainer"]["precision"] == "fp32"  # enums become plain strings for the job file
    assert container["optimizer"]["warmup_epochs"] == 1.0  # config.yaml's override of the schema's 5.0


def test_logger_is_multi_select_nested_by_name(pm: DdlkitPluginManager) -> None:
    cfg = composed(pm)
    assert OmegaConf.to_container(cfg.logger) == {
        "console": {"summary": True, "name": "console"},
        "jsonl": {"filename": "metrics.jsonl", "name": "jsonl"},
    }
    assert OmegaConf.to_container(composed(pm, "logger=[jsonl,recording]").logger) == {
        "jsonl": {"filename": "metrics.jsonl", "name": "jsonl"},
        "recording": {"name": "recording"},
    }
    assert composed(pm, "logger.jsonl.filename=m.jsonl").logger.jsonl.filename == "m.jsonl"


def test_no_logger_at_all(pm: DdlkitPluginManager, run_inprocess) -> None:
    assert "logger" not in checked(pm, "logger=[]")
    out = run_inprocess("logger=[]", "trainer.max_steps=2", "trainer.validate=false")
    assert out.exit_code == 0 and out.run.loggers == []
    assert not (out.job_dir / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("override", "detail"),
    [
        ("trainer.batch_size=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
        ("trainer.precision=fp8", "Invalid value 'fp8', expected one of [fp32, bf16, fp16]"),
        ("optimizer.lr=fast", "Value 'fast' of type 'str' could not be converted to Float"),
        ("data.image_size=big", "Value 'big' of type 'str' could not be converted to Integer"),
        ("trainer.batchsize=8", "Could not override 'trainer.batchsize'"),
    ],
)
def test_wrong_values_fail_when_composing(pm: DdlkitPluginManager, override: str, detail: str) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        composed(pm, override)
    assert detail in f"{info.value}\n{info.value.__cause__}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.epochs=0", "trainer.epochs=0 is invalid: it must be a positive integer."),
        ("trainer.batch_size=-4", "trainer.batch_size=-4 is invalid: it must be a positive integer."),
        ("trainer.keep_checkpoints=0", "trainer.keep_checkpoints=0 is invalid: it must be a positive integer."),
        ("trainer.max_steps=0", "trainer.max_steps=0 is invalid: it must be null or a positive integer."),
        ("trainer.warmup_steps=-1", "trainer.warmup_steps=-1 is invalid: it must be >= 0."),
        ("optimizer.lr=-1", "optimizer.lr=-1.0 is invalid: it must be positive."),
        ("optimizer.momentum=1", "optimizer.momentum=1.0 is invalid: it must be in [0, 1)."),
        ("optimizer.label_smoothing=1.5", "optimizer.label_smoothing=1.5 is invalid: it must be in [0, 1)."),
        ("optimizer.name=adam", "unknown optimizer 'adam' (config key `optimizer`). Choose one of: sgd."),
        ("dist.backend=mpi", "dist.backend=mpi is invalid: it must be one of: none, native, horovod, fsdp."),
        ("dist.timeout_s=0", "dist.timeout_s=0.0 is invalid: it must be positive and at most 2147483 (seconds)."),
        ("dist.stop_check_every=0", "dist.stop_check_every=0 is invalid: it must be a positive integer."),
        ("data.image_size=0", "data.image_size=0 is invalid: it must be >= 1."),
        ("data.image_size=-32", "data.image_size=-32 is invalid: it must be >= 1."),
        ("data.num_classes=0", "data.num_classes=0 is invalid: it must be >= 1."),
    ],
)
def test_out_of_range_values_are_config_errors(pm: DdlkitPluginManager, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        checked(pm, override)
    assert str(info.value) == message


def test_a_batch_that_cannot_fit_in_memory_is_refused_before_anything_runs(pm: DdlkitPluginManager) -> None:
    """Issue 17, item 14: `trainer.batch_size=1000000000 data.length=1000000000` tried to allocate 12 TB."""
    with pytest.raises(ConfigError) as info:
        checked(pm, "trainer.batch_size=1000000000", "data.length=1000000000")
    assert str(info.value).startswith(
        "one batch of trainer.batch_size=1000000000 images of 64x64 px needs "
        "45,776.4 GiB as float32, more than half of this machine's "
    )
    assert str(info.value).endswith(" GiB: lower trainer.batch_size or data.image_size.")


def test_a_missing_mandatory_value_names_the_key(pm: DdlkitPluginManager) -> None:
    @dataclass
    class BucketConfig:
        # no default: the user must say which bucket
        bucket: str = MISSING

    class Plugin:
        @ddlkit.hookimpl
        def ddlkit_storage_backends(self):
            yield Registration("bucket", fakes.MemoryStorage, config=BucketConfig)

    add_plugin(pm, Plugin())
    with pytest.raises(ConfigError) as info:
        checked(pm, "storage=bucket")
    assert str(info.value) == (
        "missing value for `storage.bucket`: set it on the command line, e.g. storage.bucket=<value>."
    )
    assert checked(pm, "storage=bucket", "storage.bucket=b1")["storage"] == {"bucket": "b1", "name": "bucket"}


def _tiny_framework() -> object:
    """framework=tiny: the fake's loop, with one model and two optimizers of its own."""

    class Plugin:
        @ddlkit.hookimpl
        def ddlkit_frameworks(self):
            yield Registration("tiny", FakeFramework, config=fakes.FakeFrameworkConfig)

        @ddlkit.hookimpl
        def ddlkit_models(self):
            yield Registration("resnet18", fakes.build_softmax, framework="tiny")

        @ddlkit.hookimpl
        def ddlkit_optimizers(self):
            for name in ("sgd", "adamw"):
                yield Registration(
                    name, fakes.build_sgd, config=SGDConfig if name == "sgd" else AdamWConfig, framework="tiny"
                )

    return Plugin()


def test_a_model_the_framework_cannot_build(pm: DdlkitPluginManager) -> None:
    add_plugin(pm, _tiny_framework())
    assert checked(pm, "framework=tiny")["model"]["name"] == "resnet18"
    with pytest.raises(ConfigError) as info:
        checked(pm, "framework=tiny", "model=resnet50")
    assert str(info.value) == (
        "framework=tiny has no model 'resnet50' (model resnet50 is implemented for "
        "framework=fake). Choose one framework=tiny has: resnet18."
    )


def test_an_optimizer_the_framework_does_not_implement_lists_those_it_has(pm: DdlkitPluginManager) -> None:
    add_plugin(pm, _tiny_framework())
    assert checked(pm, "framework=tiny", "optimizer=adamw")["optimizer"]["beta2"] == 0.999
    with pytest.raises(ConfigError) as info:
        checked(pm, "optimizer=adamw")  # framework=fake
    assert str(info.value) == (
        "framework=fake has no optimizer 'adamw' (optimizer adamw is implemented for "
        "framework=tiny). Choose one framework=fake has: sgd."
    )


def test_optimizer_hyperparameters_are_range_checked(pm: DdlkitPluginManager) -> None:
    with pytest.raises(ConfigError, match=r"^optimizer.momentum=1.5 is invalid: it must be in \[0, 1\).$"):
        checked(pm, "optimizer.momentum=1.5")


def test_plugins_validate_through_framework_configure_and_the_configure_hook(pm: DdlkitPluginManager) -> None:
    with pytest.raises(ConfigError, match=r"^framework.side=0 is invalid: it must be a positive integer.$"):
        checked(pm, "framework.side=0")

    class Strict:
        @ddlkit.hookimpl
        def ddlkit_configure(self, config):
            if config.trainer.precision.value == "fp16":
                raise ConfigError("framework=fake computes in float64; drop trainer.precision=fp16")

    add_plugin(pm, Strict())
    checked(pm, "trainer.precision=bf16")
    with pytest.raises(ConfigError, match="computes in float64"):
        checked(pm, "trainer.precision=fp16")


# ---------------------------------------------------------------------------- experiments
def _experiment(directory: Path, name: str, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text("# @package _global_\n" + body)


def test_experiment_from_the_working_directory(pm: DdlkitPluginManager, tmp_path: Path) -> None:
    # ddlkit_isolation runs the test in tmp_path, so this is ./experiments
    _experiment(
        tmp_path / "experiments",
        "fast",
        "defaults:\n  - override /logger: [jsonl]\ntrainer:\n  epochs: 1\n  batch_size: 8\n",
    )
    container = checked(pm, "+experiment=fast")
    assert (container["trainer"]["epochs"], container["trainer"]["batch_size"]) == (1, 8)
    assert list(container["logger"]) == ["jsonl"]
    # the command line still wins over the experiment
    assert checked(pm, "+experiment=fast", "trainer.epochs=3")["trainer"]["epochs"] == 3


def test_experiments_from_ddlkit_experiments(
    pm: DdlkitPluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "team-a", tmp_path / "team-b"
    _experiment(a, "big", "trainer:\n  batch_size: 64\n")
    _experiment(b, "long", "trainer:\n  epochs: 90\n")
    monkeypatch.setenv("DDLKIT_EXPERIMENTS", f"{a}:{b}")
    assert checked(pm, "+experiment=big")["trainer"]["batch_size"] == 64
    assert checked(pm, "+experiment=long")["trainer"]["epochs"] == 90


# ---------------------------------------------------------------------------- secrets
@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sas_token", True),
        ("account_key", True),
        ("password", True),
        ("api_key", True),
        ("KEY", True),
        ("connection_string", True),
        ("credentials", True),
        ("secret", True),
        ("keyboard", False),
        ("monkey", False),
        ("tokens_per_step", False),
        ("root", False),
        ("keep_checkpoints", False),
    ],
)
def test_secret_looking_keys(key: str, secret: bool) -> None:
    assert redact.is_secret_key(key) is secret


def test_split_and_restore_secrets() -> None:
    config = {
        "storage": {"name": "azure", "account_key": "k3y-value", "container": "c"},
        "logger": {"wandb": {"api_key": "wb-value", "project": "p"}},
        "compute": {"nodes": [{"password": "pw-value"}, {"host": "h"}]},
        "data": {"token": ""},
    }  # empty: nothing to hide
    redacted, found = redact.split_secrets(config)
    assert found == {
        "storage.account_key": "k3y-value",
        "logger.wandb.api_key": "wb-value",
        "compute.nodes.0.password": "pw-value",
    }
    assert redacted == {
        "storage": {"name": "azure", "account_key": "***", "container": "c"},
        "logger": {"wandb": {"api_key": "***", "project": "p"}},
        "compute": {"nodes": [{"password": "***"}, {"host": "h"}]},
        "data": {"token": ""},
    }
    assert config["storage"]["account_key"] == "k3y-value"  # the original is untouched
    restored = json.loads(json.dumps(redacted))
    secret_env.restore(restored, secret_env.decode(secret_env.encode(found)))
    assert restored == config


def test_scrub_removes_secret_values_from_text() -> None:
    secrets = {"storage.sas_token": TOKEN, "x.key": "abc"}
    text = f"HTTP 403 for https://acct.blob/c?{TOKEN} (key abc)"
    # values shorter than 4 characters would wipe ordinary words, so they stay
    assert redact.scrub(text, secrets) == "HTTP 403 for https://acct.blob/c?*** (key abc)"


def test_redact_overrides() -> None:
    assert redact.redact_overrides(
        [
            "ddlkit",
            f"storage.sas_token='{TOKEN}'",
            "+logger.wandb.api_key=k",
            "storage.root=/data",
            "~storage.key",
            "trainer.epochs=2",
        ]
    ) == [
        "ddlkit",
        "storage.sas_token=***",
        "+logger.wandb.api_key=***",
        "storage.root=/data",
        "~storage.key",
        "trainer.epochs=2",
    ]


def test_secrets_never_reach_the_job_directory(
    pm: DdlkitPluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = Registry.collect(pm)
    overrides = ["framework=fake", "storage=memory", f"storage.sas_token='{TOKEN}'"]
    job = prepare(compose(registry, overrides), job_dir=tmp_path / "job", overrides=overrides, registry=registry, pm=pm)
    files = sorted(p.name for p in job.spec.job_dir.iterdir())
    assert files == ["config.yaml", "environment.json", "job.json", "overrides.yaml"]
    for name in files:
        assert TOKEN not in (job.spec.job_dir / name).read_text(), name
    written = json.loads(job.spec.job_file.read_text())
    assert written["secrets"] == ["storage.sas_token"]
    assert written["config"]["storage"]["sas_token"] == "***"
    assert written["overrides"] == ["framework=fake", "storage=memory", "storage.sas_token=***"]
    assert "sas_token: '***'" in (job.spec.job_dir / "config.yaml").read_text()
    assert TOKEN not in job.resume_hint
    # the ranks get the value through their secret environment (a target's secret channel), and only in memory
    assert dict(job.spec.secret_env) == {secret_env.SECRETS_ENV: json.dumps({"storage.sas_token": TOKEN})}
    assert TOKEN not in json.dumps(dict(job.spec.env))
    monkeypatch.setenv(secret_env.SECRETS_ENV, job.spec.secret_env[secret_env.SECRETS_ENV])
    assert load_job(job.spec.job_file)["config"]["storage"]["sas_token"] == TOKEN


def test_the_ranks_rebuild_the_launchers_types_from_the_job_file(
    pm: DdlkitPluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """job.json holds plain values; a rank restores its secrets into them and rebuilds every group
    with the schema it was composed from: an enum option is its member again, as in the launcher."""
    registry = Registry.collect(pm)
    overrides = ["framework=fake", "storage=memory", f"storage.sas_token='{TOKEN}'", "trainer.precision=bf16"]
    job = prepare(compose(registry, overrides), job_dir=tmp_path / "job", overrides=overrides, registry=registry, pm=pm)
    monkeypatch.setenv(secret_env.SECRETS_ENV, job.spec.secret_env[secret_env.SECRETS_ENV])
    cfg = rebuild(load_job(job.spec.job_file)["config"], registry)
    assert cfg.trainer.precision is Precision.bf16
    assert cfg.optimizer.scale_lr is LRScaling.linear
    assert cfg.storage.sas_token == TOKEN
    assert list(rebuild(load_job(job.spec.job_file)["config"], registry, groups=("compute",))) == ["compute"]


def test_to_container_resolves_interpolations_and_rejects_missing() -> None:
    from omegaconf.errors import MissingMandatoryValue

    assert to_container(OmegaConf.create({"a": 2, "b": "${a}"})) == {"a": 2, "b": 2}
    with pytest.raises(MissingMandatoryValue):
        to_container(OmegaConf.create({"a": "???"}))


# ---------------------------------------------------------------------------- start-up cost
@dataclass
class OddStorageConfig:
    tags: set = None  # a type OmegaConf cannot hold: building this schema fails


class OddStorage:
    @ddlkit.hookimpl
    def ddlkit_storage_backends(self):
        yield Registration("odd", object, config=OddStorageConfig)


def test_only_the_chosen_options_schemas_are_built(pm: DdlkitPluginManager) -> None:
    # Hydra's ConfigStore builds a DictConfig from every schema stored; ddlkit stores ~50 options and
    # a run chooses a few, so building them all was a fifth of `ddlkit --cfg job` (issue 29, item 3)
    add_plugin(pm, OddStorage())
    assert composed(pm).storage.name == "local"  # odd's schema never built
    with pytest.raises(ConfigCompositionException) as err:
        composed(pm, "storage=odd")
    assert "Unexpected type annotation: set" in str(err.value.__cause__)
