"""ddlkit hooks for MLflow (the entry-point target; imports no mlflow)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import ddlkit

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ddlkit import RunContext


@ddlkit.hookimpl
def ddlkit_loggers() -> Iterator[ddlkit.Registration]:
    yield ddlkit.Registration(
        "mlflow",
        "ddlkit_mlflow.logger:MlflowLogger",
        config="ddlkit_mlflow.logger:MlflowConfig",
        packages=("mlflow",),
        description="MLflow: one run per job, nested under a parent run per sweep",
    )


#: what MLflow's client reads from the environment on rank 0: where to log, and how to sign in
RANK_ENV = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
)


@ddlkit.hookimpl
def ddlkit_job_environment(config: DictConfig) -> dict[str, str] | None:
    """Rank 0 may run on another machine: pass on the MLflow variables set here (the password and
    the token travel as secrets, never in a file)."""
    if (config.get("logger") or {}).get("mlflow") is None:
        return None
    return {k: os.environ[k] for k in RANK_ENV if k in os.environ}


@ddlkit.hookimpl
def ddlkit_checkpoint_saved(run: RunContext, path: str, step: int) -> None:
    """Every metric up to a checkpoint reaches MLflow before training goes on: a job killed later
    and resumed from that checkpoint then finds each step up to it in its run (rank 0; the
    loggers' background sending is otherwise waited for only when the job ends)."""
    from .logger import MlflowLogger

    for logger in run.loggers:
        if isinstance(logger, MlflowLogger):
            logger.flush()
