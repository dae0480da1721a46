"""ddlkit's test kit: an opt-in pytest plugin for plugin authors (and ddlkit's own tests).

It is deliberately not registered under ``pytest11``: that would import the kit, and Hydra
with it, into every pytest session of every environment where ddlkit is installed. Enable it
in your *top-level* ``conftest.py``::

    pytest_plugins = ["ddlkit.testing"]

    @pytest.fixture(autouse=True)
    def _isolated(ddlkit_isolation):
        pass

A session with the kit records the jobs it submits in a temporary state directory of its own
(``DDLKIT_STATE_DIR``), never in the user's ``ddlkit jobs list``. Fixtures:

* ``ddlkit_isolation`` - restores the environment (and fails a test that changed it without
  ``monkeypatch``), runs the test in ``tmp_path`` with ddlkit's state directory (the jobs index
  of ``ddlkit jobs``) below it, clears ddlkit's cached plugin manager and Hydra's global state;
  meant to be made autouse as above;
* ``ddlkit_pm`` - a fresh :class:`~ddlkit.plugins.DdlkitPluginManager`: specs and built-ins,
  no entry points; add your plugin with :func:`add_plugin`;
* ``hook_recorder`` - a :class:`HookRecorder` of the lifecycle hook calls made on ``ddlkit_pm``;
* ``run_inprocess`` - runs the real worker in this process on ``ddlkit_pm`` (fast; hooks
  recordable); returns a :class:`WorkerOutcome`;
* ``run_factory`` - runs the real ``python -m ddlkit`` CLI in a subprocess; returns a :class:`RunOutcome`.

Both run fixtures add ``framework=fake`` (:mod:`ddlkit.testing.fakes`) unless the overrides
choose a framework, so a run needs no deep-learning library and takes a fraction of a second
in-process, about two seconds through the CLI. Helpers for your own fixtures: :func:`add_plugin`,
:func:`compose` and :func:`make_run`. For tests of jobs that run in other processes:
:func:`wait_for` (until a log line, a file or a state appears), :func:`hold` (where nothing is
to happen for a while), :func:`alive`, and :func:`rank_rows` (the rank table of ``ddlkit jobs
status``). For a framework's ``dist=horovod`` checks: :func:`horovod_at` (which Horovod, built
with which bindings, ``import horovod`` finds).
Contract suites for the five interfaces are in :mod:`ddlkit.testing.contracts`; multi-rank
jobs under ``mpirun`` in :mod:`ddlkit.testing.multirank`; a rank's real exit record (under the
rank minder, for tests of how a job ended) in :mod:`ddlkit.testing.ranks`; a loopback container registry (the OCI
distribution API over HTTPS, token auth) in :mod:`ddlkit.testing.registry`.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from .. import result as result_schema
from ..compute.secret_env import SECRETS_ENV
from ..compute.state import STATE_DIR_ENV
from ..hookspecs import hookimpl
from ..jobdir import JOB_FILE, METRICS_FILE, RESULT_FILE
from ..plugins import DdlkitPluginManager, PluginInfo, get_plugin_manager, new_plugin_manager
from ..registry import HOOK_POINTS, Registry
from . import fakes

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..rank.run import Run

__all__ = [
    "DDLKIT_ENV",
    "FAKES_MODULE",
    "RESULT_KEYS",
    "HookCall",
    "HookRecorder",
    "RunFactory",
    "RunOutcome",
    "WorkerOutcome",
    "add_plugin",
    "alive",
    "compose",
    "ddlkit_isolation",
    "ddlkit_pm",
    "hold",
    "hook_recorder",
    "interruptible",
    "make_run",
    "rank_rows",
    "run_factory",
    "run_inprocess",
    "wait_for",
    "with_default_framework",
]

#: environment variables that change what ddlkit loads or does; ``ddlkit_isolation`` removes
#: them so that a developer's shell cannot change a test's outcome
DDLKIT_ENV = (
    "DDLKIT_PLUGINS",
    "DDLKIT_DISABLE_PLUGINS",
    "DDLKIT_DISABLE_PLUGIN_AUTOLOAD",
    "DDLKIT_TRACE_PLUGINS",
    "DDLKIT_EXPERIMENTS",
    STATE_DIR_ENV,
    SECRETS_ENV,
)
#: the keys ddlkit's core writes to every completed run's result.json (plugins may add their
#: own through ``run.extra_result``): what end-to-end tests of a framework check
RESULT_KEYS = result_schema.NAMES
#: pytest itself rewrites this one around every phase of a test
_PYTEST_ENV = "PYTEST_CURRENT_TEST"
#: variables a library sets when it is first imported, whichever test imports it first: not the test's doing
#: (scikit-learn's, which Optuna imports where it is installed -- MLflow brings it)
_SET_ON_IMPORT = frozenset({"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"})
#: the groups ddlkit.config.store_schemas stores besides the hook points
_CORE_GROUPS = ("trainer", "dist", "experiment")
#: what DDLKIT_PLUGINS names to load the fakes in a subprocess
FAKES_MODULE = fakes.__name__


# ---------------------------------------------------------------------------- the session
_SESSION_STATE = pytest.StashKey[tuple[str | None, str]]()


def pytest_configure(config: pytest.Config) -> None:
    """A pytest session with the kit records the jobs it submits in a state directory of its own
    -- also those of fixtures that outlive a test (module or session scope) and of tests without
    ``ddlkit_isolation`` --, never in the user's index (``ddlkit jobs list``)."""
    path = tempfile.mkdtemp(prefix="ddlkit-test-state-")
    config.stash[_SESSION_STATE] = (os.environ.get(STATE_DIR_ENV), path)
    os.environ[STATE_DIR_ENV] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    previous, path = config.stash[_SESSION_STATE]
    if previous is None:
        os.environ.pop(STATE_DIR_ENV, None)
    else:
        os.environ[STATE_DIR_ENV] = previous
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------- helpers
def add_plugin(
    pm: DdlkitPluginManager,
    plugin: ModuleType | object,
    *,
    name: str | None = None,
    distribution: str = "tests",
    version: str = "0",
    module: str | None = None,
) -> object:
    """Register ``plugin`` (a module, or an object with ``@ddlkit.hookimpl`` methods) on ``pm``
    as if entry point ``name`` of ``distribution`` had loaded it from ``module`` (the import
    path shown in messages). Returns the plugin."""
    if module is None:
        cls = type(plugin)
        module = plugin.__name__ if isinstance(plugin, ModuleType) else f"{cls.__module__}.{cls.__qualname__}"
    name = name or module
    if not pm.has_plugin(name) and not pm.is_registered(plugin):
        pm.register_plugin(plugin, PluginInfo(name, distribution, version, module))
    return plugin


def with_default_framework(overrides: Sequence[str]) -> list[str]:
    """``overrides`` plus ``framework=fake`` unless they select a framework themselves."""
    chosen = any(_override_key(o) == "framework" for o in overrides)
    return list(overrides) if chosen else ["framework=fake", *overrides]


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def compose(registry: Registry, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``ddlkit``'s config as the CLI does (schemas from ``registry``), without running."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from ..config import store_schemas

    store_schemas(registry)
    with initialize_config_module("ddlkit.conf", version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def make_run(pm: DdlkitPluginManager, job_dir: Path, *overrides: str) -> Run:
    """A :class:`ddlkit.Run` built from validated config (fakes added), ready to hand to a
    framework or a logger; nothing is trained and no job file is written."""
    from ..config import rebuild
    from ..launch.validate import validate
    from ..rank.distributed import DistContext
    from ..rank.run import Run

    add_plugin(pm, fakes, name=FAKES_MODULE)
    registry = Registry.collect(pm)
    cfg = compose(registry, with_default_framework(overrides))
    # the worker's view: the resolved config as read back from job.json, typed again
    typed = rebuild(validate(cfg, registry, pm), registry)
    Path(job_dir).mkdir(parents=True, exist_ok=True)
    return Run(typed, Path(job_dir), pm=pm, registry=registry, dist=DistContext())


@dataclass
class _JobFiles:
    #: the job directory (``hydra.run.dir``); None for commands that run no job
    job_dir: Path | None
    _files: dict[str, str] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        # a snapshot: re-running a job in the same directory (to resume) must not change this outcome
        if self.job_dir is None:
            return
        for name in (RESULT_FILE, METRICS_FILE):
            if (self.job_dir / name).is_file():
                self._files[name] = (self.job_dir / name).read_text(encoding="utf-8")

    def _text(self, name: str) -> str:
        try:
            return self._files[name]
        except KeyError:
            raise AssertionError(f"the run wrote no {name} (job directory: {self.job_dir})") from None

    @property
    def result(self) -> dict[str, Any]:
        """``result.json``, parsed, as it was when the run ended."""
        return json.loads(self._text(RESULT_FILE))

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """``metrics.jsonl``, one dict per line, as it was when the run ended."""
        return [json.loads(line) for line in self._text(METRICS_FILE).splitlines() if line.strip()]


@dataclass
class RunOutcome(_JobFiles):
    """What a ``ddlkit`` subprocess did."""

    returncode: int
    stdout: str
    stderr: str
    argv: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return f"$ {' '.join(self.argv)}\n--- stdout ---\n{self.stdout[-6000:]}\n--- stderr ---\n{self.stderr[-6000:]}"

    def assert_returncode(self, expected: int) -> RunOutcome:
        """Fail showing the command's output unless it exited with ``expected``."""
        if self.returncode != expected:
            raise AssertionError(f"ddlkit exited {self.returncode}, expected {expected}\n{self.output}")
        return self

    def assert_success(self) -> RunOutcome:
        return self.assert_returncode(0)

    def assert_one_line_error(self, *fragments: str) -> str:
        """Fail unless ddlkit refused with exit status 2 and one error line, the last on stderr, with no
        traceback, that holds every one of ``fragments``; return that line. Progress lines before it (a
        remote target saying what it creates) are allowed: the refusal itself is one line."""
        self.assert_returncode(2)
        lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ddlkit: error:")]
        assert errors and errors == lines[-1:] and "Traceback" not in self.stderr, self.output
        for fragment in fragments:
            assert fragment in lines[-1], self.output
        return lines[-1]


@dataclass
class WorkerOutcome(_JobFiles):
    """What an in-process worker did. ``run`` is None when it failed before building the Run."""

    exit_code: int
    run: Run | None
    #: the status passed to ``ddlkit_run_end``, None when no Run was built
    status: str | None


class RunFactory:
    """``run_factory(*overrides)`` runs a job through the real CLI in a subprocess;
    ``run_factory.cli(*args)`` runs any ``ddlkit`` command line (``plugins``, ``--cfg job``)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._counter = itertools.count(1)

    def __call__(
        self, *overrides: str, job_dir: Path | None = None, env: Mapping[str, str] | None = None, timeout: float = 120.0
    ) -> RunOutcome:
        """Run ``ddlkit [framework=fake] OVERRIDES hydra.run.dir=JOB_DIR``. Each call gets a new
        job directory under ``tmp_path`` unless ``job_dir`` names one (reuse it to resume)."""
        job_dir = Path(job_dir) if job_dir is not None else self.base_dir / f"run-{next(self._counter)}"
        args = with_default_framework(overrides)
        if not any(_override_key(o) == "hydra.run.dir" for o in overrides):
            args.append(f"hydra.run.dir={job_dir}")
        return self.cli(*args, env=env, timeout=timeout, job_dir=job_dir)

    def cli(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        python_args: Sequence[str] = (),
        timeout: float = 120.0,
        job_dir: Path | None = None,
    ) -> RunOutcome:
        """Run ``python [PYTHON_ARGS] -m ddlkit ARGS`` in ``tmp_path`` with the fakes loaded."""
        plugins = [p for p in os.environ.get("DDLKIT_PLUGINS", "").split(",") if p.strip()]
        full_env = {**os.environ, "DDLKIT_PLUGINS": ",".join([*plugins, FAKES_MODULE]), **(env or {})}
        argv = [sys.executable, *python_args, "-m", "ddlkit", *args]
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            cwd=self.base_dir,
            preexec_fn=interruptible,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGINT, not SIGKILL: the launcher then cancels its job, so no worker outlives the test
            proc.send_signal(signal.SIGINT)
            try:
                stdout, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            outcome = RunOutcome(job_dir, proc.returncode, stdout, stderr, argv)
            raise AssertionError(f"ddlkit did not finish within {timeout} s\n{outcome.output}") from None
        return RunOutcome(job_dir, proc.returncode, stdout, stderr, argv)


def interruptible() -> None:
    """``preexec_fn`` for a child a test will interrupt as Ctrl-C does (SIGINT): give it
    SIGINT's default action. A shell starts a script's background jobs with SIGINT ignored, and
    Python keeps an inherited ignore, so without this a test that sends SIGINT would pass or
    fail according to how pytest itself was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---------------------------------------------------------------------------- other processes
_T = TypeVar("_T")


#: a row of the rank table ``ddlkit jobs status`` prints: rank, node, host, images/sec, data wait, sync wait
_RANK_ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+\S+\s+([\d.]+)\s+(\d+)%\s+(\d+)%", re.M)


def rank_rows(status: str) -> list[tuple[str, str, str, str, str]]:
    """The rows of the rank table in ``ddlkit jobs status``'s output ``status``: (rank, node,
    images/sec, data wait %, sync wait %) each, as printed; [] where it shows none."""
    return _RANK_ROW.findall(status)


def wait_for(
    predicate: Callable[[], _T],
    what: str,
    *,
    timeout: float = 60.0,
    pace: float = 0.05,
    process: subprocess.Popen | None = None,
    detail: Callable[[], str] | None = None,
) -> _T:
    """Call ``predicate`` every ``pace`` seconds until it returns something true, and return that:
    for what another process or thread brings about (a line in a log, a file, a job's state), so
    that a test waits as long as that takes and no longer.

    Fails (``AssertionError``) with "timed out after TIMEOUT s waiting for WHAT" -- the default
    is generous, for busy machines; pass a shorter one where the wait's length is what the test
    asserts --, and at once, with its exit status, when ``process`` (say the launcher whose job
    the predicate looks at) has exited without the predicate coming true. ``detail()``, if
    given, is added to either message: the output so far, the states seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if process is not None and process.poll() is not None:
            # what it did just before it exited counts: look once more
            value = predicate()
            if value:
                return value
            problem = f"process {process.pid} exited with status {process.returncode} before {what}"
            break
        if time.monotonic() >= deadline:
            problem = f"timed out after {timeout:g} s waiting for {what}"
            break
        time.sleep(pace)
    raise AssertionError(problem if detail is None else f"{problem}\n{detail()}")


def hold(seconds: float, why: str) -> None:
    """Let ``seconds`` pass, in a test whose subject is that nothing happens meanwhile (a job
    stays pending while its node is taken, a suspended job outlasts a timeout). ``why`` says what
    the time is for, where it is spent and in the test's captured output. A test that waits for
    something to happen uses :func:`wait_for` instead."""
    print(f"holding {seconds:g} s: {why}", flush=True)
    time.sleep(seconds)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie (exited, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def horovod_at(monkeypatch: pytest.MonkeyPatch, package: Path | None) -> None:
    """Make the directory ``package`` what ``import horovod`` finds (None: no Horovod), for
    :func:`ddlkit.horovod.horovod_built_with`: a Horovod built with a framework's binding has
    that binding's library, e.g. ``package / "torch" / "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"``."""
    spec = None
    if package is not None:
        spec = importlib.machinery.ModuleSpec("horovod", None, is_package=True)
        spec.submodule_search_locations = [str(package)]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "horovod" else real(name, *a))


@dataclass(frozen=True)
class HookCall:
    """One recorded hook call: its name and keyword arguments (also reachable as ``call["step"]``)."""

    name: str
    kwargs: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.kwargs[key]


class HookRecorder:
    """Records every hook call made through a plugin manager, in order (as pytest's does).

    Registration hooks are not recorded: the registry calls their implementations directly.
    """

    def __init__(self, pm: DdlkitPluginManager) -> None:
        self.calls: list[HookCall] = []
        self._undo = pm.add_hookcall_monitoring(self._before, lambda *args: None)

    def _before(self, hook_name: str, hook_impls: object, kwargs: Mapping[str, Any]) -> None:
        self.calls.append(HookCall(hook_name, dict(kwargs)))

    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def getcalls(self, name: str) -> list[HookCall]:
        return [c for c in self.calls if c.name == name]

    def getcall(self, name: str) -> HookCall:
        """The one call of ``name``; fails listing the calls made if there is not exactly one."""
        calls = self.getcalls(name)
        if len(calls) != 1:
            raise AssertionError(f"expected exactly one call of {name}, got {len(calls)}; calls: {self.names()}")
        return calls[0]

    def clear(self) -> None:
        self.calls.clear()

    def finish_recording(self) -> None:
        self._undo()


class _RunEndCapture:
    """Catches the Run and its final status, which the worker does not return."""

    run: Run | None = None
    status: str | None = None

    @hookimpl
    def ddlkit_run_end(self, run: Run, status: str) -> None:
        self.run, self.status = run, status


# ---------------------------------------------------------------------------- fixtures
def _forget_ddlkit_schemas() -> None:
    """Drop the config groups ddlkit stores (rebuilt by ``store_schemas`` before every compose), so
    that no plugin registered in one test stays selectable in the next. Hydra's own groups stay:
    they are stored once, when its modules are imported."""
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for group in (*HOOK_POINTS, *_CORE_GROUPS):
        repo.pop(group, None)


@pytest.fixture
def ddlkit_isolation(tmp_path: Path) -> Iterator[None]:
    """Isolate a test from the process and the process from the test (make it autouse)."""
    from hydra.core.global_hydra import GlobalHydra

    _forget_ddlkit_schemas()
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    with pytest.MonkeyPatch.context() as mp:
        for name in DDLKIT_ENV:
            mp.delenv(name, raising=False)
        # relative paths (experiments/, outputs/) then land in the test's own directory, and
        # the jobs a test submits are recorded there, not in the user's own index
        mp.chdir(tmp_path)
        mp.setenv(STATE_DIR_ENV, str(tmp_path / ".ddlkit-state"))
        env_before = dict(os.environ)
        get_plugin_manager.cache_clear()
        try:
            yield
        finally:
            leaked = sorted(
                k
                for k in set(env_before) | set(os.environ)
                if k != _PYTEST_ENV and k not in _SET_ON_IMPORT and env_before.get(k) != os.environ.get(k)
            )
            current = os.environ.get(_PYTEST_ENV)
            os.environ.clear()
            os.environ.update(env_before)
            if current is not None:
                os.environ[_PYTEST_ENV] = current
            get_plugin_manager.cache_clear()
            _forget_ddlkit_schemas()
            GlobalHydra.instance().clear()
            signal.signal(signal.SIGTERM, saved_sigterm)
    if leaked:
        pytest.fail(
            f"the test changed environment variables {leaked} without monkeypatch; they were restored. "
            "Use monkeypatch.setenv/delenv.",
            pytrace=False,
        )


@pytest.fixture
def ddlkit_pm() -> DdlkitPluginManager:
    """A fresh manager with ddlkit's hook specs and built-in plugins only."""
    # new_plugin_manager also honours DDLKIT_PLUGINS and DDLKIT_TRACE_PLUGINS; keep them out
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DDLKIT_PLUGINS", raising=False)
        mp.delenv("DDLKIT_TRACE_PLUGINS", raising=False)
        return new_plugin_manager(autoload=False)


@pytest.fixture
def hook_recorder(ddlkit_pm: DdlkitPluginManager) -> Iterator[HookRecorder]:
    recorder = HookRecorder(ddlkit_pm)
    yield recorder
    recorder.finish_recording()


@pytest.fixture(scope="session")
def event_accumulator() -> type:
    """TensorBoard's reader of event files (``tensorboard`` must be installed). It loads TensorFlow
    when installed, which sets environment variables as it imports: loaded once per session, before
    any test's environment is recorded."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat import tf

    tf.__version__  # noqa: B018 -- resolves the lazy module now
    return EventAccumulator


@pytest.fixture
def run_factory(tmp_path: Path) -> RunFactory:
    return RunFactory(tmp_path)


@pytest.fixture
def run_inprocess(
    ddlkit_pm: DdlkitPluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., WorkerOutcome]:
    """``run_inprocess(*overrides, job_dir=None)``: compose and prepare the job as the launcher
    does, then run :func:`ddlkit.rank.worker.main` in this process on ``ddlkit_pm`` (plus the fakes),
    so ``hook_recorder`` sees every hook and a debugger can step into the loop."""
    from ..launch.prepare import prepare
    from ..rank import worker

    add_plugin(ddlkit_pm, fakes, name=FAKES_MODULE)
    # the worker takes the process-wide manager; in a test it must be this one
    monkeypatch.setattr(worker, "get_plugin_manager", lambda: ddlkit_pm)
    counter = itertools.count(1)

    def run(*overrides: str, job_dir: Path | None = None) -> WorkerOutcome:
        job_dir = Path(job_dir) if job_dir is not None else tmp_path / f"inprocess-{next(counter)}"
        registry = Registry.collect(ddlkit_pm)
        args = with_default_framework(overrides)
        job = prepare(compose(registry, args), job_dir=job_dir, overrides=args, registry=registry, pm=ddlkit_pm)
        capture = _RunEndCapture()
        ddlkit_pm.register(capture)
        saved_sigterm = signal.getsignal(signal.SIGTERM)  # the worker installs its own handler
        try:
            with monkeypatch.context() as mp:
                for key, value in {**job.spec.env, **job.spec.secret_env}.items():
                    mp.setenv(key, value)
                # the worker runs in its job directory, as every compute target starts it
                mp.chdir(job.spec.job_dir)
                code = worker.main([JOB_FILE])
        finally:
            signal.signal(signal.SIGTERM, saved_sigterm)
            ddlkit_pm.unregister(capture)
        return WorkerOutcome(job.spec.job_dir, code, capture.run, capture.status)

    return run
