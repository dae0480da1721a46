"""Plugin discovery: entry points, blocking, import failures, the environment switches, and a
third-party distribution found through the real ``ddlkit`` group by the real CLI.

tests/data/fake-plugin (on sys.path through pytest's ``pythonpath``) holds the distribution
ddlkit-fake 0.1, whose entry points live in the private groups ``ddlkit_test`` and
``ddlkit_test_invalid`` so that no real run ever loads them."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

import ddlkit
from ddlkit import PluginConflictError, PluginLoadError, UnknownNameError
from ddlkit.plugins import BUILTIN_PLUGINS, DdlkitPluginManager, PluginInfo, get_plugin_manager, new_plugin_manager
from ddlkit.registry import Registry
from ddlkit.testing import RunFactory, add_plugin

GROUP = "ddlkit_test"
BROKEN_ERROR = "ModuleNotFoundError: No module named 'ddlkit_fake_missing_dependency'"


@pytest.fixture
def load_fake_group(ddlkit_pm: DdlkitPluginManager, monkeypatch: pytest.MonkeyPatch):
    """Load the fake distribution's entry points, blocking the given ones (the broken one warns)."""

    def load(*, block: str = "dup") -> DdlkitPluginManager:
        monkeypatch.setenv("DDLKIT_DISABLE_PLUGINS", block)
        ddlkit_pm.load_entrypoints(group=GROUP)
        return ddlkit_pm

    return load


def test_builtins_come_from_the_ddlkit_distribution(ddlkit_pm: DdlkitPluginManager) -> None:
    assert sorted(name for name, _ in ddlkit_pm.list_name_plugin()) == sorted(BUILTIN_PLUGINS)
    info = ddlkit_pm.infos[id(ddlkit_pm.get_plugin("ddlkit.builtin.local_storage"))]
    assert info == PluginInfo(
        "ddlkit.builtin.local_storage", "ddlkit", version("ddlkit"), "ddlkit.builtin.local_storage"
    )


def test_entry_point_plugin_is_found_with_its_distribution(load_fake_group) -> None:
    with pytest.warns(RuntimeWarning):
        pm = load_fake_group()
    plugin = pm.get_plugin("ok")
    assert plugin.__name__ == "ddlkit_fake.ok"
    assert pm.infos[id(plugin)] == PluginInfo("ok", "ddlkit-fake", "0.1", "ddlkit_fake.ok", from_entry_point=True)
    assert pm.entry_point_name(plugin) == "ok"
    entry = Registry.collect(pm).entries["storage"]["fake-ok"]
    assert entry.origin == "ddlkit-fake 0.1 (ddlkit_fake.ok)"
    assert entry.registration.description == "registered by ddlkit_fake.ok"


def test_a_broken_plugin_warns_and_is_remembered(load_fake_group) -> None:
    with pytest.warns(RuntimeWarning) as warned:
        pm = load_fake_group()
    assert [str(w.message) for w in warned] == [
        f"ddlkit plugin 'broken' from ddlkit-fake 0.1 (ddlkit_fake.broken) failed to load: {BROKEN_ERROR}"
    ]
    assert pm.failures == [
        PluginInfo("broken", "ddlkit-fake", "0.1", "ddlkit_fake.broken", error=BROKEN_ERROR, from_entry_point=True)
    ]
    assert not pm.has_plugin("broken")
    # ...and the runs that need none of its names are unaffected, while a missing name says why
    with pytest.raises(UnknownNameError) as info:
        Registry.collect(pm).get("storage", "fake-broken")
    assert str(info.value) == (
        "unknown storage backend 'fake-broken' (config key `storage`). Choose one of: fake-ok, local, local_ssd, nfs.\n"
        f"  Not loaded: ddlkit-fake 0.1 (ddlkit_fake.broken): {BROKEN_ERROR}"
    )


def test_two_plugins_registering_one_name_conflict(load_fake_group) -> None:
    with pytest.warns(RuntimeWarning):
        pm = load_fake_group(block="")
    with pytest.raises(PluginConflictError) as info:
        Registry.collect(pm)
    assert str(info.value) == (
        "storage backend 'fake-ok' is registered by 2 plugins:\n"
        "  - ddlkit-fake 0.1 (ddlkit_fake.dup), entry point 'dup'\n"
        "  - ddlkit-fake 0.1 (ddlkit_fake.ok), entry point 'ok'\n"
        "  Uninstall one, or block one with DDLKIT_DISABLE_PLUGINS=<dup or ok>."
    )


def test_disable_plugins_blocks_by_entry_point_name(load_fake_group, recwarn: pytest.WarningsRecorder) -> None:
    pm = load_fake_group(block=" broken , dup ")
    assert [n for n, _ in pm.list_name_plugin() if not n.startswith("ddlkit.")] == ["ok"]
    assert pm.failures == [] and len(recwarn) == 0  # a blocked plugin is not even imported
    assert "ddlkit_fake.broken" not in sys.modules


def test_loading_twice_registers_once(load_fake_group) -> None:
    pm = load_fake_group(block="broken,dup")
    pm.load_entrypoints(group=GROUP)
    assert Registry.collect(pm).names("storage") == ["fake-ok", "local", "local_ssd", "nfs"]


@pytest.mark.parametrize(("switch", "loaded"), [("1", False), ("yes", False), ("0", True), ("", True)])
def test_disable_plugin_autoload(monkeypatch: pytest.MonkeyPatch, switch: str, loaded: bool) -> None:
    monkeypatch.setenv("DDLKIT_DISABLE_PLUGIN_AUTOLOAD", switch)
    monkeypatch.setenv("DDLKIT_DISABLE_PLUGINS", "broken,dup")
    pm = new_plugin_manager(group=GROUP)
    assert pm.has_plugin("ok") is loaded
    assert pm.has_plugin("ddlkit.builtin.run_loop")  # built-ins always load


def test_ddlkit_plugins_registers_modules_by_import_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes, ddlkit_fake.ok")
    pm = new_plugin_manager(autoload=False)
    assert pm.infos[id(pm.get_plugin("ddlkit.testing.fakes"))] == PluginInfo(
        "ddlkit.testing.fakes", "DDLKIT_PLUGINS", "-", "ddlkit.testing.fakes"
    )
    reg = Registry.collect(pm)
    assert reg.names("framework") == ["fake"]
    assert reg.names("storage") == ["fake-ok", "local", "local_ssd", "memory", "nfs"]


def test_ddlkit_plugins_naming_a_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", "acme_missing.plugin")
    with pytest.raises(PluginLoadError) as info:
        new_plugin_manager(autoload=False)
    assert str(info.value) == (
        "DDLKIT_PLUGINS names 'acme_missing.plugin', which cannot be imported: No module named 'acme_missing'"
    )


def test_a_hook_implementation_that_does_not_match_its_spec(ddlkit_pm: DdlkitPluginManager) -> None:
    with pytest.raises(PluginLoadError) as info:
        ddlkit_pm.load_entrypoints(group="ddlkit_test_invalid")
    message = str(info.value)
    assert message.startswith("plugin 'invalid' from ddlkit-fake 0.1 (ddlkit_fake.invalid) is invalid: ")
    assert "loss" in message  # the argument the spec does not offer


def test_an_unknown_hook_is_reported_after_loading(ddlkit_pm: DdlkitPluginManager) -> None:
    class Typo:
        @ddlkit.hookimpl
        def ddlkit_step_ended(self, run):
            pass

    add_plugin(ddlkit_pm, Typo(), name="typo", distribution="ddlkit-typo", version="0.2", module="ddlkit_typo.plugin")
    with pytest.raises(PluginLoadError) as info:
        ddlkit_pm.load_entrypoints(group="ddlkit_no_such_group")
    message = str(info.value)
    assert message.startswith("ddlkit-typo 0.2 (ddlkit_typo.plugin) implements an unknown hook: ")
    assert "ddlkit_step_ended" in message
    assert message.endswith("Hook names start with ddlkit_; see `ddlkit plugins` for the known ones.")


def test_trace_plugins_prints_hook_calls(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("DDLKIT_TRACE_PLUGINS", "1")
    pm = new_plugin_manager(autoload=False)
    pm.hook.ddlkit_configure(config={"trainer": {}})
    assert "ddlkit_configure" in capsys.readouterr().err


def test_the_process_wide_manager_is_built_once_and_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLKIT_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert get_plugin_manager() is get_plugin_manager()
    first = get_plugin_manager()
    get_plugin_manager.cache_clear()
    assert get_plugin_manager() is not first


# ---------------------------------------------------------------------------- a real third-party plugin
ACME_PLUGIN = '''
    """ddlkit hooks of the acme test distribution."""
    from dataclasses import dataclass

    import ddlkit


    @dataclass
    class AcmeConfig:
        # how fast it goes
        speed: int = 3


    class AcmeFramework(ddlkit.Framework):
        def train(self, run):
            raise NotImplementedError


    @ddlkit.hookimpl
    def ddlkit_frameworks():
        yield ddlkit.Registration("acme", AcmeFramework, config=AcmeConfig, description="acme rockets")
'''


def _write_package(root: Path) -> None:
    (root / "acme_ddlkit").mkdir(parents=True)
    (root / "acme_ddlkit" / "__init__.py").write_text('__version__ = "1.2.3"\n')
    (root / "acme_ddlkit" / "plugin.py").write_text(textwrap.dedent(ACME_PLUGIN))


def _install_by_hand(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    _write_package(site)
    info = site / "ddlkit_acme-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddlkit-acme\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text("[ddlkit]\nacme = acme_ddlkit.plugin\n")
    return site


def _install_with_pip(tmp_path: Path) -> Path:
    src, site = tmp_path / "src", tmp_path / "site"
    _write_package(src)
    (src / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "ddlkit-acme"
        version = "1.2.3"
        dependencies = ["ddlkit>=0.1,<0.2"]

        [project.entry-points.ddlkit]
        acme = "acme_ddlkit.plugin"
    """)
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return site


@pytest.mark.parametrize(
    "install", [_install_by_hand, pytest.param(_install_with_pip, marks=pytest.mark.slow)], ids=["dist-info", "pip"]
)
def test_an_installed_distribution_is_discovered_by_the_cli(install, tmp_path: Path, run_factory: RunFactory) -> None:
    site = install(tmp_path)
    env = {"PYTHONPATH": str(site), "COLUMNS": "200"}

    listing = run_factory.cli("plugins", env=env).assert_success()
    row = next(line for line in listing.stdout.splitlines() if "ddlkit-acme" in line)
    assert re.search(r"acme\s+│\s+ddlkit-acme\s+│\s+1\.2\.3\s+│\s+framework=acme\s", row), row

    composed = run_factory.cli("framework=acme", "--cfg", "job", env=env).assert_success()
    assert "framework:\n  speed: 3\n  name: acme\n" in composed.stdout

    typo = run_factory.cli("framework=acmee", env=env).assert_returncode(2)
    assert "ddlkit: error: unknown framework 'acmee' (config key `framework`). Choose one of: " in typo.stderr
    choices = re.search(r"Choose one of: (.*)\.$", typo.stderr, re.M).group(1).split(", ")
    assert {"acme", "fake"} <= set(choices) and choices == sorted(choices)
