"""Hydra launcher plugin shipped with ddlkit: ``hydra/launcher=ddlkit`` (see ddlkit_launcher.py)."""
