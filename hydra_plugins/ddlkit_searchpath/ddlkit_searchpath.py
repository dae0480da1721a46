"""Where the ``ddlkit`` app finds the user's own configs, besides ddlkit's package.

* ``./conf`` (a ``conf/`` beside the user's code, as Hydra users keep one): presets in any group
  (``conf/compute/mycluster.yaml``) and experiments (``conf/experiment/quick.yaml``);
* the experiment directories, ``./experiments`` and ``$DDLKIT_EXPERIMENTS``, whose flat
  ``<name>.yaml`` files are the group ``experiment`` (``+experiment=<name>``), each read only
  when selected: a broken file breaks only the commands that select it.

``--config-dir`` and ``hydra.searchpath`` come after these, as Hydra places them; the plugins'
schemas (``structured://``) come last. Hydra imports this module at the start of every Hydra app
in the environment, so it imports only Hydra here and changes nothing for apps other than ddlkit.
"""

import builtins
import os

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin

#: ddlkit's own config package, as ``hydra.main`` and ``initialize_config_module`` name it: its
#: presence in the search path says the app is ddlkit
DDLKIT_CONF = ("pkg://ddlkit/conf", "pkg://ddlkit.conf")
EXPERIMENT_GROUP = "experiment"


class DdlkitSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not any(element.path in DDLKIT_CONF for element in search_path.get_path()):
            return
        try:
            from ddlkit.config import experiment_dirs, user_conf_dirs
        except ImportError:  # an older ddlkit core first on the path (benchmarks/plan.py --before): it stores its own
            return

        for directory in user_conf_dirs():
            search_path.append("ddlkit conf", f"file://{directory}")
        for directory in experiment_dirs():
            search_path.append("ddlkit experiments", f"{ExperimentsConfigSource.scheme()}://{directory}")


class ExperimentsConfigSource(ConfigSource):
    """A directory of ``<name>.yaml`` files seen as the config group ``experiment``. An experiment
    without a ``# @package`` header is merged at the top level (``_global_``)."""

    @staticmethod
    def scheme() -> str:
        return "ddlkit-experiments"

    def _file(self, config_path: str) -> str | None:
        group, _, name = config_path.partition("/")
        if group != EXPERIMENT_GROUP or not name or "/" in name:
            return None
        return os.path.join(self.path, self._normalize_file_name(name))

    def load_config(self, config_path: str) -> ConfigResult:
        from omegaconf import OmegaConf
        from yaml import YAMLError

        from ddlkit.config import yaml_error_line

        path = self._file(config_path)
        if path is None or not os.path.isfile(path):
            raise ConfigLoadError(f"Config not found: {config_path}")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            header = ConfigSource._get_header_dict(text[:512])
            config = OmegaConf.create(text)
        except (YAMLError, ValueError) as err:
            raise ConfigLoadError(f"experiment file {path} is not a valid config: {yaml_error_line(err)}") from None
        if header.get("package") is None:
            header["package"] = "_global_"
        return ConfigResult(config=config, path=self.full_path(), provider=self.provider, header=header)

    def available(self) -> bool:
        return os.path.isdir(self.path)

    def is_group(self, config_path: str) -> bool:
        return config_path in ("", EXPERIMENT_GROUP) and self.available()

    def is_config(self, config_path: str) -> bool:
        path = self._file(config_path)
        return path is not None and os.path.isfile(path)

    # builtins.list: in this class, `list` is this method
    def list(self, config_path: str, results_filter: ObjectType | None) -> builtins.list[str]:
        if config_path == "":
            wanted = results_filter in (None, ObjectType.GROUP) and self.available()
            return [EXPERIMENT_GROUP] if wanted else []
        if config_path != EXPERIMENT_GROUP or results_filter is ObjectType.GROUP or not self.available():
            return []
        return sorted(
            name[: -len(".yaml")]
            for name in os.listdir(self.path)
            if name.endswith(".yaml") and os.path.isfile(os.path.join(self.path, name))
        )
