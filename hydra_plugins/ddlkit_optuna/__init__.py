"""Hydra sweeper plugin shipped with ddlkit: ``hydra/sweeper=optuna_pruning`` (see ddlkit_optuna.py)."""
