"""ddlkit's version: one place, read by the package, its build (pyproject.toml) and its image tags."""

__version__ = "0.1.0"
