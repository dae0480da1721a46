"""An option whose first-party plugin is not installed names that plugin and its install command
(issue 39, item 7), and ddlkit.first_party's table says what the plugins really register."""

from __future__ import annotations

import pytest

from ddlkit import UnknownNameError, first_party
from ddlkit.first_party import PLUGINS, Provider, install_hint, providers
from ddlkit.launch.cli import main
from ddlkit.plugins import new_plugin_manager
from ddlkit.registry import HOOK_POINTS, Registry


@pytest.fixture
def absent_plugin(monkeypatch: pytest.MonkeyPatch) -> Provider:
    """A first-party plugin that is surely not installed, providing compute=faraway and logger=faraway."""
    absent = Provider(
        "ddlkit-faraway",
        "pip install -e ./plugins/ddlkit-faraway",
        (("compute", "faraway"), ("logger", "faraway")),
        needs="a faraway cluster",
    )
    monkeypatch.setattr(first_party, "PLUGINS", (*PLUGINS, absent))
    return absent


def test_a_name_no_first_party_plugin_provides_gets_no_hint(absent_plugin: Provider) -> None:
    assert install_hint("compute", "nonesuch") == ""
    assert install_hint("storage", "faraway") == ""  # the plugin provides compute= and logger=faraway only


def test_the_hint_names_the_plugin_its_install_command_and_what_else_it_needs(absent_plugin: Provider) -> None:
    assert install_hint("compute", "faraway") == (
        "compute=faraway comes from the ddlkit-faraway plugin, which is not installed: "
        "pip install -e ./plugins/ddlkit-faraway (in a ddlkit checkout). It needs a faraway cluster."
    )


def test_an_installed_plugin_gets_no_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    """ddlkit itself is installed: a plugin of that distribution is not the reason a name is missing
    (the registry's "Not loaded" lines say why)."""
    here = Provider("ddlkit", "pip install -e .", (("compute", "faraway"),))
    monkeypatch.setattr(first_party, "PLUGINS", (here,))
    assert install_hint("compute", "faraway") == ""


def test_the_registry_error_carries_the_hint(absent_plugin: Provider) -> None:
    registry = Registry.collect(new_plugin_manager())
    with pytest.raises(UnknownNameError) as info:
        registry.get("compute", "faraway")
    message = str(info.value)
    assert message.startswith(
        "unknown compute target 'faraway' (config key `compute`). compute=faraway comes from the ddlkit-faraway plugin"
    )
    assert "Choose one of: " in message and "local" in message


@pytest.mark.parametrize("override", ["compute=faraway", "logger=[console,faraway]"])
def test_the_command_line_names_the_plugin_and_exits_2(
    absent_plugin: Provider,
    override: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDLKIT_PLUGINS", "ddlkit.testing.fakes")
    assert main(["plan", "framework=fake", override]) == 2
    err = capsys.readouterr().err
    group = override.partition("=")[0]
    assert (
        f"{group}=faraway comes from the ddlkit-faraway plugin, which is not installed: "
        "pip install -e ./plugins/ddlkit-faraway" in err
    )
    assert len(err.strip().splitlines()) == 1, err


def test_a_model_names_every_framework_plugin_that_has_it() -> None:
    assert [p.distribution for p in providers("model", "resnet50")] == [
        "ddlkit-pytorch",
        "ddlkit-tensorflow",
        "ddlkit-keras",
    ]


def _registered_by(distribution: str) -> set[tuple[str, str]]:
    """What the installed plugin(s) of ``distribution`` register, by calling their registration hooks."""
    pm = new_plugin_manager()
    found: set[tuple[str, str]] = set()
    for plugin in pm.get_plugins():
        info = pm.infos.get(id(plugin))
        if info is None or info.distribution != distribution:
            continue
        for hp in HOOK_POINTS.values():
            hook = getattr(plugin, hp.hook, None)
            if hook is not None:
                found |= {(hp.group, reg.name) for reg in hook()}
    return found


@pytest.mark.plugins  # every first-party plugin
@pytest.mark.parametrize("provider", PLUGINS, ids=lambda p: p.distribution)
def test_the_table_says_what_each_first_party_plugin_registers(provider: Provider) -> None:
    """Needs every first-party plugin installed (the full tier's requirements-test.txt)."""
    assert provider.installed(), f"{provider.distribution} is not installed: {provider.install}"
    assert _registered_by(provider.distribution) == set(provider.options)
