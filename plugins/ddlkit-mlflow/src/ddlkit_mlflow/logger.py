"""MLflow: one MLflow run per job, logged from rank 0, nested under a parent run per sweep.

    ddlkit 'logger=[console,jsonl,mlflow]' logger.mlflow.experiment=resnets
    ddlkit -m 'logger=[console,mlflow]' optimizer.lr=0.1,0.05          # one parent run, a child per job

- **Where**: `logger.mlflow.tracking_uri`, else the `MLFLOW_TRACKING_URI` environment variable,
  else a local store in the job directory: `<job dir>/mlflow.db` (SQLite) with the artifacts in
  `<job dir>/mlartifacts/`. SQLite, not a `mlruns/` directory: it is MLflow 3's own default
  (`sqlite:///mlflow.db`) and needs no server, while MLflow 3's file store is in maintenance mode
  and refuses to open unless `MLFLOW_ALLOW_FILE_STORE=true`.
  `mlflow ui --backend-store-uri sqlite:///<job dir>/mlflow.db` shows it.
- **One MLflow run per job**, in the experiment `logger.mlflow.experiment` (default `ddlkit`,
  created when missing), named after the job. Its id is kept in `<job dir>/.ddlkit/mlflow-run.json`
  (and the run is tagged with the job's name, which is unique to its directory, for a target that
  does not bring `.ddlkit/` back), so a restarted, resumed or retried job continues the same run.
- **A parent run per sweep**: under `ddlkit -m` (the sweep launcher sets `DDLKIT_SWEEP_NAME` for
  every job) each job's run is nested under one run named after the sweep, found by its tags or
  created by the first job to start (`logger.mlflow.nest_sweeps=false`: no parent). The parent is
  RUNNING while one of its jobs runs, then ends with the worst of its jobs' statuses. Nesting needs
  one store for the whole sweep: a tracking server or `logger.mlflow.tracking_uri` (the default
  store is each job's own).
- **Params**: the job's resolved config, flattened to dotted keys (`optimizer.lr`), every secret
  replaced by `***`, each value cut to 500 characters (the smallest limit of MLflow's servers),
  sent 100 per request (MLflow's batch limit). A resumed run keeps its params: MLflow's are written
  once.
- **Metrics**: `train/*` at every logging step and `val/*` after each validation, at the job's
  optimizer step; `result.json`'s numbers as `result/*` at the last step. MLflow cannot delete a
  metric's points, so a job that resumes from step S after its run had reached step L > S logs
  from step L + 1 on: the run keeps the interrupted attempt's values for steps S + 1 to L (the job
  says so; `metrics.jsonl` has the resumed attempt's), and every step appears once, in order.
  Sent together every `logger.mlflow.send_every_s` seconds (2; each request costs the job's
  process a few milliseconds of CPU, one per step would be a per-cent of a fast step), in the
  background (MLflow's asynchronous logging; `logger.mlflow.async_logging=false`: the send waits),
  and sent and waited for at each checkpoint and when the job ends, so a job killed and resumed
  from its checkpoint has every step up to it in the run. Measured (`benchmarks/mlflow_overhead.py`:
  ResNet-18 at 32 px on the CPU, every step logged, a tracking server on the same machine, 5 rounds,
  quiet): images/sec 0.3 % below `logger=[console]` as the ratio of the medians, 1.1 % as the
  median of the rounds' ratios (0.7 % and 1.0 % with `async_logging=false`); the process's CPU per
  image 3 % above it (0.4 % synchronous): the background sender's work, which a core with nothing
  else to do absorbs.
- **Artifacts**: `result.json` when the job completed; `logger.mlflow.log_model=true` also uploads
  `model.*` (the trained weights, so `trainer.save_model=true`) under `model/`.
- **Tags**: `ddlkit.job` (the job's name), `ddlkit.job_dir`, `ddlkit.compute`, `ddlkit.framework`,
  `ddlkit.world_size`, in a sweep `ddlkit.sweep` and `ddlkit.sweep_job`, MLflow's
  `mlflow.source.git.commit` when `environment.json` records the commit, and `logger.mlflow.tags`.
- **Status**: completed is FINISHED, failed is FAILED, interrupted (preempted, cancelled) is KILLED.
- **Checked before anything runs**: an `http(s)://` tracking URI is asked for an answer within
  5 seconds in the launcher (MLflow's own client would retry for minutes); a server that does not
  answer stops the command with one line that names it, and exit status 2.

A tracking server that is not running:

    $ ddlkit 'logger=[console,mlflow]' logger.mlflow.tracking_uri=http://127.0.0.1:9
    ddlkit: error: logger.mlflow: the MLflow tracking server at http://127.0.0.1:9 does not answer ...

Signing in: `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD`, or `MLFLOW_TRACKING_TOKEN`,
in the launcher's environment; ddlkit passes them to rank 0 (the password and the token in the
job's secret environment, never in a file).

## Azure ML

An Azure ML workspace is an MLflow tracking server. Its URI has the form

    azureml://<region>.api.azureml.ms/mlflow/v1.0/subscriptions/<subscription>/resourceGroups/<group>/providers/Microsoft.MachineLearningServices/workspaces/<workspace>

(`az ml workspace show --query mlflow_tracking_uri` prints it). Set it as `logger.mlflow.tracking_uri`
or `MLFLOW_TRACKING_URI`; the ranks then need the `azureml-mlflow` package, which signs in with
the Azure credentials of the machine. ddlkit does not check such a URI in the launcher (only
`http(s)://` ones); under `compute=azureml` the job's own workspace already is its tracking server.

## How it works

`mlflow` is imported when a run starts, never when ddlkit composes a config or lists plugins. The
plugin installs the full `mlflow` package, not `mlflow-skinny`: the default store needs its
SQLAlchemy store. The config is redacted by ddlkit's `split_secrets`. The launcher's check is a
plain HTTP request with a 5-second timeout, not MLflow's client. The plugin's tests (`cd
plugins/ddlkit-mlflow && python -m pytest`) start a real `mlflow server` and read back what the
jobs logged: params without secrets, steps once each across a restart and a resume, one parent
run with a child per sweep job, one run for a two-rank job.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from omegaconf import OmegaConf

import ddlkit
from ddlkit.atomic import write_text
from ddlkit.jobdir import ENVIRONMENT_FILE, RESULT_FILE, STATE_DIR, SWEEP_JOB_ENV, SWEEP_NAME_ENV
from ddlkit.redact import redact_text, split_secrets

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from omegaconf import DictConfig

    from ddlkit import RunContext

#: where the job's MLflow run is kept, inside the job directory
RUN_FILE = Path(STATE_DIR) / "mlflow-run.json"
#: the default store, inside the job directory, and its artifacts
LOCAL_DB = "mlflow.db"
LOCAL_ARTIFACTS = "mlartifacts"
#: MLflow's statuses for ddlkit's
STATUSES = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
#: a param's value is cut to this many characters: the smallest limit among MLflow's servers
#: (MLflow's own is 6000 since 2.x; Azure ML's and older servers' 500)
MAX_PARAM_VALUE = 500
#: MLflow's limits on one log_batch request
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
#: seconds the launcher waits for an http(s) tracking server's answer
CHECK_TIMEOUT_S = 5.0
#: tags of a sweep's parent run
SWEEP_TAG = "ddlkit.sweep"
ROLE_TAG = "ddlkit.role"
PARENT_TAG = "mlflow.parentRunId"


@dataclass
class MlflowConfig:
    # the tracking server or store; null = MLFLOW_TRACKING_URI, else sqlite:///<job dir>/mlflow.db
    tracking_uri: str | None = None
    # the MLflow experiment (created when missing)
    experiment: str = "ddlkit"
    # the run's name; null = the job's name (`name` itself is ddlkit's: the option's name, mlflow)
    run_name: str | None = None
    # more tags for the run
    tags: dict[str, str] = field(default_factory=dict)
    # under `ddlkit -m`, nest each job's run under one parent run per sweep
    nest_sweeps: bool = True
    # upload the trained model (model.* in the job directory) under the run's model/ artifacts
    log_model: bool = False
    # send metrics in the background (MLflow's asynchronous logging), waited for at checkpoints and the end
    async_logging: bool = True
    # seconds between two sends of the metrics logged since (one request for all of them: each costs
    # the job's process milliseconds of CPU); 0 = a request at every logging step
    send_every_s: float = 2.0


def shown_uri(uri: str) -> str:
    """``uri`` as it may be printed: without a password in it, nor a SAS in its query."""
    parts = urlsplit(uri)
    if parts.password is not None or parts.username is not None:
        host = parts.hostname or ""
        netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
        uri = urlunsplit(parts._replace(netloc=netloc))
    return redact_text(uri)


def check_reachable(uri: str, timeout: float = CHECK_TIMEOUT_S) -> str | None:
    """Why the tracking server at an http(s) ``uri`` cannot be used (it does not answer within
    ``timeout``), None when it answers at all (any HTTP status: a server behind a sign-in answers 401)."""
    request = urllib.request.Request(uri.rstrip("/") + "/health", method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as err:
        reason = err.reason
        return str(reason.strerror if isinstance(reason, OSError) and reason.strerror else reason)
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except (OSError, ValueError) as err:
        return str(err)


class MlflowLogger(ddlkit.Logger):
    client: MlflowClient
    run_id: str

    def configure(self, config: DictConfig) -> None:
        if find_spec("mlflow") is None:
            raise ddlkit.ConfigError(
                "logger=mlflow needs the mlflow package: pip install mlflow (or drop mlflow from logger)."
            )
        if not str(self.cfg.experiment).strip():
            raise ddlkit.ConfigError("logger.mlflow.experiment is empty: name an MLflow experiment (default ddlkit).")
        if self.cfg.send_every_s < 0:
            raise ddlkit.ConfigError(
                f"logger.mlflow.send_every_s={self.cfg.send_every_s} is invalid: seconds between sends, 0 or more."
            )
        if self.cfg.log_model and not config.trainer.save_model:
            raise ddlkit.ConfigError(
                "logger.mlflow.log_model=true uploads the trained model, which "
                "trainer.save_model=false does not write; set one of them differently."
            )
        uri = self.cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
        if urlsplit(uri).scheme in ("http", "https"):
            why = check_reachable(uri)
            if why is not None:
                where = "logger.mlflow.tracking_uri" if self.cfg.tracking_uri else "MLFLOW_TRACKING_URI"
                raise ddlkit.ConfigError(
                    f"logger.mlflow: the MLflow tracking server at {shown_uri(uri)} does not answer ({why}); "
                    f"start it, or fix {where} (without a tracking URI the job logs to "
                    f"<job dir>/{LOCAL_DB})."
                )

    # ------------------------------------------------------------------------------ start
    def start(self, run: RunContext) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag

        self.job_dir = run.job_dir
        self.pending: list[Any] = []
        self.buffer: list[Any] = []
        self.sent_at = time.monotonic()
        self.skip_to: dict[str, int] = {}
        self.last_step = 0
        uri = self.cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run.job_dir / LOCAL_DB}"
        self.local = not (self.cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        self.client = MlflowClient(tracking_uri=uri)
        experiment_id = self._experiment()
        sweep = os.environ.get(SWEEP_NAME_ENV)
        kept = _read_json(run.job_dir / RUN_FILE)
        run_id = kept.get("run_id") if isinstance(kept, dict) and kept.get("tracking_uri") == uri else None
        existing = self._existing(run_id) if run_id else self._job_run(experiment_id, run.name)
        # a parent needs one store for the whole sweep: the default one is each job's own
        nest = self.cfg.nest_sweeps and not self.local
        parent = self._sweep_parent(experiment_id, sweep) if sweep and nest else None
        if existing is None:
            tags = self._tags(run, sweep)
            if parent is not None:
                tags[PARENT_TAG] = parent
            created = self.client.create_run(experiment_id, tags=tags, run_name=self.cfg.run_name or run.name)
            self.run_id = created.info.run_id
            logged: dict[str, str] = {}
        else:
            self.run_id = existing.info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            logged = dict(existing.data.params)
            self._resume_after(existing, run)
        if self.run_id != run_id:
            record = {"run_id": self.run_id, "experiment_id": experiment_id, "tracking_uri": uri}
            write_text(run.job_dir / RUN_FILE, json.dumps(record) + "\n")
        if parent is not None:
            self.client.update_run(parent, status="RUNNING")
        self.parent = parent
        params = [Param(k, v) for k, v in self._params(run).items() if k not in logged]
        for chunk in _chunks(params, MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=chunk, synchronous=True)
        if existing is not None:  # the tags of this attempt (a restart may run on another compute)
            again = [RunTag(k, v) for k, v in self._tags(run, sweep).items()]
            self.client.log_batch(self.run_id, tags=again, synchronous=True)

    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        name = str(self.cfg.experiment)
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                raise ddlkit.ConfigError(
                    f"logger.mlflow: the MLflow experiment {name!r} is deleted; restore it "
                    f"(mlflow experiments restore --experiment-id {found.experiment_id}) or name another one."
                )
            return str(found.experiment_id)
        location = (self.job_dir / LOCAL_ARTIFACTS).as_uri() if self.local else None
        try:
            return str(self.client.create_experiment(name, artifact_location=location))
        except MlflowException:  # another job of the sweep created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def _existing(self, run_id: str | None) -> Any:
        """The job's run from an earlier attempt, if it is still there (not deleted)."""
        from mlflow.exceptions import MlflowException

        if not run_id:
            return None
        try:
            found = self.client.get_run(run_id)
        except MlflowException:
            return None
        return None if found.info.lifecycle_stage == "deleted" else found

    def _job_run(self, experiment_id: str, job: str) -> Any:
        """The job's run when its id was not kept here (a target that copies the job directory to
        its nodes leaves ``.ddlkit/`` behind): the one tagged with the job's name, which is unique
        to its directory."""
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`ddlkit.job` = '{_quote(job)}'", max_results=1
        )
        return found[0] if found else None

    def _resume_after(self, existing: Any, run: RunContext) -> None:
        """A run continued from an earlier attempt: steps at or below what it has already logged of
        each metric are not logged again (MLflow cannot delete points: they would be there twice)."""
        latest: dict[str, int] = {}
        for key in existing.data.metrics:
            history = self.client.get_metric_history(self.run_id, key)
            if history:
                latest[key] = max(m.step for m in history)
        self.skip_to = latest
        resumed = run.resumed_at.step if run.resumed_at is not None else 0
        ahead = max((step for key, step in latest.items() if not key.startswith("result/")), default=0)
        if ahead > resumed:
            print(
                f"ddlkit: logger.mlflow: MLflow run {self.run_id} already has steps up to {ahead}; resumed from step "
                f"{resumed}, this attempt logs from step {ahead + 1} on (MLflow cannot delete the interrupted "
                f"attempt's values for steps {resumed + 1}-{ahead}; metrics.jsonl has this attempt's)",
                flush=True,
            )

    def _sweep_parent(self, experiment_id: str, sweep: str) -> str:
        """The id of the sweep's parent run: found by its tags, or created. Jobs that start at once
        may each create one: then every job keeps the first created (the earliest start, then the
        smallest id), and the others delete their own."""
        query = f"tags.`{SWEEP_TAG}` = '{_quote(sweep)}' and tags.`{ROLE_TAG}` = 'sweep'"
        found = self._parents(experiment_id, query)
        if found:
            return found[0]
        mine = self.client.create_run(
            experiment_id,
            tags={SWEEP_TAG: sweep, ROLE_TAG: "sweep", "ddlkit.sweep_dir": str(self.job_dir.parent)},
            run_name=sweep,
        ).info.run_id
        chosen = self._parents(experiment_id, query)[0]
        if chosen != mine:
            self.client.delete_run(mine)
        return chosen

    def _parents(self, experiment_id: str, query: str) -> list[str]:
        runs = self.client.search_runs([experiment_id], filter_string=query, max_results=100)
        return [r.info.run_id for r in sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))]

    def _tags(self, run: RunContext, sweep: str | None) -> dict[str, str]:
        tags = {
            "ddlkit.job": run.name,
            "ddlkit.job_dir": str(run.job_dir),
            "ddlkit.compute": str(run.cfg.compute.name),
            "ddlkit.framework": str(run.cfg.framework.name),
            "ddlkit.world_size": str(run.dist.world_size),
        }
        if sweep:
            tags["ddlkit.sweep"] = sweep
            tags["ddlkit.sweep_job"] = os.environ.get(SWEEP_JOB_ENV, "")
        git = (_read_json(run.job_dir / ENVIRONMENT_FILE) or {}).get("git") or {}
        if git.get("commit"):
            tags["mlflow.source.git.commit"] = str(git["commit"])
            tags["ddlkit.git_dirty"] = str(bool(git.get("dirty"))).lower()
        tags.update({str(k): str(v) for k, v in (self.cfg.tags or {}).items()})
        redacted, _ = split_secrets(tags)
        return {k: redact_text(str(v)) for k, v in redacted.items()}

    @staticmethod
    def _params(run: RunContext) -> dict[str, str]:
        config, _ = split_secrets(OmegaConf.to_container(run.cfg, resolve=True, enum_to_str=True))
        return {key: _param_value(value) for key, value in _flatten(config, "")}

    # ------------------------------------------------------------------------------ metrics
    def log_metrics(self, step: int, metrics: Mapping[str, float], *, split: str) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for key, value in metrics.items():
            name = f"{split}/{key}"
            if step > self.skip_to.get(name, -1):
                self.buffer.append(Metric(name, float(value), now, step))
        self.last_step = max(self.last_step, step)
        if len(self.buffer) >= MAX_METRICS_PER_BATCH or time.monotonic() - self.sent_at >= self.cfg.send_every_s:
            self._send()

    def _send(self) -> None:
        """One request (per MLflow's 1000 metrics) for the metrics logged since the last."""
        for chunk in _chunks(self.buffer, MAX_METRICS_PER_BATCH):
            pending = self.client.log_batch(self.run_id, metrics=chunk, synchronous=not self.cfg.async_logging)
            if pending is not None:
                self.pending.append(pending)
        self.buffer, self.sent_at = [], time.monotonic()
        if len(self.pending) > 1000:  # long done, as a rule: waiting costs nothing
            self._wait(keep=100)

    def flush(self) -> None:
        """Send what is logged and wait until it has reached MLflow. Called when a checkpoint is
        saved (:mod:`ddlkit_mlflow.plugin`): every step up to a checkpoint is then in the run, so a
        job resumed from it leaves no gap; and when the job ends."""
        self._send()
        self._wait()

    def _wait(self, keep: int = 0) -> None:
        """Wait for the background sends, all but the last ``keep``."""
        from mlflow.exceptions import MlflowException

        done, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        failed: list[str] = []
        for operations in done:
            try:
                operations.wait()
            except MlflowException as err:  # the server went away: training goes on, the job says so
                failed.append((str(err).strip().splitlines() or [type(err).__name__])[0])
        if failed:
            print(
                f"ddlkit: logger.mlflow: {len(failed)} of the metric batches sent in the background did not reach "
                f"MLflow run {self.run_id} ({failed[0][:300]})",
                flush=True,
            )

    # ------------------------------------------------------------------------------ finish
    def finish(self, status: str, result: Mapping[str, Any] | None) -> None:
        from mlflow.entities import Metric

        mlflow_status = STATUSES.get(status, "FAILED")
        try:
            self.flush()
            if result is not None:
                now = int(time.time() * 1000)
                numbers = [
                    Metric(f"result/{k}", float(v), now, self.last_step)
                    for k, v in result.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                ]
                for chunk in _chunks(numbers, MAX_METRICS_PER_BATCH):
                    self.client.log_batch(self.run_id, metrics=chunk, synchronous=True)
                self._log_result(result)
            if self.cfg.log_model and status == "completed":
                self._log_model()
        finally:
            self.client.set_terminated(self.run_id, status=mlflow_status)
            if self.parent is not None:
                self._end_parent()

    def _log_result(self, result: Mapping[str, Any]) -> None:
        path = self.job_dir / RESULT_FILE
        if path.is_file():
            self.client.log_artifact(self.run_id, str(path))
            return
        # not written yet where the run publishes it later: the same record, from memory
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / RESULT_FILE
            copy.write_text(json.dumps(dict(result), indent=2, default=str) + "\n", encoding="utf-8")
            self.client.log_artifact(self.run_id, str(copy))

    def _log_model(self) -> None:
        models = sorted(p for p in self.job_dir.glob("model.*") if p.is_file())
        if not models:
            print(f"ddlkit: logger.mlflow.log_model: the framework saved no model.* in {self.job_dir}", flush=True)
            return
        for path in models:
            self.client.log_artifact(self.run_id, str(path), artifact_path="model")

    def _end_parent(self) -> None:
        """The sweep's parent run ends when none of its jobs runs, with the worst of their statuses
        (a job that starts later sets it RUNNING again). Each job ends its own run first, so the
        last one to look sees them all ended."""
        assert self.parent is not None
        children = self.client.search_runs(
            [self.client.get_run(self.parent).info.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{self.parent}'",
            max_results=10000,
        )
        statuses = {c.info.status for c in children}
        if "RUNNING" in statuses or "SCHEDULED" in statuses:
            return
        worst = next((s for s in ("FAILED", "KILLED") if s in statuses), "FINISHED")
        self.client.set_terminated(self.parent, status=worst)


def _flatten(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), node


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= MAX_PARAM_VALUE else text[: MAX_PARAM_VALUE - 3] + "..."


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
