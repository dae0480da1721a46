"""Name -> implementation resolution: conflicts, unknown names, bad registrations. Messages are
asserted whole, since they are the user interface of a plugin host."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from importlib.metadata import version

import pytest

import ddlkit
from ddlkit import PluginConflictError, PluginError, Registration, UnknownNameError, first_party
from ddlkit.builtin.local_storage import LocalStorage
from ddlkit.plugins import DdlkitPluginManager, PluginInfo, installed_registry
from ddlkit.registry import Registry
from ddlkit.testing import add_plugin

DDLKIT = f"ddlkit {version('ddlkit')}"


def storage_plugin(*items: object) -> object:
    class Plugin:
        @ddlkit.hookimpl
        def ddlkit_storage_backends(self):
            yield from items

    return Plugin()


def test_builtins_register_one_name_per_hook_point(ddlkit_pm: DdlkitPluginManager) -> None:
    reg = Registry.collect(ddlkit_pm)
    assert {g: reg.names(g) for g in reg.entries} == {
        "data": ["custom", "imagefolder", "synthetic"],
        "storage": ["local", "local_ssd", "nfs"],
        "compute": ["local"],
        "framework": [],
        "logger": ["console", "jsonl"],
        "model": [],
        "optimizer": [],
    }
    assert reg.entries["storage"]["local"].origin == f"{DDLKIT} (ddlkit.builtin.local_storage)"


def test_conflict_names_both_origins_and_the_way_out(ddlkit_pm: DdlkitPluginManager) -> None:
    add_plugin(
        ddlkit_pm,
        storage_plugin(Registration("local", LocalStorage)),
        name="acme",
        distribution="acme-storage",
        version="1.0",
        module="acme_storage.ddlkit",
    )
    with pytest.raises(PluginConflictError) as info:
        Registry.collect(ddlkit_pm)
    assert str(info.value) == (
        "storage backend 'local' is registered by 2 plugins:\n"
        f"  - {DDLKIT} (ddlkit.builtin.local_storage)\n"
        "  - acme-storage 1.0 (acme_storage.ddlkit)\n"
        "  Uninstall one."
    )


def test_three_way_conflict_lists_every_plugin(ddlkit_pm: DdlkitPluginManager) -> None:
    for n in ("one", "two", "three"):
        add_plugin(
            ddlkit_pm,
            storage_plugin(Registration("s3", LocalStorage)),
            name=n,
            distribution=f"ddlkit-{n}",
            module=f"ddlkit_{n}.plugin",
        )
    with pytest.raises(PluginConflictError) as info:
        Registry.collect(ddlkit_pm)
    assert str(info.value).splitlines()[:4] == [
        "storage backend 's3' is registered by 3 plugins:",
        "  - ddlkit-one 0 (ddlkit_one.plugin)",
        "  - ddlkit-two 0 (ddlkit_two.plugin)",
        "  - ddlkit-three 0 (ddlkit_three.plugin)",
    ]


def test_unknown_name_lists_the_choices(ddlkit_pm: DdlkitPluginManager) -> None:
    add_plugin(ddlkit_pm, storage_plugin(Registration("s3", LocalStorage), Registration("gcs", LocalStorage)))
    reg = Registry.collect(ddlkit_pm)
    with pytest.raises(UnknownNameError) as info:
        reg.get("storage", "s4")
    assert str(info.value) == (
        "unknown storage backend 's4' (config key `storage`). Choose one of: gcs, local, local_ssd, nfs, s3."
    )
    err = info.value
    assert (err.kind, err.name, err.choices, err.key, err.not_loaded) == (
        "storage backend",
        "s4",
        ["gcs", "local", "local_ssd", "nfs", "s3"],
        "storage",
        [],
    )
    # a LookupError (so `except LookupError` works) but not a KeyError, whose str() adds quotes
    assert isinstance(err, LookupError) and not isinstance(err, KeyError)
    assert isinstance(err, ddlkit.ConfigError)


@pytest.fixture
def no_first_party(monkeypatch: pytest.MonkeyPatch) -> None:
    """No first-party plugin table (ddlkit.first_party): the registry's own words, whichever plugins this
    environment has installed (the install hint of one that is not: tests/test_first_party.py)."""
    monkeypatch.setattr(first_party, "PLUGINS", ())


def test_unknown_name_says_which_plugins_failed_to_load(ddlkit_pm: DdlkitPluginManager, no_first_party: None) -> None:
    ddlkit_pm.failures.append(
        PluginInfo(
            "azure", "ddlkit-azure", "0.1", "ddlkit_azure.plugin", error="ModuleNotFoundError: No module named 'azure'"
        )
    )
    reg = Registry.collect(ddlkit_pm)
    with pytest.raises(UnknownNameError) as info:
        reg.get("storage", "azure")
    assert str(info.value) == (
        "unknown storage backend 'azure' (config key `storage`). Choose one of: local, local_ssd, nfs.\n"
        "  Not loaded: ddlkit-azure 0.1 (ddlkit_azure.plugin): ModuleNotFoundError: No module named 'azure'"
    )


def test_unknown_name_in_an_empty_group(ddlkit_pm: DdlkitPluginManager, no_first_party: None) -> None:
    with pytest.raises(UnknownNameError) as info:
        Registry.collect(ddlkit_pm).get("framework", "pytorch")
    assert str(info.value) == "unknown framework 'pytorch' (config key `framework`). No plugin registers any."


@pytest.mark.parametrize("name", ["S3", "3d", "my store", "", "ü", "-x", "a.b"])
def test_invalid_names_are_rejected(ddlkit_pm: DdlkitPluginManager, name: str) -> None:
    add_plugin(
        ddlkit_pm,
        storage_plugin(Registration(name, LocalStorage)),
        name="bad",
        distribution="ddlkit-bad",
        module="ddlkit_bad.plugin",
    )
    with pytest.raises(PluginError) as info:
        Registry.collect(ddlkit_pm)
    assert str(info.value) == (
        f"ddlkit-bad 0 (ddlkit_bad.plugin): storage backend name {name!r} is invalid; "
        "use lowercase letters, digits, '_' or '-', starting with a letter"
    )


@pytest.mark.parametrize("name", ["s3", "gcs-2", "my_store", "x"])
def test_valid_names_are_accepted(ddlkit_pm: DdlkitPluginManager, name: str) -> None:
    add_plugin(ddlkit_pm, storage_plugin(Registration(name, LocalStorage)))
    assert name in Registry.collect(ddlkit_pm).names("storage")


def test_yielding_something_else_than_a_registration(ddlkit_pm: DdlkitPluginManager) -> None:
    add_plugin(
        ddlkit_pm,
        storage_plugin(("s3", LocalStorage)),
        name="tuple",
        distribution="ddlkit-tuple",
        module="ddlkit_tuple.plugin",
    )
    with pytest.raises(PluginError) as info:
        Registry.collect(ddlkit_pm)
    assert str(info.value) == (
        "ddlkit-tuple 0 (ddlkit_tuple.plugin): hook "
        "ddlkit_storage_backends must yield ddlkit.Registration objects, got tuple"
    )


def test_config_must_be_a_class(ddlkit_pm: DdlkitPluginManager) -> None:
    @dataclass
    class S3Config:
        bucket: str = "b"

    add_plugin(ddlkit_pm, storage_plugin(Registration("s3", LocalStorage, config=S3Config())))
    with pytest.raises(PluginError, match=r": storage backend 's3': config must be a dataclass type$"):
        Registry.collect(ddlkit_pm)


@pytest.fixture
def lazy_module(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A module ``acme_lazy_storage`` that a plugin names by "module:attr", removed afterwards."""
    (tmp_path / "acme_lazy_storage.py").write_text(
        "from dataclasses import dataclass\n"
        "from ddlkit.builtin.local_storage import LocalStorage as AcmeStorage\n\n"
        "@dataclass\nclass AcmeConfig:\n    bucket: str = 'b'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "acme_lazy_storage"
    sys.modules.pop("acme_lazy_storage", None)


def test_a_factory_and_config_named_by_import_path_are_imported_when_chosen(
    ddlkit_pm: DdlkitPluginManager, lazy_module: str
) -> None:
    """Issue 29, item 3: a plugin loads without importing its implementation; the registry
    imports it for the name a command chooses, and for no other."""
    add_plugin(
        ddlkit_pm,
        storage_plugin(Registration("acme", f"{lazy_module}:AcmeStorage", config=f"{lazy_module}:AcmeConfig")),
    )
    reg = Registry.collect(ddlkit_pm)
    reg.get("storage", "local")
    assert "acme" in reg.names("storage") and lazy_module not in sys.modules
    registration = reg.get("storage", "acme")
    module = sys.modules[lazy_module]
    assert registration.factory is LocalStorage and registration.config is module.AcmeConfig
    assert reg.get("storage", "acme") is registration  # imported once


@pytest.mark.parametrize(
    ("factory", "config", "what", "reason"),
    [
        (
            "acme_missing_storage:AcmeStorage",
            None,
            "factory",
            "ModuleNotFoundError: No module named 'acme_missing_storage'",
        ),
        (
            "acme_lazy_storage:AcmeStorage",
            "acme_lazy_storage:Nothing",
            "config",
            "AttributeError: module 'acme_lazy_storage' has no attribute 'Nothing'",
        ),
    ],
)
def test_an_import_path_that_does_not_import_names_the_plugin(
    ddlkit_pm: DdlkitPluginManager, lazy_module: str, factory: str, config: str | None, what: str, reason: str
) -> None:
    add_plugin(
        ddlkit_pm,
        storage_plugin(Registration("acme", factory, config=config)),
        name="acme",
        distribution="ddlkit-acme",
        version="1.0",
        module="ddlkit_acme.plugin",
    )
    reg = Registry.collect(ddlkit_pm)  # a plugin's bad reference breaks only the commands that choose its name
    with pytest.raises(PluginError) as info:
        reg.get("storage", "acme")
    ref = config if what == "config" else factory
    assert str(info.value) == (
        f"ddlkit-acme 1.0 (ddlkit_acme.plugin): storage backend 'acme': its {what} {ref!r} does not import ({reason})"
    )


@pytest.mark.parametrize(("factory", "config"), [("acme_storage.AcmeStorage", None), ("m:A", "acme:")])
def test_an_import_path_without_its_attribute_is_refused(
    ddlkit_pm: DdlkitPluginManager, factory: str, config: str | None
) -> None:
    add_plugin(ddlkit_pm, storage_plugin(Registration("acme", factory, config=config)))
    with pytest.raises(
        PluginError,
        match=r": storage backend 'acme': (factory|config) '[^']*' is not an import "
        r"path; write it as \"package.module:attr\", or give the object itself$",
    ):
        Registry.collect(ddlkit_pm)


def test_a_hook_that_raises_is_reported_with_its_plugin(ddlkit_pm: DdlkitPluginManager) -> None:
    class Broken:
        @ddlkit.hookimpl
        def ddlkit_loggers(self):
            raise RuntimeError("cannot reach the tracking server")
            yield  # a generator, as registration hooks usually are

    add_plugin(
        ddlkit_pm,
        Broken(),
        name="tracker",
        distribution="ddlkit-tracker",
        version="2.1",
        module="ddlkit_tracker.plugin",
    )
    with pytest.raises(PluginError) as info:
        Registry.collect(ddlkit_pm)
    assert str(info.value) == (
        "ddlkit-tracker 2.1 (ddlkit_tracker.plugin): hook ddlkit_loggers raised "
        "RuntimeError: cannot reach the tracking server"
    )
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_hook_may_return_a_list_or_none(ddlkit_pm: DdlkitPluginManager) -> None:
    class ListPlugin:
        @ddlkit.hookimpl
        def ddlkit_storage_backends(self):
            return [Registration("s3", LocalStorage)]

        @ddlkit.hookimpl
        def ddlkit_loggers(self):
            return None

    add_plugin(ddlkit_pm, ListPlugin())
    reg = Registry.collect(ddlkit_pm)
    assert reg.names("storage") == ["local", "local_ssd", "nfs", "s3"]
    assert reg.names("logger") == ["console", "jsonl"]


def test_create_builds_from_the_config_node(ddlkit_pm: DdlkitPluginManager, tmp_path) -> None:
    from ddlkit.builtin.local_storage import LocalStorageConfig

    backend = Registry.collect(ddlkit_pm).create("storage", "local", LocalStorageConfig(root=str(tmp_path)))
    assert isinstance(backend, LocalStorage) and backend.root == tmp_path


def test_a_failing_factory_names_the_plugin(ddlkit_pm: DdlkitPluginManager) -> None:
    def factory(cfg: object) -> object:
        raise ValueError("bucket must not be empty")

    add_plugin(
        ddlkit_pm,
        storage_plugin(Registration("s3", factory)),
        name="s3",
        distribution="ddlkit-s3",
        version="0.3",
        module="ddlkit_s3.plugin",
    )
    with pytest.raises(PluginError) as info:
        Registry.collect(ddlkit_pm).create("storage", "s3", None)
    assert str(info.value) == (
        "storage backend 's3' from ddlkit-s3 0.3 (ddlkit_s3.plugin) failed to initialise: "
        "ValueError: bucket must not be empty"
    )
    assert isinstance(info.value.__cause__, ValueError)


def test_a_factory_raising_a_ddlkit_error_passes_it_through(ddlkit_pm: DdlkitPluginManager) -> None:
    def factory(cfg: object) -> object:
        raise ddlkit.ConfigError("storage.bucket is required")

    add_plugin(ddlkit_pm, storage_plugin(Registration("s3", factory)))
    with pytest.raises(ddlkit.ConfigError, match=r"^storage.bucket is required$"):
        Registry.collect(ddlkit_pm).create("storage", "s3", None)


# ---------------------------------------------------------------------------- models and optimizers
@dataclass
class WidthConfig:
    width: int = 64


@dataclass
class DepthConfig:
    depth: int = 4


def model_plugin(*items: Registration) -> object:
    class Plugin:
        @ddlkit.hookimpl
        def ddlkit_models(self):
            yield from items

    return Plugin()


def test_a_model_is_registered_per_framework_and_its_options_are_the_union(ddlkit_pm: DdlkitPluginManager) -> None:
    add_plugin(
        ddlkit_pm,
        model_plugin(
            Registration("unet", lambda cfg, data: ("torch", cfg), config=WidthConfig, framework="pytorch"),
            Registration("unet", lambda cfg, data: ("jax", cfg), config=DepthConfig, framework="jax"),
        ),
    )
    reg = Registry.collect(ddlkit_pm)
    assert reg.names("model") == ["unet"] and reg.frameworks_of("model", "unet") == ["jax", "pytorch"]
    assert sorted(f.name for f in dataclasses.fields(reg.get("model", "unet").config)) == ["depth", "width"]
    assert reg.create_for("model", "jax", "unet", "cfg", data=None) == ("jax", "cfg")


def test_a_framework_without_the_model_lists_its_own(ddlkit_pm: DdlkitPluginManager) -> None:
    add_plugin(
        ddlkit_pm,
        model_plugin(Registration("unet", print, framework="pytorch"), Registration("mlp", print, framework="jax")),
    )
    with pytest.raises(ddlkit.ConfigError) as info:
        Registry.collect(ddlkit_pm).get_for("model", "jax", "unet")
    assert str(info.value) == (
        "framework=jax has no model 'unet' (model unet is implemented for framework=pytorch). "
        "Choose one framework=jax has: mlp."
    )


def test_one_framework_registering_a_model_twice_is_a_conflict(ddlkit_pm: DdlkitPluginManager) -> None:
    for n in ("one", "two"):
        add_plugin(
            ddlkit_pm,
            model_plugin(Registration("unet", print, framework="pytorch")),
            name=n,
            distribution=f"ddlkit-{n}",
            module=f"ddlkit_{n}.plugin",
        )
    with pytest.raises(PluginConflictError, match=r"^model 'unet' \(framework=pytorch\) is registered by 2 plugins"):
        Registry.collect(ddlkit_pm)


def test_frameworks_must_agree_on_a_shared_option(ddlkit_pm: DdlkitPluginManager) -> None:
    @dataclass
    class OtherWidth:
        width: int = 32

    add_plugin(
        ddlkit_pm,
        model_plugin(
            Registration("unet", print, config=WidthConfig, framework="pytorch"),
            Registration("unet", print, config=OtherWidth, framework="jax"),
        ),
    )
    with pytest.raises(
        PluginError,
        match=r"model 'unet': option 'width' is declared differently by .* \(int = 32\) "
        r"and .* \(int = 64\); the plugins must agree",
    ):
        Registry.collect(ddlkit_pm)


def test_a_model_must_name_its_framework(ddlkit_pm: DdlkitPluginManager) -> None:
    add_plugin(ddlkit_pm, model_plugin(Registration("unet", print)))
    with pytest.raises(PluginError, match="model 'unet' names no framework"):
        Registry.collect(ddlkit_pm)


@pytest.mark.plugins  # framework=pytorch: its models and optimizers
def test_selected_is_every_name_the_config_picks() -> None:
    from ddlkit.testing import compose

    registry = installed_registry()
    cfg = compose(registry, ["framework=pytorch", "logger=[console,jsonl]", "model=resnet18"])
    assert [(group, entry.registration.name) for group, entry in registry.selected(cfg)] == [
        ("data", "synthetic"),
        ("storage", "local"),
        ("compute", "local"),
        ("framework", "pytorch"),
        ("logger", "console"),
        ("logger", "jsonl"),
        ("model", "resnet18"),
        ("optimizer", "sgd"),
    ]
    # the model is the framework's own implementation of the name
    assert dict(registry.selected(cfg))["model"].registration.framework == "pytorch"


def test_framework_facts_come_from_the_framework_plugins(
    ddlkit_pm: DdlkitPluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which frameworks have release images and which library's models each trains: declared on the
    framework classes, so a third-party framework takes part without a change in the core."""
    from ddlkit.compute.containers import default_image, release_frameworks
    from ddlkit.custom import wrong_kind

    class Jax(ddlkit.Framework):
        model_libraries = {"flax": "a Flax module"}
        release_image = True

        def train(self, run: object) -> None: ...

    class Plain(ddlkit.Framework):
        def train(self, run: object) -> None: ...

    class Plugin:
        @ddlkit.hookimpl
        def ddlkit_frameworks(self):
            yield Registration("jax", Jax)
            yield Registration("plain", Plain)

    add_plugin(ddlkit_pm, Plugin(), name="jax")
    monkeypatch.setattr("ddlkit.plugins.get_plugin_manager", lambda: ddlkit_pm)
    assert release_frameworks() == ["jax"]
    assert default_image("jax", gpu=False).endswith(f"/jax:{ddlkit.__version__}-cpu")
    with pytest.raises(ddlkit.ConfigError, match="ddlkit builds no image for framework=plain; its images are for jax"):
        default_image("plain")

    flax_module = type("Dense", (), {"__module__": "flax.linen"})()
    assert str(wrong_kind("model.target=m:f", flax_module, "plain", "plain.Model")).endswith(
        "framework=plain trains plain.Model models (a Flax module: use framework=jax)."
    )
    assert str(wrong_kind("model.target=m:f", object(), "plain", "plain.Model")).endswith(
        "framework=plain trains plain.Model models."
    )
