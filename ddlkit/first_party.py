"""Which first-party plugin provides an option, for the error a user sees when it is not installed.

With only the core installed, ``framework=keras`` would otherwise say just "Choose one of: pytorch"
(or "No plugin registers any"), and the user has to guess that Keras is a separate package. This
table names the options the plugins shipped beside the core register, and how to install each.
``tests/test_first_party.py`` checks it against what those plugins really register, so it cannot
drift. Third-party options are not listed: their names are unknown here.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution

__all__ = ["PLUGINS", "Provider", "install_hint", "providers"]

#: the models (the ResNets, and model=custom) and the optimizers every framework plugin registers
_MODELS = ("custom", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
_OPTIMIZERS = ("adamw", "lamb", "lars", "sgd")
#: the Vision Transformers, PyTorch's alone
_TRANSFORMERS = ("vit_b_16", "vit_l_16", "vit_h_14", "swin_t", "swin_b")


@dataclass(frozen=True)
class Provider:
    """A first-party plugin: its distribution and how to install it from a ddlkit checkout."""

    distribution: str
    #: the pip command, run in the root of a ddlkit checkout
    install: str
    #: ``(group, name)`` it registers
    options: tuple[tuple[str, str], ...]
    #: what it needs besides pip packages, if anything
    needs: str = ""

    def installed(self) -> bool:
        try:
            distribution(self.distribution)
        except PackageNotFoundError:
            return False
        return True


def _framework(name: str, *models: str) -> tuple[tuple[str, str], ...]:
    return (
        ("framework", name),
        *(("model", m) for m in (*_MODELS, *models)),
        *(("optimizer", o) for o in _OPTIMIZERS),
    )


PLUGINS: tuple[Provider, ...] = (
    Provider(
        "ddlkit-pytorch",
        "pip install -e ./plugins/ddlkit-pytorch",
        _framework("pytorch", *_TRANSFORMERS),
        needs="the torch build for your machine first (the install page says which)",
    ),
    Provider(
        "ddlkit-tensorflow",
        "pip install -e './plugins/ddlkit-tensorflow[cpu]'",
        _framework("tensorflow"),
        needs="[gpu] instead of [cpu] for TensorFlow with CUDA",
    ),
    Provider(
        "ddlkit-keras",
        "pip install -e './plugins/ddlkit-tensorflow[cpu]' -e ./plugins/ddlkit-keras",
        _framework("keras"),
    ),
    Provider(
        "ddlkit-mpi",
        "pip install -e ./plugins/ddlkit-mpi",
        (("compute", "local_mpi"), ("compute", "mpi")),
        needs="OpenMPI's mpirun (Debian/Ubuntu: apt-get install openmpi-bin)",
    ),
    Provider(
        "ddlkit-slurm",
        "pip install -e ./plugins/ddlkit-slurm",
        (("compute", "slurm"),),
        needs="a Slurm cluster's sbatch, srun and scontrol on the PATH",
    ),
    Provider("ddlkit-ray", "pip install -e ./plugins/ddlkit-ray", (("compute", "ray"),)),
    Provider(
        "ddlkit-azure",
        "pip install -e './plugins/ddlkit-azure[azureml,batchai]'",
        (("storage", "azure"), ("compute", "azureml"), ("compute", "batchai")),
    ),
    Provider("ddlkit-wandb", "pip install -e ./plugins/ddlkit-wandb", (("logger", "wandb"),)),
    Provider("ddlkit-tensorboard", "pip install -e ./plugins/ddlkit-tensorboard", (("logger", "tensorboard"),)),
    Provider("ddlkit-mlflow", "pip install -e ./plugins/ddlkit-mlflow", (("logger", "mlflow"),)),
)


def providers(group: str, name: str) -> list[Provider]:
    """The first-party plugins that register ``group=name`` (several for a model or an optimizer)."""
    return [p for p in PLUGINS if (group, name) in p.options]


def install_hint(group: str, name: str) -> str:
    """One sentence naming the plugin(s) that provide ``group=name`` and how to install one, when
    none of them is installed; "" for a name no first-party plugin provides, or one whose plugin is
    installed (then the registry's own "not loaded" lines say why it is missing)."""
    found = providers(group, name)
    if not found or any(p.installed() for p in found):
        return ""
    if len(found) == 1:
        (p,) = found
        needs = f" It needs {p.needs}." if p.needs else ""
        return (
            f"{group}={name} comes from the {p.distribution} plugin, which is not installed: {p.install} "
            f"(in a ddlkit checkout).{needs}"
        )
    names = ", ".join(p.distribution for p in found)
    return (
        f"{group}={name} comes with a framework plugin ({names}), none of which is installed: e.g. "
        f"{found[0].install} (in a ddlkit checkout)."
    )
