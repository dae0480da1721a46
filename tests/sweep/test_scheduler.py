"""The sweep scheduler against scripted job handles: slots, failure policies, interruption. Time is
a clock of the test's own, which moves only when someone waits: the order, pace and slot counts
checked here are the same on a busy machine, and no test waits in real time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ddlkit import ConfigError, JobHandle, JobState, JobStatus
from ddlkit.launch.sweep.scheduler import Clock, Observer, Outcome, Scheduler, SweepJob
from ddlkit.launch.sweep.settings import FailurePolicy, SweepSettings
from ddlkit.launch.sweep.sweep import check_sweep_settings_fixed


class ScriptClock(Clock):
    """Starts at 1000 s and moves only by what is slept."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:  # type: ignore[override]
        return self.now

    def time(self) -> float:  # type: ignore[override]
        return self.now

    def sleep(self, seconds: float) -> None:  # type: ignore[override]
        self.now += seconds


class ScriptedHandle(JobHandle):
    """Runs for ``duration`` seconds, then ends with ``exit_code``; a cancel ends it at once (status 75)."""

    def __init__(
        self,
        clock: ScriptClock,
        log: list[tuple[str, int, float]],
        num: int,
        duration: float,
        exit_code: int,
        chunks: list[str],
    ) -> None:
        self.id, self.clock, self.log, self.num, self.exit_code = f"job-{num}", clock, log, num, exit_code
        self.ends_at = clock.monotonic() + duration
        self.chunks, self.cancelled = list(chunks), False
        log.append(("start", num, clock.monotonic()))

    def status(self) -> JobStatus:
        if self.cancelled:
            return JobStatus(JobState.CANCELLED, 75, "cancelled")
        if self.clock.monotonic() < self.ends_at:
            return JobStatus(JobState.RUNNING)
        if self.exit_code == 0:
            return JobStatus(JobState.SUCCEEDED, 0)
        return JobStatus(JobState.FAILED, self.exit_code, f"job {self.num} exited {self.exit_code}")

    def logs(self, follow: bool = True) -> Iterator[str]:
        while self.chunks:
            yield self.chunks.pop(0)

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> JobStatus:
        while not self.status().state.done:
            self.clock.sleep(0.005)
        self.log.append(("end", self.num, self.clock.monotonic()))
        return self.status()


class Jobs:
    """Jobs whose attempts run for scripted durations and end with scripted exit codes."""

    def __init__(self) -> None:
        self.clock = ScriptClock()
        self.log: list[tuple[str, int, float]] = []
        self.handles: list[ScriptedHandle] = []

    def make(
        self, num: int, duration: float = 0.02, exit_codes: tuple[int, ...] = (0,), chunks: tuple[str, ...] = ()
    ) -> SweepJob:
        attempts = iter(exit_codes)

        def start() -> JobHandle:
            handle = ScriptedHandle(self.clock, self.log, num, duration, next(attempts), list(chunks))
            self.handles.append(handle)
            return handle

        return SweepJob(num, f"x={num}", start)

    def starts(self) -> list[int]:
        return [num for kind, num, _ in self.log if kind == "start"]

    def max_in_flight(self) -> int:
        now = peak = 0
        for kind, _, _ in sorted(self.log, key=lambda e: (e[2], e[0] == "start")):
            now += 1 if kind == "start" else -1
            peak = max(peak, now)
        return peak

    def time_of(self, kind: str, num: int) -> float:
        return next(t for k, n, t in self.log if k == kind and n == num)


def run(
    jobs: Jobs,
    sweep: list[SweepJob],
    policy: FailurePolicy | None = None,
    max_parallel: int = 2,
    observer: Observer | None = None,
) -> dict[int, Outcome]:
    return (
        Scheduler(max_parallel, policy or FailurePolicy(), status_interval_s=0.005, observer=observer, clock=jobs.clock)
        .run(sweep)
        .outcomes
    )


def test_keeps_max_parallel_in_flight_and_starts_a_job_as_soon_as_a_slot_frees() -> None:
    jobs = Jobs()
    outcomes = run(jobs, [jobs.make(0, duration=0.4), *(jobs.make(n, duration=0.05) for n in range(1, 5))])
    assert {n: o.state for n, o in outcomes.items()} == dict.fromkeys(range(5), "completed")
    assert jobs.max_in_flight() == 2
    # not batch by batch: jobs 2..4 ran one after another in the slot job 1 freed, while job 0 was still running
    assert jobs.time_of("start", 4) < jobs.time_of("end", 0)
    assert jobs.starts() == [0, 1, 2, 3, 4]


def test_max_parallel_1_runs_one_job_at_a_time() -> None:
    jobs = Jobs()
    run(jobs, [jobs.make(n) for n in range(3)], max_parallel=1)
    assert jobs.max_in_flight() == 1


def test_keep_going_runs_every_job_and_reports_the_failure() -> None:
    jobs = Jobs()
    outcomes = run(jobs, [jobs.make(0), jobs.make(1, exit_codes=(3,)), jobs.make(2), jobs.make(3)])
    assert {n: o.state for n, o in outcomes.items()} == {0: "completed", 1: "failed", 2: "completed", 3: "completed"}
    assert (outcomes[1].exit_code, outcomes[1].message, outcomes[1].attempts) == (3, "job 1 exited 3", 1)
    assert outcomes[0].ended >= outcomes[0].started >= outcomes[0].submitted
    assert outcomes[0].duration_s > 0


def test_fail_fast_cancels_the_running_jobs_and_starts_no_other() -> None:
    jobs = Jobs()
    sweep = Scheduler(2, FailurePolicy(stop_on_failure=True), status_interval_s=0.005, clock=jobs.clock).run(
        [jobs.make(0, duration=0.05, exit_codes=(1,)), jobs.make(1, duration=5.0), jobs.make(2), jobs.make(3)]
    )
    assert {n: o.state for n, o in sweep.outcomes.items()} == {0: "failed", 1: "cancelled", 2: "pending", 3: "pending"}
    assert sweep.stopped_by == 0
    assert jobs.starts() == [0, 1]
    assert jobs.handles[1].cancelled


def test_retry_reruns_a_failed_job_first_in_line() -> None:
    jobs = Jobs()
    outcomes = run(
        jobs,
        [jobs.make(0, exit_codes=(1, 0)), jobs.make(1, exit_codes=(2, 2, 2)), jobs.make(2)],
        policy=FailurePolicy(retries=2),
        max_parallel=1,
    )
    assert (outcomes[0].state, outcomes[0].attempts) == ("completed", 2)
    assert (outcomes[1].state, outcomes[1].attempts, outcomes[1].exit_code) == ("failed", 3, 2)
    assert jobs.starts() == [0, 0, 1, 1, 1, 2]


def test_a_job_that_cannot_start_counts_as_failed() -> None:
    def refuse() -> JobHandle:
        raise ConfigError("trainer.resume=true but there is no checkpoint")

    jobs = Jobs()
    outcomes = run(jobs, [SweepJob(0, "x=0", refuse), jobs.make(1)])
    assert (outcomes[0].state, outcomes[0].message) == (
        "failed",
        "could not start: trainer.resume=true but there is no checkpoint",
    )
    assert outcomes[1].state == "completed"


def test_each_job_is_polled_at_its_targets_pace_and_its_logs_are_not_read() -> None:
    """A remote target's API is not asked every 50 ms: a job is polled at its own interval."""
    jobs = Jobs()
    calls = {0: 0, 1: 0}

    def counted(job: SweepJob) -> SweepJob:
        def start() -> JobHandle:
            handle = job.start()
            status = handle.status

            def counting() -> JobStatus:
                calls[job.num] += 1
                return status()

            handle.status = counting  # type: ignore[method-assign]
            return handle

        return SweepJob(job.num, job.label, start, status_interval_s=job.status_interval_s)

    slow, fast = jobs.make(0, duration=0.6, chunks=("a\n",)), jobs.make(1, duration=0.6)
    outcomes = run(
        jobs,
        [
            counted(SweepJob(0, slow.label, slow.start, status_interval_s=0.25)),
            counted(SweepJob(1, fast.label, fast.start, status_interval_s=0.01)),
        ],
        max_parallel=2,
    )
    assert outcomes[0].state == outcomes[1].state == "completed"
    assert calls[0] <= 0.6 / 0.25 + 3, calls  # 3 polls, and the 2 status calls of the scripted wait()
    assert calls[1] > 3 * calls[0], calls  # the fast job's pace is its own
    assert jobs.handles[0].chunks == ["a\n"]  # nobody read the log: the target keeps it


def test_an_interrupt_cancels_and_waits_for_the_running_jobs() -> None:
    class CtrlC(Observer):
        def started(self, job: SweepJob, outcome: Outcome) -> None:
            if job.num == 1:
                raise KeyboardInterrupt

    jobs = Jobs()
    sweep = Scheduler(1, FailurePolicy(), status_interval_s=0.005, observer=CtrlC(), clock=jobs.clock).run(
        [jobs.make(0), jobs.make(1, duration=5.0), jobs.make(2)]
    )
    assert sweep.interrupted
    assert {n: o.state for n, o in sweep.outcomes.items()} == {0: "completed", 1: "interrupted", 2: "pending"}
    assert jobs.handles[1].cancelled and jobs.starts() == [0, 1]


def test_the_observer_hears_every_start_and_end() -> None:
    class Record(Observer):
        def __init__(self) -> None:
            self.events: list[tuple[str, int, str, bool]] = []

        def started(self, job: SweepJob, outcome: Outcome) -> None:
            self.events.append(("started", job.num, outcome.state, False))

        def ended(self, job: SweepJob, outcome: Outcome, *, will_retry: bool) -> None:
            self.events.append(("ended", job.num, outcome.state, will_retry))

    jobs, observer = Jobs(), Record()
    run(jobs, [jobs.make(0, exit_codes=(1, 0))], policy=FailurePolicy(retries=1), observer=observer)
    assert observer.events == [
        ("started", 0, "running", False),
        ("ended", 0, "failed", True),
        ("started", 0, "running", False),
        ("ended", 0, "completed", False),
    ]


@pytest.mark.parametrize(
    "text, policy",
    [
        ("keep-going", FailurePolicy()),
        ("fail-fast", FailurePolicy(stop_on_failure=True)),
        ("retry:3", FailurePolicy(retries=3)),
    ],
)
def test_on_failure_values(text: str, policy: FailurePolicy) -> None:
    assert FailurePolicy.parse(text) == policy
    assert str(policy) == text


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            SweepSettings(on_failure="retry"),
            "sweep.on_failure=retry is invalid: it must be keep-going, fail-fast or "
            "retry:N (N a whole number, e.g. retry:2).",
        ),
        (SweepSettings(max_parallel=0), "sweep.max_parallel=0 is invalid: it must be a positive integer."),
        (
            SweepSettings(sort_by="loss"),
            "sweep.sort_by=loss is invalid: it must be one of best_top1, final_loss, images_per_sec, duration_s.",
        ),
    ],
)
def test_bad_settings_are_config_errors_naming_the_key(settings: SweepSettings, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings.policy("sweep")
    assert str(info.value) == message


def test_the_sweep_settings_cannot_vary_within_a_sweep() -> None:
    check_sweep_settings_fixed([["a=1", "sweep.on_failure=fail-fast"], ["a=2", "sweep.on_failure=fail-fast"]])
    with pytest.raises(ConfigError) as info:
        check_sweep_settings_fixed([["sweep.max_parallel=1", "a=1"], ["sweep.max_parallel=2", "a=1"]])
    assert str(info.value) == (
        "sweep.max_parallel cannot vary within a sweep: it configures the sweep itself. Give it one value."
    )
