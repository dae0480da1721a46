"""ddlkit.launch.compose_once: a Hydra run's config composed once, the same as Hydra's two compositions."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import hydra
import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from ddlkit.launch.compose_once import compose_once

CONFIG = """\
defaults:
  - db: mysql
  - _self_
  - override hydra/job_logging: none
  - override hydra/hydra_logging: none
lr: 0.1
"""


def run_app(
    tmp_path: Path, overrides: list[str], *, once: bool, monkeypatch: pytest.MonkeyPatch, config: str = CONFIG
) -> tuple[dict[str, Any], int]:
    """Run a small Hydra app on ``overrides``; what its task saw (the config and Hydra's node), and
    how many times Hydra composed."""
    conf = tmp_path / "conf"
    (conf / "db").mkdir(parents=True, exist_ok=True)
    (conf / "config.yaml").write_text(config)
    (conf / "db" / "mysql.yaml").write_text("port: 3306\nuser: ${oc.env:USER,me}\n")
    (conf / "db" / "postgres.yaml").write_text("port: 5432\n")
    seen: dict[str, Any] = {}

    def task(cfg: Any) -> None:
        seen["cfg"] = OmegaConf.to_container(cfg, resolve=False)
        hc = OmegaConf.to_container(HydraConfig.get(), resolve=False)
        seen["hydra"] = hc
        seen["mode"] = str(HydraConfig.get().mode)

    composed = 0
    load = ConfigLoaderImpl.load_configuration

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal composed
        composed += 1
        return load(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counting)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # Hydra raises its errors instead of exiting
    argv = [*overrides, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    monkeypatch.setattr(sys, "argv", ["app", *argv])
    app = hydra.main(config_path=str(conf), config_name="config", version_base="1.3")(task)
    with compose_once(argv) if once else contextlib.nullcontext():
        app()
    return seen, composed


@pytest.mark.parametrize("overrides", [[], ["db=postgres", "lr=0.5", "+extra=1"], ["~db"], ["hydra.mode=RUN"]])
def test_a_run_is_composed_once_and_sees_what_two_compositions_give(
    tmp_path: Path, overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    twice, composed_twice = run_app(tmp_path / "a", overrides, once=False, monkeypatch=monkeypatch)
    once, composed_once = run_app(tmp_path / "a", overrides, once=True, monkeypatch=monkeypatch)
    assert (composed_twice, composed_once) == (2, 1)
    assert once == twice and once["mode"] == "RunMode.RUN"


def test_a_config_that_sets_the_mode_to_run_is_composed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = CONFIG + "hydra:\n  mode: RUN\n"
    twice, _ = run_app(tmp_path, [], once=False, monkeypatch=monkeypatch, config=config)
    once, composed = run_app(tmp_path, [], once=True, monkeypatch=monkeypatch, config=config)
    assert composed == 1 and once == twice


def test_a_config_that_sets_multirun_still_sweeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    once, composed = run_app(
        tmp_path, [], once=True, monkeypatch=monkeypatch, config=CONFIG + "hydra:\n  mode: MULTIRUN\n"
    )
    assert once["mode"] == "RunMode.MULTIRUN" and composed >= 2
    assert (tmp_path / "sweep").is_dir()


@pytest.mark.parametrize(
    ("overrides", "config", "error"),
    [
        (["lr=1,2"], CONFIG, "Ambiguous value for argument 'lr=1,2'"),  # a sweep in a single run: refused
        ([], CONFIG.replace("db: mysql", "db: ???"), "You must specify 'db'"),  # a group left without a choice
    ],
)
def test_what_the_second_composition_refuses_is_still_refused(
    tmp_path: Path, overrides: list[str], config: str, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for once in (False, True):
        with pytest.raises(Exception, match=error):
            run_app(tmp_path, overrides, once=once, monkeypatch=monkeypatch, config=config)
