"""Contract suites: the behaviour every implementation of a hook point's interface owes ddlkit.

None of these classes is named ``Test*``, so pytest collects nothing here until you subclass
one in your own test module and provide its fixture (as Hydra's launcher test suites work)::

    from ddlkit.testing.contracts import StorageBackendContract

    class TestGcsStorage(StorageBackendContract):
        @pytest.fixture
        def backend(self, tmp_path):
            return GcsStorage(GcsStorageConfig(bucket="test-bucket", prefix=tmp_path.name))

Subject fixtures: ``backend`` (an *empty* :class:`~ddlkit.StorageBackend`), ``logger`` (a
:class:`~ddlkit.Logger`), ``data_source`` (a small :class:`~ddlkit.DataSource`) and ``target``
(a :class:`~ddlkit.ComputeTarget`; ``multi_rank_target``, one whose jobs have 2 ranks or more, where
``target``'s have 1); :class:`FrameworkContract` instead takes class attributes
naming the framework and its plugin module. Class attributes tune a suite where an
implementation legitimately differs; each is documented where it is declared. The suites need the kit's
fixtures: ``pytest_plugins = ["ddlkit.testing"]`` in your top-level conftest.py.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import re
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .. import result as result_schema
from ..compute.restarts import classify
from ..compute.scheduler import SchedulerJob
from ..interfaces import (
    JOB_FILE,
    Batch,
    ComputeTarget,
    DataSource,
    ImageFilesSpec,
    ImagePoolSpec,
    JobHandle,
    JobSpec,
    JobState,
    JobStatus,
    Logger,
    Shard,
    StorageBackend,
)
from ..interfaces.data import Split, native_spec
from ..jobdir import EXIT_PREEMPTED, rank_record
from ..plugins import DdlkitPluginManager
from ..rank.run import Run, RunState
from . import HookRecorder, WorkerOutcome, add_plugin, alive, make_run, wait_for
from .ranks import LOST_PEER

__all__ = [
    "ComputeTargetContract",
    "DataSourceContract",
    "FrameworkContract",
    "LoggerContract",
    "StorageBackendContract",
]


# ---------------------------------------------------------------------------- storage
class StorageBackendContract:
    """Provide ``backend``: an empty backend that tests may fill."""

    #: whether the backend must refuse keys that leave its root (True for anything file-system-like;
    #: an object store, where ``../x`` is just a key, may set False)
    rejects_escaping_keys: ClassVar[bool] = True
    escaping_keys: ClassVar[tuple[str, ...]] = ("../outside.bin", "a/../../outside.bin", "/outside.bin")

    @pytest.fixture
    def local_file(self, tmp_path: Path) -> Path:
        path = tmp_path / "upload" / "blob.bin"
        path.parent.mkdir(parents=True)
        path.write_bytes(bytes(range(256)) * 16)
        return path

    def _put_bytes(self, backend: StorageBackend, tmp_path: Path, key: str, data: bytes) -> None:
        src = tmp_path / "src.bin"
        src.write_bytes(data)
        backend.put(src, key)

    def _get_bytes(self, backend: StorageBackend, tmp_path: Path, key: str) -> bytes:
        dst = tmp_path / "dst.bin"
        backend.get(key, dst)
        return dst.read_bytes()

    def test_new_backend_is_empty(self, backend: StorageBackend) -> None:
        assert backend.list() == []

    def test_put_get_round_trip(self, backend: StorageBackend, local_file: Path, tmp_path: Path) -> None:
        backend.put(local_file, "dir/sub/blob.bin")
        assert self._get_bytes(backend, tmp_path, "dir/sub/blob.bin") == local_file.read_bytes()

    def test_put_replaces_previous_object(self, backend: StorageBackend, tmp_path: Path) -> None:
        self._put_bytes(backend, tmp_path, "k.txt", b"first version, longer than the second")
        self._put_bytes(backend, tmp_path, "k.txt", b"second")
        assert self._get_bytes(backend, tmp_path, "k.txt") == b"second"
        assert backend.list() == ["k.txt"], "temporary objects of a replacement must not be visible"

    def test_failed_put_keeps_previous_object(self, backend: StorageBackend, tmp_path: Path) -> None:
        self._put_bytes(backend, tmp_path, "k.txt", b"intact")
        with pytest.raises(OSError):
            backend.put(tmp_path / "no-such-file", "k.txt")
        assert self._get_bytes(backend, tmp_path, "k.txt") == b"intact"
        assert backend.list() == ["k.txt"]

    def test_get_replaces_local_file(self, backend: StorageBackend, tmp_path: Path) -> None:
        self._put_bytes(backend, tmp_path, "k.txt", b"new")
        dst = tmp_path / "existing.txt"
        dst.write_bytes(b"old content that is longer")
        backend.get("k.txt", dst)
        assert dst.read_bytes() == b"new"

    def test_exists(self, backend: StorageBackend, tmp_path: Path) -> None:
        self._put_bytes(backend, tmp_path, "a/b.txt", b"x")
        assert backend.exists("a/b.txt")
        assert not backend.exists("a/c.txt")
        assert not backend.exists("a/b.tx")

    def test_list_is_sorted_and_filtered_by_prefix(self, backend: StorageBackend, tmp_path: Path) -> None:
        for key in ("b/2", "a/10", "ab", "a/1", "a/sub/3"):
            self._put_bytes(backend, tmp_path, key, key.encode())
        assert backend.list() == ["a/1", "a/10", "a/sub/3", "ab", "b/2"]
        assert backend.list("a/") == ["a/1", "a/10", "a/sub/3"]
        assert backend.list("a") == ["a/1", "a/10", "a/sub/3", "ab"]
        assert backend.list("zzz") == []

    def test_get_missing_raises_file_not_found(self, backend: StorageBackend, tmp_path: Path) -> None:
        dst = tmp_path / "never-written.bin"
        with pytest.raises(FileNotFoundError):
            backend.get("missing/key.bin", dst)
        assert not dst.exists()

    def test_keys_escaping_the_root_are_rejected(self, backend: StorageBackend, local_file: Path) -> None:
        if not self.rejects_escaping_keys:
            pytest.skip("this backend treats such keys as ordinary keys")
        for key in self.escaping_keys:
            with pytest.raises(ValueError, match="escapes"):
                backend.put(local_file, key)
        assert backend.list() == []


# ---------------------------------------------------------------------------- loggers
class LoggerContract:
    """Provide ``logger``: a fresh logger, built from its config as the registry would.

    Override :meth:`read_back` if what the logger kept can be read back (a file, a service's
    API): the suite then also checks order and resume behaviour.
    """

    #: whether records outlive the process (a file, a service), so that a resumed run's logger
    #: finds the records of the run it continues
    persistent: ClassVar[bool] = True

    @pytest.fixture
    def logger_run(self, ddlkit_pm: DdlkitPluginManager, tmp_path: Path) -> Run:
        """A run the logger is started on (fake framework, not trained)."""
        return make_run(ddlkit_pm, tmp_path / "job", "trainer.epochs=2", "data.length=320", "data.val_length=64")

    def read_back(self, logger: Logger, run: Run) -> list[tuple[int, str]] | None:
        """(step, split) of every metrics record the logger kept, in order; None if unknowable."""
        return None

    def _log_steps(self, logger: Logger, steps: range, run: Run) -> None:
        for step in steps:
            run.state.step = step
            logger.log_metrics(
                step, {"loss": 1.0 / step, "lr": 0.1, "images_per_sec": 100.0, "epoch": step / 10}, split="train"
            )

    def test_completed_lifecycle(self, logger: Logger, logger_run: Run) -> None:
        logger.start(logger_run)
        self._log_steps(logger, range(1, 6), logger_run)
        logger.log_metrics(5, {"epoch": 1.0, "val_loss": 2.0, "val_top1": 0.5, "val_top5": 0.9}, split="val")
        logger.finish("completed", logger_run.result("completed"))
        kept = self.read_back(logger, logger_run)
        if kept is not None:
            assert kept == [(1, "train"), (2, "train"), (3, "train"), (4, "train"), (5, "train"), (5, "val")]

    def test_finish_without_metrics(self, logger: Logger, logger_run: Run) -> None:
        """A run that fails at once still starts and finishes its loggers."""
        logger.start(logger_run)
        logger.finish("failed", None)
        kept = self.read_back(logger, logger_run)
        if kept is not None:
            assert kept == []

    def test_resume_does_not_duplicate_records(self, logger: Logger, logger_run: Run) -> None:
        """Records after the checkpoint a run resumes from are logged again, so they must not stay twice."""
        logger.start(logger_run)
        self._log_steps(logger, range(1, 8), logger_run)
        logger.finish("interrupted", None)
        if not self.persistent or self.read_back(logger, logger_run) is None:
            pytest.skip("the logger's records cannot be read back after its process ends")
        # the run resumes from a checkpoint taken at step 4, as Run.checkpointing would set it up
        logger_run.state = RunState(epoch=0, step=4, batch=4)
        logger_run.resumed_at = RunState(epoch=0, step=4, batch=4)
        # a new process builds a new logger from the same config (Registration.factory(cfg))
        resumed = type(logger)(logger.cfg)
        resumed.start(logger_run)
        self._log_steps(resumed, range(5, 9), logger_run)
        resumed.finish("completed", logger_run.result("completed"))
        assert self.read_back(resumed, logger_run) == [(s, "train") for s in range(1, 9)]


# ---------------------------------------------------------------------------- data
class DataSourceContract:
    """Provide ``data_source``: a small source (a few hundred samples at most). Its batches are
    framework-neutral (:class:`ddlkit.Batch` of numpy arrays), which is what the suite checks."""

    batch_size: ClassVar[int] = 4

    def to_numpy(self, x: Any) -> Any:
        """A batch element as a numpy array (they are numpy arrays already; checked)."""
        import numpy as np

        assert isinstance(x, np.ndarray), f"batches must hold numpy arrays, got {type(x).__name__}"
        return x

    def _loader(self, source: DataSource, split: Split = "train", *, shard: Shard | None = None, seed: int = 0) -> Any:
        return source.loader(split, batch_size=self.batch_size, shard=shard or Shard(), seed=seed)

    def _batches(self, loader: Any, epoch: int = 0, start_batch: int = 0) -> list[tuple[Any, Any]]:
        return [(self.to_numpy(x), self.to_numpy(y)) for x, y in loader.iter_epoch(epoch, start_batch)]

    def test_info_is_consistent(self, data_source: DataSource) -> None:
        info = data_source.info
        assert info.num_classes >= 0  # 0: not a classification task
        assert info.image_size >= 0  # 0: the inputs are not images
        assert info.train_length >= self.batch_size, "the contract needs at least one training batch"
        assert info.val_length >= 0

    def test_serves_batches_of_inputs_and_targets(self, data_source: DataSource) -> None:
        batch = next(iter(self._loader(data_source).iter_epoch(0)))
        assert isinstance(batch, Batch), f"a loader yields ddlkit.Batch records, got {type(batch).__name__}"

    def test_train_epoch_has_len_batches_of_valid_samples(self, data_source: DataSource) -> None:
        info = data_source.info
        loader = self._loader(data_source)
        assert len(loader) == info.train_length // self.batch_size
        batches = self._batches(loader)
        assert len(batches) == len(loader)
        inputs, targets = batches[0]
        assert inputs.shape[0] == targets.shape[0] == self.batch_size
        if info.image_size:  # images: NHWC, RGB
            assert inputs.shape[1:] == (info.image_size, info.image_size, 3), f"image shape {inputs.shape}"
        if info.num_classes:  # classification: class indices
            for _, targets in batches:
                assert 0 <= targets.min() and targets.max() < info.num_classes

    def test_val_epoch_has_len_batches(self, data_source: DataSource) -> None:
        if data_source.info.val_length == 0:
            pytest.skip("no validation split")
        loader = self._loader(data_source, "val")
        assert len(loader) >= 1
        assert len(self._batches(loader)) == len(loader)

    def test_start_batch_skips_exactly_the_seen_batches(self, data_source: DataSource) -> None:
        """A run resumed mid-epoch must see exactly the batches it had not seen yet."""
        loader = self._loader(data_source)
        full = self._batches(loader, epoch=1)
        skip = len(full) // 2
        rest = self._batches(loader, epoch=1, start_batch=skip)
        assert len(rest) == len(full) - skip
        for (x, y), (fx, fy) in zip(rest, full[skip:], strict=True):
            assert (x == fx).all() and (y == fy).all()

    def test_same_seed_same_batches(self, data_source: DataSource) -> None:
        (x1, y1), *_ = self._batches(self._loader(data_source, seed=7))
        (x2, y2), *_ = self._batches(self._loader(data_source, seed=7))
        assert (x1 == x2).all() and (y1 == y2).all()

    def test_ranks_get_their_own_shard(self, data_source: DataSource) -> None:
        info = data_source.info
        if info.train_length < 2 * self.batch_size:
            pytest.skip("too small for two ranks")
        loaders = [self._loader(data_source, shard=Shard(rank, 2)) for rank in (0, 1)]
        assert [len(lo) for lo in loaders] == [info.train_length // (2 * self.batch_size)] * 2
        (x0, _), *_ = self._batches(loaders[0])
        (x1, _), *_ = self._batches(loaders[1])
        assert not (x0 == x1).all(), "two ranks received the same batch"

    def test_a_declared_native_spec_describes_what_the_loader_serves(self, data_source: DataSource) -> None:
        """A framework builds its own pipeline from a loader's ``native_spec()`` instead of its
        batches, so the description must be of the same batches (a loader may declare none)."""
        loader = self._loader(data_source, shard=Shard(0, 1), seed=3)
        spec = native_spec(loader)
        if isinstance(spec, ImagePoolSpec):
            assert spec.batches == len(loader)
            for k, (x, y) in enumerate(self._batches(loader, epoch=1)):
                i = spec.index(1, k)
                assert (x == spec.images[i]).all() and (y == spec.labels[i]).all()
        elif isinstance(spec, ImageFilesSpec):
            assert (spec.batch_size, spec.shard, spec.seed) == (self.batch_size, Shard(0, 1), 3)
            assert len(spec.files) == len(spec.labels) == data_source.info.train_length
            assert spec.on_corrupt in ("error", "skip")
        else:
            assert spec is None, f"native_spec() gave {spec!r}: an ImageFilesSpec, an ImagePoolSpec or None"


# ---------------------------------------------------------------------------- compute
class ComputeTargetContract:
    """Provide ``target``. Its jobs run ``[sys.executable, "-c", CODE]`` in their job directory
    (``JobSpec.args = ("-c", CODE)``), so the Python running the tests must exist where the jobs
    run (true for local targets and most containers). Nothing here assumes that the job runs in
    the launcher's job directory: what a job writes is checked after :meth:`JobHandle.collect`.

    How a job ended is checked as the restart policy reads it (:func:`ddlkit.compute.restarts.classify`):
    a rank killed first, a rank's own error beside a peer that found it gone, a cancel, ranks that
    checkpointed and stopped, a scheduler that says otherwise than the ranks' exit records. The cases
    of several ranks run on ``multi_rank_target`` (default: ``target`` if its jobs have 2 ranks or
    more; a class whose ``target`` has 1 rank provides one with 2, else those cases are skipped).
    Their ranks read their rank from ``OMPI_COMM_WORLD_RANK`` or ``RANK``."""

    #: whether jobs run on this machine, so that process ids written by a job can be checked here
    local_processes: ClassVar[bool] = True
    #: seconds a job may take to start, run a trivial command and report
    timeout_s: ClassVar[float] = 60.0
    #: seconds a cancelled job may take to end
    cancel_timeout_s: ClassVar[float] = 15.0

    @pytest.fixture
    def multi_rank_target(self, target: ComputeTarget) -> ComputeTarget:
        """A target whose jobs have 2 ranks or more, for the cases of how such a job ended (which rank
        failed first). The default is ``target`` when its jobs have; override this fixture with one
        of 2 ranks (2 nodes, or 2 processes on a node) where ``target``'s have 1. A target whose
        jobs always have 1 rank leaves it: those cases are skipped."""
        if target.world_size < 2:
            pytest.skip(
                f"{type(target).__name__} runs jobs of {target.world_size} rank here and the test class gives "
                "no multi_rank_target: which rank failed first needs 2 ranks or more"
            )
        return target

    @pytest.fixture
    def handles(self) -> Iterator[list[JobHandle]]:
        """Every handle submitted by a test; cancelled afterwards so a failing test leaks no job."""
        handles: list[JobHandle] = []
        yield handles
        for handle in handles:
            handle.cancel()
            handle.wait(timeout=self.cancel_timeout_s)
            handle.collect()

    def submit(
        self,
        target: ComputeTarget,
        handles: list[JobHandle],
        job_dir: Path,
        code: str,
        env: dict[str, str] | None = None,
        secret_env: dict[str, str] | None = None,
    ) -> JobHandle:
        job_dir.mkdir(parents=True, exist_ok=True)  # the launcher creates it before submitting
        (job_dir / JOB_FILE).write_text('{"contract": "the job file"}\n', encoding="utf-8")
        spec = JobSpec(
            name=f"contract-{job_dir.name}-{uuid.uuid4().hex[:8]}",
            job_dir=job_dir,
            args=("-c", textwrap.dedent(code)),
            env=env or {},
            secret_env=secret_env or {},
        )
        handle = target.submit(spec)
        handles.append(handle)
        return handle

    def test_status_interval_is_positive(self, target: ComputeTarget) -> None:
        assert target.status_interval_s > 0

    def test_nodes_up_and_fewer_nodes(self, target: ComputeTarget, tmp_path: Path) -> None:
        """What an elastic restart asks (ddlkit.launch.elastic): how many of the job's nodes are up
        -- None when the target cannot tell, never more than it has -- and the target for fewer
        nodes, whose jobs have as many fewer ranks."""
        spec = JobSpec(name="contract-nodes", job_dir=tmp_path)
        up = target.nodes_up(spec)
        assert up is None or 0 <= up <= target.nodes
        assert 1 <= target.min_nodes <= target.nodes
        if up and target.nodes > 1:
            assert target.with_nodes(1, spec).world_size == target.world_size // target.nodes

    def test_success_streams_output(self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path) -> None:
        handle = self.submit(
            target,
            handles,
            tmp_path / "ok",
            """
            import os
            print("hello from", os.environ["DDLKIT_CONTRACT_VALUE"], flush=True)
            print("second line")
        """,
            env={"DDLKIT_CONTRACT_VALUE": "the-spec-env"},
        )
        output = "".join(handle.logs(follow=True))
        assert "hello from the-spec-env" in output
        assert "second line" in output
        status = handle.wait(timeout=self.timeout_s)
        assert (status.state, status.exit_code) == (JobState.SUCCEEDED, 0)
        assert handle.status().state is JobState.SUCCEEDED

    def test_job_runs_in_its_job_directory_and_its_files_come_back(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        job_dir = tmp_path / "files"
        handle = self.submit(
            target,
            handles,
            job_dir,
            f"""
            import json
            job = json.load(open({JOB_FILE!r}))           # relative: the job directory is the cwd
            with open("written-by-the-job.txt", "w") as f:
                f.write(job["contract"])
        """,
        )
        assert handle.wait(timeout=self.timeout_s).state is JobState.SUCCEEDED
        handle.collect()
        assert (job_dir / "written-by-the-job.txt").read_text() == "the job file"

    def test_secret_env_reaches_the_job_and_no_file(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        secret = f"s3cr3t-{uuid.uuid4().hex}"
        job_dir = tmp_path / "secret"
        handle = self.submit(
            target,
            handles,
            job_dir,
            """
            import hashlib, os
            print("digest", hashlib.sha256(os.environ["DDLKIT_CONTRACT_SECRET"].encode()).hexdigest())
        """,
            secret_env={"DDLKIT_CONTRACT_SECRET": secret},
        )
        output = "".join(handle.logs(follow=True))
        assert handle.wait(timeout=self.timeout_s).state is JobState.SUCCEEDED
        assert f"digest {hashlib.sha256(secret.encode()).hexdigest()}" in output
        handle.collect()
        leaked = [p for p in job_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
        assert not leaked, f"the secret was written to {leaked}"

    def test_failure_reports_exit_code_and_last_lines(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        handle = self.submit(
            target,
            handles,
            tmp_path / "fail",
            """
            import sys
            print("step 1 fine")
            print("boom: the disk is on fire", flush=True)
            sys.exit(3)
        """,
        )
        status = handle.wait(timeout=self.timeout_s)
        assert status.state is JobState.FAILED
        assert status.exit_code == 3
        assert "boom: the disk is on fire" in status.message

    def test_wait_with_timeout_returns_while_running(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        handle = self.submit(target, handles, tmp_path / "slow", "import time; time.sleep(60)")
        t0 = time.monotonic()
        status = handle.wait(timeout=0.2)
        assert not status.state.done
        assert time.monotonic() - t0 < 5

    def test_cancel_ends_the_job_and_its_processes(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        handle = self.submit(
            target,
            handles,
            tmp_path / "cancel",
            """
            import os, subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            print(f"ready {os.getpid()} {child.pid}", flush=True)
            time.sleep(60)
        """,
        )
        seen = ""
        for chunk in handle.logs(follow=True):
            seen += chunk
            if "ready" in seen and "\n" in seen.split("ready", 1)[1]:
                break
        assert "ready" in seen, f"the job ended before it was ready; output: {seen!r}"
        t0 = time.monotonic()
        handle.cancel()
        handle.cancel()  # idempotent
        status = handle.wait(timeout=self.cancel_timeout_s)
        assert status.state is JobState.CANCELLED, status
        assert time.monotonic() - t0 < self.cancel_timeout_s
        if self.local_processes:
            pids = [int(p) for p in seen.split("ready", 1)[1].split()[:2]]
            wait_for(
                lambda: not any(alive(p) for p in pids),
                "the job's processes to end after cancel()",
                timeout=5,
                detail=lambda: f"still running: {[p for p in pids if alive(p)]}",
            )

    def test_cancel_after_completion_changes_nothing(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        handle = self.submit(target, handles, tmp_path / "done", "print('done')")
        assert handle.wait(timeout=self.timeout_s).state is JobState.SUCCEEDED
        handle.cancel()
        assert handle.wait(timeout=self.timeout_s).state is JobState.SUCCEEDED

    def test_attach_follows_a_running_job_from_its_start(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        job_dir = tmp_path / "attach"
        handle = self.submit(
            target,
            handles,
            job_dir,
            """
            import time
            print("first", flush=True)
            time.sleep(1.5)
            print("second", flush=True)
        """,
        )
        again = target.attach(handle.id, job_dir=job_dir)
        assert again.id == handle.id
        output = "".join(again.logs(follow=True))
        assert "first" in output and "second" in output, output
        assert again.wait(timeout=self.timeout_s).state is JobState.SUCCEEDED
        assert handle.wait(timeout=self.timeout_s).state is JobState.SUCCEEDED

    def test_attach_to_an_ended_job_reports_its_end(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        job_dir = tmp_path / "ended"
        handle = self.submit(target, handles, job_dir, "import sys; print('bye', flush=True); sys.exit(4)")
        assert handle.wait(timeout=self.timeout_s).state is JobState.FAILED
        status = target.attach(handle.id, job_dir=job_dir).wait(timeout=self.timeout_s)
        assert (status.state, status.exit_code) == (JobState.FAILED, 4)

    def test_plan_describes_the_job_without_running_it(self, target: ComputeTarget, tmp_path: Path) -> None:
        spec = JobSpec(
            name="contract-plan",
            job_dir=tmp_path / "plan",
            args=("-c", "print('never')"),
            secret_env={"DDLKIT_CONTRACT_SECRET": "never-printed"},
        )
        text = target.plan(spec)
        assert isinstance(text, str) and text
        assert "never-printed" not in text
        assert not (tmp_path / "plan").exists()

    # ------------------------------------------------------------ how a job ended: whose failure it was
    # The restart policy (ddlkit.compute.restarts.classify) restarts what the infrastructure ended and
    # never what the job's own code did; these cases check that a target's status says which.

    def ended(self, handle: JobHandle, timeout: float | None = None) -> JobStatus:
        status = handle.wait(timeout=self.timeout_s if timeout is None else timeout)
        assert status.state.done, f"the job did not end in time: {status}"
        return status

    def wait_until_ready(self, handle: JobHandle) -> None:
        seen = ""
        for chunk in handle.logs(follow=True):
            seen += chunk
            if "ready" in seen and "\n" in seen.split("ready", 1)[1]:
                return
        pytest.fail(f"the job ended before it was ready; output: {seen!r}")

    def test_a_rank_killed_first_is_the_infrastructures_failure(
        self, multi_rank_target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        """Rank 1 is killed (SIGKILL: a lost node, an OOM killer); the other ranks then find it gone.
        The job ends as rank 1 did, and is restarted."""
        handle = self.submit(
            multi_rank_target,
            handles,
            tmp_path / "killed",
            f"""
            {_RANK_PROLOGUE}
            if rank == 1:
                print("rank 1: about to be killed from outside", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            signal.signal(signal.SIGTERM, lambda *_: exec({_lost(1)!r}.format(rank=rank)))
            wait_for_record(1)
            exec({_lost(1)!r}.format(rank=rank))
        """,
        )
        status = self.ended(handle)
        assert (status.state, status.exit_code) in {(JobState.FAILED, -9), (JobState.FAILED, 128 + 9)}, status
        assert re.search(r"\brank 1\b[^;]*\bfirst\b", status.message.splitlines()[0]), status.message
        verdict = classify(status)
        assert verdict.restart, (verdict, status)

    def test_a_ranks_own_error_wins_over_the_peer_that_found_it_gone(
        self, multi_rank_target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        """Rank 0 fails with an error of its own (exit 1); the other ranks report a lost peer
        (``EXIT_LOST_PEER``, naming rank 0). The job ends as rank 0 did, and is not restarted."""
        handle = self.submit(
            multi_rank_target,
            handles,
            tmp_path / "own-error",
            f"""
            {_RANK_PROLOGUE}
            if rank == 0:
                print("rank 0: step 3", flush=True)
                raise RuntimeError("rank 0's own error: the batch has no labels")
            signal.signal(signal.SIGTERM, lambda *_: exec({_lost(0)!r}.format(rank=rank)))
            wait_for_record(0)
            exec({_lost(0)!r}.format(rank=rank))
        """,
        )
        status = self.ended(handle)
        assert (status.state, status.exit_code) == (JobState.FAILED, 1), status
        assert re.search(r"\brank 0\b[^;]*\bfirst\b", status.message.splitlines()[0]), status.message
        assert "RuntimeError: rank 0's own error" in status.message, status.message
        verdict = classify(status)
        assert not verdict.restart, (verdict, status)

    def test_a_cancel_wins_over_the_ranks_failures(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        """A cancelled job whose ranks then end with errors of their own was cancelled."""
        handle = self.submit(
            target,
            handles,
            tmp_path / "cancel-fails",
            f"""
            {_READY_PROLOGUE}
            def stop(*_):
                print("stopping with an error", file=sys.stderr, flush=True)
                sys.exit(3)
            signal.signal(signal.SIGTERM, stop)
            ready()
            time.sleep(60)
        """,
        )
        self.wait_until_ready(handle)
        handle.cancel()
        status = self.ended(handle, self.cancel_timeout_s)
        assert status.state is JobState.CANCELLED, status
        assert not classify(status).restart

    def test_ranks_that_checkpointed_and_stopped_are_resumable(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        """Every rank stops on notice after a checkpoint (``EXIT_PREEMPTED``): the job is restarted."""
        handle = self.submit(
            target,
            handles,
            tmp_path / "notice",
            f"""
            import sys
            print("checkpoint saved at step 7; stopping on notice", flush=True)
            sys.exit({EXIT_PREEMPTED})
        """,
        )
        status = self.ended(handle)
        assert (status.state, status.exit_code) == (JobState.FAILED, EXIT_PREEMPTED), status
        assert "checkpointed and stopped" in status.message, status.message
        verdict = classify(status)
        assert verdict.restart, (verdict, status)

    def test_a_cancelled_job_that_checkpointed_says_so(
        self, target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        """``cancel`` is the ranks' stop request: they checkpoint and exit ``EXIT_PREEMPTED``. The job
        was cancelled (not restarted), and its message says that it can resume."""
        handle = self.submit(
            target,
            handles,
            tmp_path / "cancel-saved",
            f"""
            {_READY_PROLOGUE}
            asked = []
            signal.signal(signal.SIGTERM, lambda *_: asked.append(1))  # as the worker: stop at the next step
            ready()
            deadline = time.monotonic() + 60
            while not asked and time.monotonic() < deadline:
                time.sleep(0.05)  # a training step
            if not asked:
                sys.exit(1)
            time.sleep(0.2)  # the checkpoint
            print("checkpoint saved at step 7", flush=True)
            sys.exit({EXIT_PREEMPTED})
        """,
        )
        self.wait_until_ready(handle)
        handle.cancel()
        status = self.ended(handle, self.cancel_timeout_s)
        assert (status.state, status.exit_code) == (JobState.CANCELLED, EXIT_PREEMPTED), status
        assert "checkpointed and stopped" in status.message, status.message
        assert not classify(status).restart

    def test_the_ranks_records_win_over_the_scheduler(
        self, multi_rank_target: ComputeTarget, handles: list[JobHandle], tmp_path: Path
    ) -> None:
        """Rank 1 fails with an error of its own; rank 0 is killed after it (SIGKILL), which is what
        a scheduler that reports one process, or the last, sees. The ranks' records say who failed
        first: the job ends as rank 1 did (not restarted), with the scheduler's reason in its message."""
        handle = self.submit(
            multi_rank_target,
            handles,
            tmp_path / "disagree",
            f"""
            {_RANK_PROLOGUE}
            if rank == 1:
                print("rank 1: the batch is bad", file=sys.stderr, flush=True)
                sys.exit(3)
            signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
            wait_for_record(1)
            os.kill(os.getpid(), signal.SIGKILL)
        """,
        )
        status = self.ended(handle)
        assert (status.state, status.exit_code) == (JobState.FAILED, 3), status
        assert re.search(r"\brank 1\b[^;]*\bfirst\b", status.message.splitlines()[0]), status.message
        assert not classify(status).restart, status
        if isinstance(handle, SchedulerJob):
            seen = handle.observe(fresh=True)
            assert seen.reason in status.message, (seen, status)


#: the start of a rank's code in the cases of how a job ended: its rank (under mpirun, OpenMPI's
#: variable: the MPI targets' and Batch AI's ranks have no RANK), and a wait for a peer's exit record
#: (where the ranks share the job directory; else a few seconds)
_RANK_PROLOGUE = f"""import os, signal, sys, time
            rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["RANK"])  # as DistContext reads it
            def wait_for_record(peer, seconds=5.0):
                deadline = time.monotonic() + seconds
                path = {rank_record("{peer}")!r}.replace("{{peer}}", str(peer))
                while not os.path.exists(path) and time.monotonic() < deadline:
                    time.sleep(0.05)"""

#: the start of a rank's code in the cases of a cancel: ``ready()`` says "ready" on rank 0 once every
#: rank has its SIGTERM handler (where the ranks share the job directory; else after a few seconds):
#: a rank still starting when the cancel comes would be killed by it
_READY_PROLOGUE = """import os, signal, sys, time
            rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK") or 0)
            world = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
            def ready(seconds=5.0):
                open(f"ready-{rank}", "w").close()
                deadline = time.monotonic() + seconds
                while rank == 0 and time.monotonic() < deadline:
                    if all(os.path.exists(f"ready-{r}") for r in range(world)):
                        break
                    time.sleep(0.05)
                print("ready", flush=True)"""


def _lost(peer: int) -> str:
    """The code of a rank that finds rank ``peer`` gone (``EXIT_LOST_PEER``), for ``exec`` once
    ``.format(rank=rank)`` names the rank that found it."""
    return LOST_PEER.format(rank="{rank}", peer=peer, how="left the job")


# ---------------------------------------------------------------------------- frameworks
class FrameworkContract:
    """Set :attr:`framework`, :attr:`plugin` and :attr:`model_file`; the suite trains in this
    process (``run_inprocess``), so keep :attr:`overrides` tiny."""

    #: the registered name (``framework=<name>``)
    framework: ClassVar[str]
    #: the module holding the plugin's hook implementations (its entry-point target)
    plugin: ClassVar[str]
    #: the file ``run.save_artifact`` writes the final weights to
    model_file: ClassVar[str]
    #: the keys the plugin adds to result.json through ``run.extra_result``, beyond
    #: ``ddlkit.result.FIELDS`` (documented in its README): any other key fails the suite
    extra_result_keys: ClassVar[frozenset[str]] = frozenset()
    #: settings that make a run take seconds: here 2 epochs of 5 steps, a log line every 2 steps
    overrides: ClassVar[tuple[str, ...]] = (
        "data.image_size=32",
        "data.num_classes=10",
        "data.length=80",
        "data.val_length=16",
        "trainer.batch_size=16",
        "trainer.epochs=2",
        "trainer.log_every=2",
        "trainer.warmup_steps=1",
        "trainer.deterministic=true",
    )

    def assert_same_weights(self, a: Path, b: Path) -> None:
        """Fail unless the weight files ``a`` and ``b`` hold equal weights; the default compares
        bytes, override it for formats that embed timestamps."""
        assert a.read_bytes() == b.read_bytes(), f"{a} and {b} differ"

    @pytest.fixture
    def train(self, ddlkit_pm: DdlkitPluginManager, run_inprocess: Any) -> Any:
        """``train(*more_overrides, job_dir=None)``: a run of this framework; fails unless it exits 0."""
        add_plugin(ddlkit_pm, importlib.import_module(self.plugin))

        def run(*more: str, job_dir: Path | None = None) -> WorkerOutcome:
            out = run_inprocess(f"framework={self.framework}", *self.overrides, *more, job_dir=job_dir)
            assert (out.exit_code, out.status) == (0, "completed"), "the run failed; see the captured stderr"
            return out

        return run

    def test_trains_and_reports_through_the_run(self, train: Any, hook_recorder: HookRecorder) -> None:
        out = train()
        steps_per_epoch, epochs = out.run.steps_per_epoch, out.run.cfg.trainer.epochs
        result = out.result
        assert (result["framework"], result["steps"], result["epochs"]) == (
            self.framework,
            steps_per_epoch * epochs,
            epochs,
        )
        assert math.isfinite(result["final_loss"])
        assert 0 <= result["top1"] <= result["top5"] <= 1
        log_every = out.run.cfg.trainer.log_every
        assert [c["step"] for c in hook_recorder.getcalls("ddlkit_step_end")] == [
            s for s in range(1, steps_per_epoch * epochs + 1) if s % log_every == 0 or s == steps_per_epoch * epochs
        ]
        assert [c["epoch"] for c in hook_recorder.getcalls("ddlkit_epoch_end")] == list(range(1, epochs + 1))
        assert len(hook_recorder.getcalls("ddlkit_run_start")) == 1, "call run.start() once, before the first step"
        assert (out.job_dir / self.model_file).is_file()

    def test_result_json_has_the_fields_of_ddlkit_result(self, train: Any) -> None:
        """One result schema for every framework: each field of the table, of its type, the ones the
        framework reports set, and no key beyond the table but the plugin's declared extras."""
        result = train().result  # as result.json holds it
        assert result_schema.NAMES - result.keys() == set(), "result.json lacks fields of ddlkit.result.FIELDS"
        undeclared = result.keys() - result_schema.NAMES - self.extra_result_keys
        assert undeclared == set(), "result.json has keys that neither ddlkit.result.FIELDS nor extra_result_keys has"
        wrong = {
            f.name: type(result[f.name]).__name__
            for f in result_schema.FIELDS
            if result[f.name] is not None and not isinstance(result[f.name], f.type)
        }
        assert wrong == {}, "values of another type than ddlkit.result.FIELDS says"
        unset = [f.name for f in result_schema.FRAMEWORK if result[f.name] is None]
        assert unset == [], "the framework left these fields unset (run.<field> = ...); see ddlkit.result"
        # a framework on a GPU reports its device's peak (run.device_peak_memory_mib), on the CPU the core measures
        expected = "device" if str(result["device"]).startswith("cuda") else "rss"
        assert (result["peak_memory"], result["peak_memory_mib"] > 0) == (expected, True), (
            f"peak_memory_mib={result['peak_memory_mib']} ({result['peak_memory']}) on {result['device']}"
        )

    def test_stops_at_max_steps(self, train: Any) -> None:
        out = train("trainer.max_steps=3")
        assert (out.result["steps"], out.run.state.step) == (3, 3)
        assert (out.job_dir / "checkpoints" / "step-00000003.ckpt").exists()

    def test_a_resumed_run_ends_with_the_same_weights(self, train: Any, tmp_path: Path) -> None:
        straight = train()
        stop = straight.run.steps_per_epoch + 2  # mid-way through the second epoch
        first = train(f"trainer.max_steps={stop}", job_dir=tmp_path / "resumed")
        assert first.result["steps"] == stop
        resumed = train(job_dir=tmp_path / "resumed")
        assert resumed.result["resumed_from_step"] == stop
        self.assert_same_weights(straight.job_dir / self.model_file, resumed.job_dir / self.model_file)
        assert resumed.result["final_loss"] == straight.result["final_loss"]
