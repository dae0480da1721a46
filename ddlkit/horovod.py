"""What the installed Horovod was built with, for framework plugins that offer ``dist.backend=horovod``.

Horovod compiles one binding per framework when it is installed (``HOROVOD_WITH_PYTORCH=1``...);
a Horovod built without the selected framework's binding fails only when a rank imports it. A
framework plugin asks :func:`horovod_built_with` in its launcher-side check and says what to do
before any job starts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def horovod_built_with(extension: str) -> bool | None:
    """Whether the installed Horovod has a framework binding's compiled ``extension`` (its
    directory in the package and the library's name, e.g. ``"torch/mpi_lib_v2"``), or None when
    Horovod is not installed. Imports nothing heavy, so a framework plugin's launcher-side check
    (``Framework.configure``) can ask before a job starts, and say what to do."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations)))
    pkg, name = extension.split("/")
    return any((base / pkg).glob(f"{name}*.so"))
