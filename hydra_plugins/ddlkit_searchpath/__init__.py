"""Hydra search path plugin shipped with ddlkit: the user's ``conf/`` and experiments (see ddlkit_searchpath.py)."""
