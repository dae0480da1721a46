"""compute=ray on a real Ray cluster (see conftest.py): the compute contract, ``ddlkit plan``, the one-line errors,
training runs on two simulated nodes, the user's code shipped, a sweep, detach/attach, cancel with a checkpoint,
the requests a followed job costs the dashboard, a lost node, a restart that waits for capacity until a node joins,
and an elastic job (compute.min_nodes) that goes on with the nodes left or, with too few after its wait for
capacity, says so in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import ddlkit
from ddlkit import JobSpec
from ddlkit.testing import FAKES_MODULE, RunFactory, interruptible, rank_rows, wait_for
from ddlkit.testing.contracts import ComputeTargetContract
from ddlkit.testing.core import PLANNED_WORLD_SIZE_ENV, checkpoint_step, latest_checkpoint, verify
from ddlkit.testing.elastic import assert_every_sample_once, restarts
from ddlkit.testing.images import make_image_dataset
from ddlkit_ray.target import RayConfig, RayTarget, node_file
from ddlkit_ray.testing import CountingProxy, free_port


def needs_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install 'ray[default]'")


def ray_target(address: str, **options: object) -> RayTarget:
    return RayTarget(
        RayConfig(
            **{
                "address": address,
                "poll_interval_s": 0.3,
                "grace_period_s": 10.0,
                "placement_timeout_s": 60.0,
                **options,
            }
        )
    )


# ---------------------------------------------------------------------------- the contract
@pytest.mark.slow
def test_a_relative_data_root_with_storage_nfs_is_read_below_the_share_on_every_node(
    ray_cluster, tmp_path: Path
) -> None:
    """Issue 37, item 14: the ranks of a target that does not share the launcher's disk listed a
    relative ``data.root`` from where they ran ("data.root=imgs is not a directory on this node")
    before the storage put it below its mount point."""
    share = tmp_path / "share"  # mounted at the same path on every node: here, one disk
    (tmp_path / "project").mkdir()
    make_image_dataset(share / "imgs", classes=2, train_per_class=8, val_per_class=2)
    outcome = RunFactory(tmp_path / "project")(
        *ray_args(ray_cluster.address, "compute.nodes=2"),
        "dist=native",
        "data=imagefolder",
        "data.root=imgs",
        "data.image_size=8",
        "data.workers=0",
        "storage=nfs",
        f"storage.root={share}",
        "trainer.batch_size=4",
        "trainer.epochs=1",
        job_dir=tmp_path / "job",
        timeout=240,
    ).assert_success()
    assert outcome.result["steps"] == 2 and outcome.result["world_size"] == 2  # 16 images, 2 x 4 a step
    assert json.loads((outcome.job_dir / "job.json").read_text())["config"]["data"]["root"] == "imgs"


@pytest.mark.slow
class TestRayContract(ComputeTargetContract):
    # a Ray job: the working_dir uploaded, the runtime environment set up, the driver and an actor started
    timeout_s = 120.0
    cancel_timeout_s = 60.0

    @pytest.fixture
    def target(self, ray_cluster) -> RayTarget:
        return ray_target(ray_cluster.address)

    @pytest.fixture
    def multi_rank_target(self, ray_cluster) -> RayTarget:
        return ray_target(ray_cluster.address, nodes=2)  # a rank on each of the cluster's two nodes


#: a job that lasts: the fake framework sleeps this long per step (80 steps by default)
SLOW = ("framework.step_delay_s=0.25",)


def ray_args(address: str, *more: str) -> tuple[str, ...]:
    return (
        "compute=ray",
        f"compute.address={address}",
        "compute.poll_interval_s=0.3",
        "compute.grace_period_s=15",
        "compute.placement_timeout_s=60",
        *more,
    )


def submission(job_dir: Path) -> dict:
    return json.loads((job_dir / ".ddlkit" / "submission.json").read_text())


def follow_until(
    address: str,
    job_dir: Path,
    text: str,
    timeout: float = 120,
    launcher: subprocess.Popen | None = None,
    after: str = "",
) -> str:
    """The job's output (through the Jobs API) until ``text`` appears in it (after ``after``)."""
    wait_for(
        lambda: (job_dir / ".ddlkit" / "submission.json").is_file(),
        "the job's submission",
        timeout=timeout,
        process=launcher,
    )
    handle = ray_target(address).attach(submission(job_dir)["id"], job_dir=job_dir)
    seen, deadline = "", time.monotonic() + timeout
    for chunk in handle.logs(follow=True):
        seen += chunk
        if text in (seen.partition(after)[2] if after else seen):
            return seen
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s: {seen[-2000:]}"
    raise AssertionError(f"the job ended before {text!r}: {seen[-2000:]}")


# ---------------------------------------------------------------------------- no cluster needed
def test_plan_prints_the_submission_with_secrets_hidden(tmp_path: Path) -> None:
    target = ray_target(
        "http://head.example:8265",
        nodes=2,
        procs_per_node=2,
        cpus_per_rank=4,
        gpus_per_rank=1,
        runtime_env={"pip": ["einops"]},
    )
    spec = JobSpec(
        name="job-1",
        job_dir=tmp_path / "never",
        env={"DDLKIT_PLUGINS": "x"},
        secret_env={"DDLKIT_SECRET_KEY": "hunter2"},
    )
    text = target.plan(spec)
    # never in the runtime environment (Ray logs it on every node): named, in the file that carries them
    assert "hunter2" not in text and "DDLKIT_SECRET_KEY" not in target.runtime_env(spec)["env_vars"]
    assert (
        "# secrets: DDLKIT_SECRET_KEY, in .ddlkit-ray-secrets.json in the working_dir (the driver reads and "
        "removes it; never in the runtime environment)"
    ) in text
    assert "ray job submit --address=http://head.example:8265" in text
    assert "-- python -m ddlkit_ray.driver ray-job.json\n" in text
    assert (
        'placement group (STRICT_SPREAD): 2 bundle(s) {"CPU": 8, "GPU": 2}, one per node; 2 rank actor(s) '
        "per bundle, 4 rank(s)" in text
    )
    assert '"pip": ["einops"]' in text and '"working_dir": ' in text
    assert target.world_size == 4
    assert not (tmp_path / "never").exists()


def test_plan_on_the_command_line_needs_no_cluster(run_factory: RunFactory) -> None:
    outcome = run_factory.cli(
        "plan",
        "framework=fake",
        "compute=ray",
        "compute.address=http://nowhere.invalid:8265",
        "compute.nodes=2",
        "dist=native",
    ).assert_success()
    assert "ray job submit --address=http://nowhere.invalid:8265" in outcome.stdout
    assert "STRICT_SPREAD" in outcome.stdout and "ddlkit_ray.driver" in outcome.stdout
    more = run_factory.cli(
        "plan", "framework=fake", "compute=ray", "+compute.runtime_env.pip=[einops]"
    ).assert_success()
    assert '"pip": ["einops"]' in more.stdout, more.output


def test_sharded_training_over_nodes_that_share_no_disk_is_refused_in_the_plan(run_factory: RunFactory) -> None:
    args = ("plan", "framework=fake", "compute=ray", "compute.address=http://nowhere.invalid:8265", "dist=fsdp")
    run_factory.cli(*args, "compute.nodes=2").assert_one_line_error(
        "compute=ray with compute.nodes=2 cannot train dist=fsdp", "dist=native, compute.nodes=1"
    )
    assert "ray job submit" in run_factory.cli(*args, "compute.nodes=1").assert_success().stdout


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"nodes": 0}, "compute.nodes=0 is invalid"),
        ({"strategy": "EVERYWHERE"}, "compute.strategy=EVERYWHERE is invalid"),
        ({"runtime_env": {"working_dir": "/x"}}, "compute.runtime_env.working_dir is ddlkit's to set"),
    ],
)
def test_bad_options_are_config_errors(options: dict, fragment: str) -> None:
    with pytest.raises(ddlkit.ConfigError, match=re.escape(fragment)):
        ray_target("auto", **options)


def test_no_ray_installed_names_the_package(run_factory: RunFactory, tmp_path: Path) -> None:
    hidden = tmp_path / "no-ray"
    hidden.mkdir()
    # what Python says when the package is not installed, for every import of it
    (hidden / "ray.py").write_text("raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")
    outcome = run_factory(
        "compute=ray",
        "compute.address=http://127.0.0.1:9",
        env={"PYTHONPATH": f"{hidden}:{os.environ.get('PYTHONPATH', '')}"},
    )
    outcome.assert_one_line_error("compute=ray needs Ray's Python package on this machine: pip install 'ray[default]'")


def test_unreachable_cluster_names_the_address(run_factory: RunFactory) -> None:
    needs_ray()
    address = f"http://127.0.0.1:{free_port()}"
    run_factory("compute=ray", f"compute.address={address}", timeout=120).assert_one_line_error(
        f"compute=ray cannot reach a Ray cluster at compute.address={address}", "ray start --head"
    )


@pytest.mark.slow
def test_a_cluster_with_token_authentication_takes_its_token_and_refuses_none_or_a_wrong_one(
    run_factory: RunFactory, tmp_path: Path
) -> None:
    """Ray's token authentication, on wherever a token exists when ``ray start --head`` runs (any
    local ``ray.init()`` writes ``~/.ray/auth_token``): the launcher sends the token it finds
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) and the job trains; no token or a
    wrong one is one line naming the fix; the token is in no file of the job's and on no console."""
    needs_ray()
    import secrets

    from ddlkit_ray.testing import LocalRayCluster

    token = secrets.token_hex(32)
    home = tmp_path / "home"  # a machine with no ~/.ray/auth_token
    home.mkdir()
    env = {**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}
    with LocalRayCluster(nodes=1, cpus_per_node=1, token=token, env=env) as cluster:
        asks = f"the Ray cluster at compute.address={cluster.address} asks for its token"
        run_factory(*ray_args(cluster.address), env={"HOME": str(home)}, timeout=120).assert_one_line_error(
            asks, "none was found here", "~/.ray/auth_token", "RAY_AUTH_TOKEN"
        )
        wrong = {"HOME": str(home), "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        run_factory(*ray_args(cluster.address), env=wrong, timeout=120).assert_one_line_error(
            asks, "the token found here is not its token"
        )
        (home / ".ray").mkdir()
        (home / ".ray" / "auth_token").write_text(token)
        outcome = run_factory(*ray_args(cluster.address), env={"HOME": str(home)}, timeout=240).assert_success()
    assert outcome.result["status"] == "completed"
    leaks = [str(p) for p in outcome.job_dir.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaks == [] and token not in outcome.stdout + outcome.stderr


# ---------------------------------------------------------------------------- bad input, on the cluster
@pytest.mark.parametrize(
    ("more", "fragments"),
    [
        (
            ("compute.nodes=3",),
            ("asks for 3 node(s) with 1 CPU, 0 GPU each", "has 2 such node(s) of 2", "lower compute.nodes"),
        ),
        (
            ("compute.cpus_per_rank=4",),
            ("asks for 1 node(s) with 4 CPU, 0 GPU each", "has 0 such node(s) of 2", "(1 CPU, 0 GPU; 1 CPU, 0 GPU)"),
        ),
        (("compute.gpus_per_rank=1",), ("asks for 1 node(s) with 1 CPU, 1 GPU each", "has 0 such node(s)")),
    ],
)
def test_too_few_resources_for_the_gang(
    ray_cluster, run_factory: RunFactory, more: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    run_factory(*ray_args(ray_cluster.address, *more), "dist=native", timeout=120).assert_one_line_error(*fragments)


# ---------------------------------------------------------------------------- real training jobs
@pytest.mark.slow
def test_two_ranks_on_two_nodes(ray_cluster, run_factory: RunFactory) -> None:
    outcome = run_factory(
        *ray_args(ray_cluster.address, "compute.nodes=2"), "dist=native", timeout=240
    ).assert_success()
    assert outcome.result["status"] == "completed" and outcome.result["world_size"] == 2
    assert "train epoch" in outcome.stdout  # rank 0's output, streamed through the Ray job's log
    started = re.search(r"ddlkit-ray: 2 rank\(s\) started on node\(s\) 0 \((\w+)\), 1 \((\w+)\)", outcome.stdout)
    assert started and started[1] != started[2], outcome.stdout  # one rank per node
    job_dir = outcome.job_dir
    for rank in range(2):  # what each node's rank wrote came back
        assert (job_dir / f"rank-{rank}.log").is_file()
        assert json.loads((job_dir / f".ranks/rank-{rank}.json").read_text())["code"] == 0
    assert "train epoch" in (job_dir / "rank-0.log").read_text()
    assert list((job_dir / "checkpoints").glob("*.ckpt"))
    assert json.loads((job_dir / ".ddlkit/ray-exit.json").read_text())["code"] == 0
    assert not (job_dir / "code").exists()  # nothing to ship: the fakes are installed


@pytest.mark.slow
def test_each_nodes_telemetry_traces_and_one_mlflow_run_come_back(ray_cluster, run_factory: RunFactory) -> None:
    """Issue 42 on Ray: a PyTorch job of a rank on each node with trainer.profile and logger=mlflow.
    Each rank writes its trace into its node's copy of the job directory; the driver collects every
    rank's files when the job ends, so both traces, telemetry.json and metrics.jsonl's per-rank fields
    come back to the launcher; rank 0 logs the one MLflow run."""
    pytest.importorskip("ddlkit_pytorch")
    pytest.importorskip("ddlkit_mlflow")
    from ddlkit.testing.multirank import OBSERVED_JOB, OBSERVED_STEPS, assert_every_rank_seen
    from ddlkit_mlflow.testing import MlflowServer, runs_of, steps

    (run_factory.base_dir / "mlflow").mkdir(parents=True)
    with MlflowServer(run_factory.base_dir / "mlflow") as server:
        outcome = run_factory(
            *ray_args(ray_cluster.address, "compute.nodes=2"),
            *OBSERVED_JOB,
            f"logger.mlflow.tracking_uri={server.uri}",
            "logger.mlflow.experiment=on-ray",
            timeout=240,
        ).assert_success()
        runs = runs_of(server.uri, "on-ray")
        history = {
            key: [step for step, _ in steps(server.uri, runs[0].info.run_id, key)]
            for key in ("train/loss", "train/rank0/images_per_sec", "train/rank1/images_per_sec")
        }
    job_dir = outcome.job_dir
    started = re.search(r"ddlkit-ray: 2 rank\(s\) started on node\(s\) 0 \((\w+)\), 1 \((\w+)\)", outcome.stdout)
    assert started and started[1] != started[2], outcome.stdout  # one rank per node: rank 1's files were elsewhere
    assert len(runs) == 1 and (runs[0].info.status, runs[0].data.tags["ddlkit.compute"]) == ("FINISHED", "ray")
    assert history == dict.fromkeys(history, OBSERVED_STEPS), history
    telemetry = assert_every_rank_seen(job_dir)
    assert [r["node"] for r in telemetry["ranks"]] == [0, 1], telemetry
    status = run_factory.cli("jobs", "status", str(job_dir)).assert_success().stdout
    assert [row[:2] for row in rank_rows(status)] == [("0", "0"), ("1", "1")], status


@pytest.mark.slow
def test_a_stopped_rank_is_killed_not_counted_lost_and_the_stacks_come_back(ray_cluster, tmp_path: Path) -> None:
    """Issue 42 on Ray: rank 1 (on the other node) is stopped (SIGSTOP); rank 0 writes its stacks and names
    it, then fails waiting for it (dist.timeout_s). The driver kills the rank that does not stop -- its
    process, not its actor: the node was not lost, so the job ends as rank 0 failed, and every node's files
    come back, the stopped rank's log and the hang report among them."""
    import tempfile

    from ddlkit.testing.multirank import worker_pids

    job_dir = tmp_path / "hung"
    out = tmp_path / "launcher.out"
    with open(out, "w") as sink:
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddlkit",
                "framework=fake",
                "framework.step_delay_s=0.1",
                *ray_args(ray_cluster.address, "compute.nodes=2", "compute.grace_period_s=3"),
                "dist=native",
                "dist.warn_after_s=3",
                "dist.timeout_s=8",
                "restart.max_restarts=0",
                f"hydra.run.dir={job_dir}",
            ],
            env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "step 10/" in out.read_text(), "the job to train", timeout=120, process=launcher)
        node_1 = Path(tempfile.gettempdir()) / "ddlkit-ray" / submission(job_dir)["id"] / "node-1"
        os.kill(worker_pids(node_1)[1], signal.SIGSTOP)
        assert launcher.wait(timeout=120) == 76, out.read_text()
    finally:
        launcher.kill()
        launcher.wait()
    text = out.read_text()
    assert "ddlkit: stacks of rank(s) 0 written to hang/" in text and "ddlkit: rank 1 does not answer" in text, text
    assert "ddlkit-ray: rank(s) [1] did not stop within 3 s: killing them" in text, text
    assert "was lost" not in text and "rank 1 stopped answering first; rank 0 (node 0" in text, text
    stacks = (job_dir / "hang/rank-0.txt").read_text()
    assert stacks.startswith("# rank 0 of 2 on ") and "in train_epochs" in stacks, stacks[:500]
    assert (job_dir / "rank-1.log").is_file()  # the stopped rank's node handed its files over
    assert not node_1.exists()  # and was cleaned up


@pytest.mark.slow
def test_secrets_reach_the_ranks_and_no_log_or_file_of_rays(ray_cluster, run_factory: RunFactory) -> None:
    """A job's secrets were part of its runtime environment, which Ray writes into
    runtime_env_agent.log on every node (issue 37, item 4): now the ranks get them (the storage
    checks their digest) and no file of Ray's session directories, of the ranks' node copies or of
    the job directory holds them."""
    import hashlib
    import secrets
    import tempfile

    marker = f"LEAKray{secrets.token_hex(8)}"  # this run's alone: the cluster keeps other jobs' files
    token = f"sv=2026-01-01&se=2030-01-01&sp=r&sig={marker}"
    expected = hashlib.sha256(f"{token}|".encode()).hexdigest()
    outcome = run_factory(
        *ray_args(ray_cluster.address, "compute.nodes=2"),
        "dist=native",
        "storage=memory",
        f"storage.sas_token='{token}'",
        f"storage.expect_sha256={expected}",
        timeout=240,
    )
    outcome.assert_success()
    assert outcome.result["world_size"] == 2  # a rank on each node, each with the secrets back
    places = [ray_cluster.temp_dir, Path(tempfile.gettempdir()) / "ddlkit-ray", outcome.job_dir]
    leaks = [
        str(p)
        for place in places
        if place.is_dir()
        for p in place.rglob("*")
        if p.is_file() and not p.is_symlink() and marker.encode() in p.read_bytes()
    ]
    assert leaks == []
    assert marker not in outcome.stdout + outcome.stderr


@pytest.mark.slow
def test_address_auto_finds_the_cluster_ray_start_started(ray_cluster, run_factory: RunFactory) -> None:
    """compute.address=auto: the cluster ``ray start --head`` started on this machine -- found where Ray's
    own tools find it (its temporary directory, or RAY_ADDRESS, which names this test cluster's GCS)."""
    if not hasattr(ray_cluster, "gcs_address"):
        pytest.skip("the session's cluster was given by its Jobs endpoint only")
    outcome = run_factory(
        "compute=ray",
        "compute.address=auto",
        "compute.poll_interval_s=0.3",
        env={"RAY_ADDRESS": ray_cluster.gcs_address},
        timeout=240,
    ).assert_success()
    assert outcome.result["status"] == "completed"
    assert submission(outcome.job_dir)["id"].startswith("test_address_auto")


@pytest.mark.slow
def test_a_package_only_in_the_launch_directory_trains_on_the_cluster(ray_cluster, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "my_pkg").mkdir(parents=True)
    (project / "my_pkg" / "__init__.py").write_text("")
    (project / "my_pkg" / "data.py").write_text(
        "import numpy as np\n\n\n"
        "def samples(split, n=32):\n"
        "    rng = np.random.default_rng(0 if split == 'train' else 1)\n"
        "    return rng.uniform(0, 1, (n, 8, 8, 3)).astype('float32'), rng.integers(0, 4, n)\n"
    )
    (project / "big.bin").write_bytes(b"\0" * 2_000_000)
    (project / ".gitignore").write_text("big.bin\n")
    outcome = RunFactory(project)(
        *ray_args(ray_cluster.address, "compute.nodes=2"),
        "dist=native",
        "data=custom",
        "data.target=my_pkg.data:samples",
        "data.num_classes=4",
        "data.image_size=8",
        "trainer.batch_size=8",
        "trainer.epochs=1",
        job_dir=tmp_path / "job",
        timeout=240,
    ).assert_success()
    assert outcome.result["steps"] == 2 and outcome.result["world_size"] == 2  # 32 samples, 2 x 8 a step
    shipped = json.loads((outcome.job_dir / "code.json").read_text())
    assert sorted(f["path"] for f in shipped["files"]) == [".gitignore", "my_pkg/__init__.py", "my_pkg/data.py"]


@pytest.mark.slow
def test_a_sweep_of_four_jobs_with_early_stopping(ray_cluster, run_factory: RunFactory, tmp_path: Path) -> None:
    """A sweep on Ray, one Ray job per run; with sweep.early_stopping=asha (rungs at 1 of 2 epochs, the
    better half goes on) the promoted trials' second segments are Ray jobs of their own that resume
    the checkpoint the first ones brought back."""
    sweep_dir = tmp_path / "sweep"
    outcome = run_factory.cli(
        "-m",
        "framework=fake",
        *ray_args(ray_cluster.address),
        "optimizer.lr=0.1,0.05,0.02,0.01",
        "sweep.early_stopping.scheduler=asha",
        "sweep.early_stopping.reduction_factor=2",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=400,
    )
    outcome.assert_success()
    jobs = list(json.loads((sweep_dir / "ledger.json").read_text())["jobs"].values())
    statuses = [j["status"] for j in jobs]
    # the top half of the four at 1 epoch went on: 2, or 3 where one went on early, as the best of the first two
    assert set(statuses) == {"completed", "paused"} and 2 <= statuses.count("completed") <= 3, outcome.output
    for job in jobs:
        result = json.loads((Path(job["job_dir"]) / "result.json").read_text())
        assert result["status"] == "completed"
        if job["status"] == "completed":  # its second segment resumed from the checkpoint at 1 epoch
            assert [(s["from"], s["to"]) for s in job["segments"]] == [(0, 1), (1, 2)]
            assert result["resumed_from_step"] == result["steps"] // 2 > 0
    assert len({submission(Path(j["job_dir"]))["id"] for j in jobs}) == 4  # one Ray job each (the last run's)


@pytest.mark.slow
def test_jobs_attach_follows_a_detached_job_to_its_end(ray_cluster, run_factory: RunFactory, tmp_path: Path) -> None:
    job_dir = tmp_path / "attached"
    run_factory.cli(
        "--detach",
        "framework=fake",
        *ray_args(ray_cluster.address),
        "framework.step_delay_s=0.02",
        f"hydra.run.dir={job_dir}",
    ).assert_success()
    assert not (job_dir / "result.json").exists()
    attached = run_factory.cli("jobs", "attach", str(job_dir), timeout=180).assert_success()
    assert "train epoch" in attached.stdout and "the job ended with exit status 0" in attached.output
    assert json.loads((job_dir / "result.json").read_text())["status"] == "completed"
    status = run_factory.cli("jobs", "status", str(job_dir)).assert_success()
    assert "completed" in status.stdout or "succeeded" in status.stdout, status.output
    logs = run_factory.cli("jobs", "logs", str(job_dir)).assert_success()
    assert "train epoch" in logs.stdout and "Running entrypoint" not in logs.stdout, logs.output


@pytest.mark.slow
def test_the_rank_that_failed_first_names_the_failure_and_its_record_comes_back(ray_cluster, tmp_path: Path) -> None:
    """Rank 1 of two, on the other node, fails with its own error; the driver stops rank 0, which
    then ends too (killed by the SIGTERM it does not handle). The job fails as rank 1 did -- its exit
    status, its node, its last lines -- judged from the ranks' exit records, which came back from the
    cluster with the job's files."""
    job_dir = tmp_path / "fails"
    job_dir.mkdir()
    code = (
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(2)\n"
        "    print('rank 1: the disk is on fire', flush=True)\n"
        "    sys.exit(3)\n"
        "print('rank 0 waits', flush=True)\n"
        "time.sleep(120)\n"
    )
    handle = ray_target(ray_cluster.address, nodes=2).submit(JobSpec(name="fails", job_dir=job_dir, args=("-c", code)))
    status = handle.wait(timeout=180)
    assert (status.state, status.exit_code) == (ddlkit.JobState.FAILED, 3), status
    assert "rank 1 (node 1" in status.message and "failed first, with exit status 3" in status.message, status
    assert "rank 1: the disk is on fire" in status.message, status.message
    handle.collect()
    records = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (job_dir / ".ranks").glob("rank-*.json")}
    assert records[1]["code"] == 3 and records[0]["code"] == -signal.SIGTERM, records


@pytest.mark.slow
def test_cancel_checkpoints_and_the_checkpoint_comes_back(ray_cluster, run_factory: RunFactory, tmp_path: Path) -> None:
    job_dir = tmp_path / "cancelled"
    run_factory.cli(
        "--detach",
        "framework=fake",
        *ray_args(ray_cluster.address, "compute.nodes=2"),
        "dist=native",
        "trainer.checkpoint_every=4",
        *SLOW,
        "framework.step_delay_s=0.5",
        "compute.sync_interval_s=1",
        f"hydra.run.dir={job_dir}",
    ).assert_success()
    follow_until(ray_cluster.address, job_dir, "step 10/")
    # while it runs, `jobs status` shows each rank's rate and waits as rank 0 wrote them on its node: the
    # driver publishes them every compute.sync_interval_s (issue 42)
    rows = wait_for(
        lambda: rank_rows(run_factory.cli("jobs", "status", str(job_dir)).assert_success().stdout),
        "a rank table in `ddlkit jobs status` of the running job",
        pace=1,
    )
    assert [row[:2] for row in rows] == [("0", "0"), ("1", "1")], rows
    assert not (job_dir / "result.json").exists()  # it was still running
    cancel = run_factory.cli("jobs", "cancel", str(job_dir), timeout=180).assert_success()
    assert "resume" in cancel.output, cancel.output
    record = json.loads((job_dir / ".ddlkit/ray-exit.json").read_text())
    assert record["code"] == 75, record  # the ranks stopped after a checkpoint
    assert list((job_dir / "checkpoints").glob("*.ckpt")), "the checkpoint did not come back"
    assert submission(job_dir)["state"] == "cancelled"
    # and the job resumes from it: from the files the cluster kept, which the launcher does not upload again
    # (Ray's Jobs API takes no package over 100 MiB; a ResNet-50 checkpoint alone is bigger)
    assert record["kept"]["key"] == (job_dir / ".ddlkit/ray-key").read_text().strip(), record
    resumed = run_factory(
        *ray_args(ray_cluster.address, "compute.nodes=2"),
        "dist=native",
        "trainer.checkpoint_every=4",
        job_dir=job_dir,
        timeout=300,
    ).assert_success()
    assert resumed.result["resumed_from_step"] >= 10
    assert json.loads((job_dir / "ray-job.json").read_text())["kept_on_cluster"] is True
    # the ranks get the checkpoint they resume from; the older one (step 8) stays on the driver's node
    said = re.search(
        r"(\d+) file\(s\) of the job's last run kept on this node .*; (\d+) file\(s\) of older "
        r"checkpoints stay here",
        resumed.stdout + resumed.stderr,
    )
    assert said and said[2] == "2", resumed.output  # step 8's checkpoint and its manifest
    # a completed job leaves nothing on the cluster
    assert json.loads((job_dir / ".ddlkit/ray-exit.json").read_text())["kept"] is None


def test_a_resume_brings_the_checkpoints_when_the_cluster_no_longer_keeps_them(
    ray_cluster, run_factory: RunFactory, tmp_path: Path
) -> None:
    """The node that kept a cancelled job's files lost them (its log directory cleaned, a new cluster
    on the same address): the launcher uploads the job's checkpoints with it, and the job resumes."""
    job_dir = tmp_path / "cancelled"
    run_factory.cli(
        "--detach", "framework=fake", *ray_args(ray_cluster.address), *SLOW, f"hydra.run.dir={job_dir}"
    ).assert_success()
    follow_until(ray_cluster.address, job_dir, "step 10/")
    run_factory.cli("jobs", "cancel", str(job_dir), timeout=180).assert_success()
    key = (job_dir / ".ddlkit/ray-key").read_text().strip()
    if not hasattr(ray_cluster, "temp_dir"):
        pytest.skip("the cluster's log directories are not on this machine")
    kept = {p.resolve() for p in Path(ray_cluster.temp_dir).glob(f"session_*/logs/ddlkit/kept/{key}")}
    assert kept, f"the cluster kept nothing of the cancelled job in {ray_cluster.temp_dir}"
    for directory in kept:
        shutil.rmtree(directory)
    resumed = run_factory(*ray_args(ray_cluster.address), job_dir=job_dir, timeout=300).assert_success()
    assert (resumed.result["resumed_from_step"] or 0) >= 10, resumed.output
    assert json.loads((job_dir / "ray-job.json").read_text())["kept_on_cluster"] is False
    if resumed.result["restarts"]:
        # the launcher still found the kept files' mark when it asked, and the driver found them gone:
        # the driver ends at once, keeping nothing, and the restart brings the checkpoints along
        assert resumed.result["restarts"] == 1, resumed.output
        assert "the files the job's last run kept on this node are gone" in resumed.output


def test_a_driver_that_finds_the_kept_files_gone_keeps_nothing_and_the_restart_brings_the_checkpoints(
    ray_cluster, run_factory: RunFactory, tmp_path: Path
) -> None:
    """The launcher finds the kept files' mark, and the driver does not find them on its node (they
    went between the two looks; here: they are on another node than the driver's): the driver ends
    at once, without a mark that would say its empty directory is the job's, and the restart brings
    the checkpoints from the launcher."""
    if not hasattr(ray_cluster, "temp_dir"):
        pytest.skip("the cluster's log directories are not on this machine")
    job_dir = tmp_path / "cancelled"
    run_factory.cli(
        "--detach", "framework=fake", *ray_args(ray_cluster.address), *SLOW, f"hydra.run.dir={job_dir}"
    ).assert_success()
    follow_until(ray_cluster.address, job_dir, "step 10/")
    run_factory.cli("jobs", "cancel", str(job_dir), timeout=180).assert_success()
    key = (job_dir / ".ddlkit/ray-key").read_text().strip()
    exit_record = job_dir / ".ddlkit/ray-exit.json"
    record = json.loads(exit_record.read_text())
    head, worker = ray_cluster.node_ids()
    assert record["kept"]["node_id"] == head, record  # the driver runs on the head node
    (kept,) = {p.resolve() for p in Path(ray_cluster.temp_dir).glob(f"session_*/logs/ddlkit/kept/{key}")}
    (worker_logs,) = {p.resolve() for p in Path(ray_cluster.temp_dir).glob("n1/session_*/logs")}
    shutil.move(kept, worker_logs / "ddlkit/kept" / key)
    exit_record.write_text(json.dumps({**record, "kept": {**record["kept"], "node_id": worker}}))
    resumed = run_factory(*ray_args(ray_cluster.address), job_dir=job_dir, timeout=300).assert_success()
    assert "the files the job's last run kept on this node are gone" in resumed.output
    assert resumed.result["restarts"] == 1, resumed.output
    assert (resumed.result["resumed_from_step"] or 0) >= 10, resumed.output
    assert json.loads((job_dir / "ray-job.json").read_text())["kept_on_cluster"] is False


@pytest.mark.slow
def test_a_busy_dashboard_is_asked_again_for_the_files_and_one_that_never_answers_is_an_error(
    ray_cluster, run_factory: RunFactory, tmp_path: Path
) -> None:
    """The job's files come back through the dashboard's log API: an answer that is neither the file
    nor "no such file" (its node agent busy) is asked again; one that never comes ends the launcher
    with the cause and the command that brings the files later -- not a silent success without
    them, nor a cancelled job said to have left no checkpoint. (No restarts: a detached job that may be
    restarted has a minder, which would bring the files back itself the moment the job ends.)"""
    job_dir = tmp_path / "busy"
    logs = "/api/v0/logs/file"
    with CountingProxy(ray_cluster.address) as proxy:
        run_factory.cli(
            "--detach",
            "framework=fake",
            *ray_args(proxy.address),
            "trainer.max_steps=6",
            "restart.max_restarts=0",
            f"hydra.run.dir={job_dir}",
        ).assert_success()
        assert not (job_dir / ".ddlkit" / "minder.log").exists()
        job_id = submission(job_dir)["id"]
        assert (
            ray_target(ray_cluster.address).attach(job_id, job_dir=tmp_path).wait(timeout=180).state
            is ddlkit.JobState.SUCCEEDED
        )
        proxy.fail(logs, 1000)
        failed = run_factory.cli("jobs", "attach", str(job_dir), timeout=240)
        assert failed.returncode != 0, failed.output
        assert "could not be brought back" in failed.output and f"ddlkit jobs attach {job_dir}" in failed.output, (
            failed.output
        )
        assert not (job_dir / "result.json").exists()
        proxy.fail(logs, 2)
        asked = len(proxy.requests)
        run_factory.cli("jobs", "attach", str(job_dir), timeout=240).assert_success()
        assert json.loads((job_dir / "result.json").read_text())["steps"] == 6
        assert sum(path.startswith(logs) for _, _, path in proxy.requests[asked:]) >= 4  # 2 refused, asked again
        # a file the node does not have is no file, at once
        node = ray_target(ray_cluster.address).attach(job_id, job_dir=tmp_path).scheduler.info(job_id).driver_node_id
        asked = len(proxy.requests)
        assert node_file(None, proxy.address, node, "ddlkit/no-such-job/exit.json") is None
        assert len(proxy.requests) == asked + 1


@pytest.mark.slow
def test_following_a_job_asks_the_dashboard_at_most_30_times_a_minute(ray_cluster, run_factory: RunFactory) -> None:
    """The launcher follows the job's log over one stream (the Jobs API's websocket) and asks its state
    seldom: every request from the submission to the launcher's exit, counted by a proxy in front of
    the dashboard, is at most 30 a minute (reading the whole log twice a second made about 130), and
    the output comes once, whole."""
    with CountingProxy(ray_cluster.address) as proxy:
        outcome = run_factory(
            "compute=ray",
            f"compute.address={proxy.address}",
            "trainer.epochs=1000",
            "trainer.max_steps=80",
            *SLOW,
            timeout=240,
        ).assert_success()
        end = time.time()
    submitted = next(t for t, method, path in proxy.requests if method == "POST" and path.rstrip("/") == "/api/jobs")
    following = [path.split("?")[0] for t, _, path in proxy.requests if t >= submitted]
    per_minute = len(following) / ((end - submitted) / 60)
    assert per_minute <= 30, f"{per_minute:.0f} requests a minute: {following}"
    assert sum(path.endswith("/logs/tail") for path in following) == 1, following  # one stream, no log reads
    steps_once(outcome.stdout, last=80)


def steps_once(output: str, last: int | None = None) -> list[str]:
    """The steps of the fake's "train epoch E/N step S/M" lines, each of which must come once (``last``: that one
    too)."""
    steps = re.findall(r"^train epoch \S+ step (\d+)/", output, re.M)
    assert steps and len(steps) == len(set(steps)), output
    assert last is None or str(last) in steps, output
    return steps


@pytest.mark.slow
def test_a_dashboard_that_cannot_stream_has_the_log_read_instead(ray_cluster, run_factory: RunFactory) -> None:
    with CountingProxy(ray_cluster.address, websockets=False) as proxy:
        outcome = run_factory(
            *ray_args(proxy.address), "trainer.max_steps=12", "framework.step_delay_s=0.1", timeout=240
        ).assert_success()
    assert outcome.output.count("does not stream job logs") == 1, outcome.output  # said once, with why
    assert any(path.split("?")[0].endswith("/logs") for _, _, path in proxy.requests)
    steps_once(outcome.stdout, last=12)


@pytest.mark.slow
def test_a_log_stream_that_drops_is_opened_again_and_the_output_goes_on_once(
    ray_cluster, run_factory: RunFactory, tmp_path: Path
) -> None:
    job_dir = tmp_path / "dropped"
    with CountingProxy(ray_cluster.address) as proxy:
        run_factory.cli(
            "--detach", "framework=fake", *ray_args(proxy.address), *SLOW, f"hydra.run.dir={job_dir}"
        ).assert_success()
        handle = ray_target(proxy.address).attach(submission(job_dir)["id"], job_dir=job_dir)
        seen, dropped = "", 0
        for chunk in handle.logs(follow=True):
            seen += chunk
            if "step 10/" in seen and not dropped:
                dropped = proxy.drop_websockets()
                assert dropped == 1
    streams = [path for _, _, path in proxy.requests if path.split("?")[0].endswith("/logs/tail")]
    assert len(streams) == 2, streams  # opened again once
    steps_once(seen, last=80)  # nothing twice, nothing lost
    assert handle.status().state is ddlkit.JobState.SUCCEEDED


@pytest.mark.slow
def test_ctrl_c_cancels_the_followed_job_and_its_output_goes_on_once(ray_cluster, tmp_path: Path) -> None:
    job_dir = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "framework=fake",
            *ray_args(ray_cluster.address),
            *SLOW,
            f"hydra.run.dir={job_dir}",
        ],
        env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=interruptible,
    )
    seen = ""
    try:
        deadline = time.monotonic() + 180
        while "step 10/" not in seen:
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, seen[-3000:]
            seen += line
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = seen + out
    assert "asking the job to checkpoint and stop" in out, out[-3000:]
    assert proc.returncode == 75, out[-3000:]  # stopped after a checkpoint
    steps_once(out)  # the output after Ctrl-C goes on from where it was, not again from the start
    assert submission(job_dir)["state"] == "cancelled"


@pytest.mark.slow
def test_a_lost_node_restarts_the_job_in_place_which_resumes(tmp_path: Path, run_factory: RunFactory) -> None:
    """Three nodes, a job on two: a node of the job dies (its raylet killed); the job's driver places
    the gang again on the two nodes that are left, under ddlkit's restart policy, without ending the
    Ray job (no new submission); the ranks resume from the checkpoint the driver kept, and the job
    ends. The launcher counts the restart, and the job's record has it."""
    needs_ray()
    from ddlkit_ray.testing import LocalRayCluster

    with LocalRayCluster(nodes=3, cpus_per_node=1, env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}) as cluster:
        job_dir = tmp_path / "survives"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddlkit",
                "framework=fake",
                *ray_args(cluster.address, "compute.nodes=2", "compute.sync_interval_s=1"),
                "dist=native",
                "dist.timeout_s=20",
                "trainer.checkpoint_every=4",
                "restart.backoff_s=1",
                *SLOW,
                f"hydra.run.dir={job_dir}",
            ],
            env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
            cwd=tmp_path,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=interruptible,
        )
        try:
            seen = follow_until(cluster.address, job_dir, "step 20/", timeout=180, launcher=proc)
            first_run = submission(job_dir)["id"]
            started = re.search(r"started on node\(s\) 0 \((\w+)\), 1 \((\w+)\)", seen)
            assert started, seen
            # a node of the job that is not the head (whose loss ends the cluster): rank 1's, or rank 0's,
            # whose checkpoints the driver has copied off it
            cluster.kill_node(next(n for n in (started[2], started[1]) if not cluster.head_node_id().startswith(n)))
            out, _ = proc.communicate(timeout=400)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.communicate(timeout=60)
        assert proc.returncode == 0, out[-4000:]
        assert "was lost" in out, out[-4000:]
        assert re.search(
            r"^ddlkit: restart 1/3 in place: a rank was killed by SIGKILL from outside \(a lost node, a "
            r"preemption\); it ended at step \d+ \(rank \d's node \(\d\) was lost: \w+\); resuming from "
            r"step \d+ in 1 s$",
            out,
            re.MULTILINE,
        ), out[-4000:]
        assert len(re.findall(r"rank\(s\) started on node", out)) == 2, out[-4000:]  # one driver placed both gangs
        record = submission(job_dir)
        assert record["id"] == first_run and record["state"] == "succeeded", record  # the same Ray job throughout
        (restart,) = record["restarts"]
        assert restart["in_place"] and restart["ended_id"] == first_run and restart["resumed_from"] >= 4, restart
        result = json.loads((job_dir / "result.json").read_text())
        assert result["status"] == "completed" and result["restarts"] == 1, result
        assert result["resumed_from_step"] == restart["resumed_from"], result
        assert result["steps_lost"] == restart["steps_lost"], result


# ---------------------------------------------------------------------------- elastic world size
def test_fewer_nodes_is_the_same_job_on_a_smaller_gang(tmp_path: Path) -> None:
    """What an elastic restart submits on fewer nodes: the driver's plan and placement group for that
    many, and the planned world size in the ranks' environment (the launcher puts it in spec.env)."""
    target = ray_target("http://head.example:8265", nodes=2, procs_per_node=2, min_nodes=1)
    assert (target.nodes, target.min_nodes, target.world_size) == (2, 1, 4)
    spec = JobSpec(name="job-1", job_dir=tmp_path, env={PLANNED_WORLD_SIZE_ENV: "4"})
    smaller = target.with_nodes(1, spec)
    assert isinstance(smaller, RayTarget) and smaller.world_size == 2
    plan = smaller.driver_plan(spec, "job-1-x")
    assert (plan["nodes"], plan["procs_per_node"]) == (1, 2)
    assert (
        'placement group (STRICT_PACK): 1 bundle(s) {"CPU": 2}, one per node; 2 rank actor(s) per bundle, 2 '
        "rank(s)" in smaller.plan(spec)
    )
    assert smaller.runtime_env(spec)["env_vars"][PLANNED_WORLD_SIZE_ENV] == "4"


#: an elastic job of numbered samples whose ranks trace what they train on (ddlkit.testing.elastic):
#: 2 ranks x 8 = a global batch of 16, 16 steps per epoch of 256 samples
ELASTIC_JOB = (
    "framework=fake",
    "dist=native",
    "dist.timeout_s=20",
    "data=custom",
    "data.target=ddlkit.testing.fakes:class_images",
    "+data.kwargs.numbered=true",
    "data.num_classes=4",
    "data.image_size=8",
    "trainer.batch_size=8",
    "trainer.log_every=1",
    "trainer.checkpoint_every=2",
    "trainer.deterministic=true",
    "framework.allreduce=true",
    "framework.trace_samples=true",
    "restart.backoff_s=2",
)


def launch(cluster, tmp_path: Path, job: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlkit",
            *ELASTIC_JOB,
            *ray_args(cluster.address, "compute.sync_interval_s=1"),
            # the ranks write into copies of the job directory on their nodes: a lost node takes its ranks'
            # traces along, so they trace into a directory of this machine's, which all simulated nodes share
            f"framework.trace_dir={tmp_path / job / 'trace'}",
            *overrides,
            f"hydra.run.dir={tmp_path / job / 'job'}",
        ],
        env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE},
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,
    )


def job_nodes(seen: str, nodes: int) -> list[str]:
    """The Ray node ids (their first 8 characters) of the job's nodes 0..nodes-1, from the driver's line."""
    started = re.search(r"started on node\(s\) " + ", ".join(rf"{i} \((\w+)\)" for i in range(nodes)), seen)
    assert started, seen
    return list(started.groups())


def kill_job_nodes(cluster, seen: str, nodes: int) -> None:
    """Kill the job's nodes but the head (whose loss ends the cluster): rank 0's node among them, or
    not -- the driver has copied its checkpoints off it."""
    head = cluster.head_node_id()
    for node in job_nodes(seen, nodes):
        if not head.startswith(node):
            cluster.kill_node(node)


class Reading:
    """A launched ddlkit command whose output lines a thread collects as they come (``lines``); when
    the test leaves the block, SIGINT (ddlkit's cancel) if it still runs, and its stderr in ``err``."""

    def __init__(self, proc: subprocess.Popen) -> None:
        import threading

        self.proc, self.lines, self.err = proc, [], ""
        self.reader = threading.Thread(
            target=lambda: self.lines.extend(proc.stdout),  # type: ignore[arg-type]
            daemon=True,
        )

    def __enter__(self) -> Reading:
        self.reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=60)
        self.reader.join(10)
        self.err = self.proc.stderr.read()  # type: ignore[union-attr]

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, test: Callable[[str], bool], what: str, timeout: float) -> None:
        wait_for(
            lambda: any(test(line) for line in self.lines),
            what,
            timeout=timeout,
            process=self.proc,
            detail=lambda: self.out[-3000:],
        )


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)


@pytest.mark.slow
def test_a_lost_node_shrinks_the_elastic_job_and_it_grows_back_when_a_node_joins(tmp_path: Path) -> None:
    """Two nodes, compute.min_nodes=1: a node of the job dies mid-run (its raylet killed); the job
    restarts on the one node left, with the batch trainer.on_resize says, and resumes from the
    checkpoint the driver kept. A node joins the cluster; at the next restart (a preemption notice to
    rank 0) the job is back on two nodes. Nothing is lost: the steps add up, each epoch trained every
    sample once, the final checkpoint verifies."""
    needs_ray()
    import tempfile

    from ddlkit.testing.multirank import worker_pids
    from ddlkit_ray.testing import LocalRayCluster

    with LocalRayCluster(nodes=2, cpus_per_node=1, env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}) as cluster:
        proc = launch(
            cluster,
            tmp_path,
            "elastic",
            "compute.nodes=2",
            "compute.min_nodes=1",
            "trainer.epochs=4",
            "framework.step_delay_s=0.5",
        )
        job_dir = tmp_path / "elastic" / "job"
        with Reading(proc) as launcher:
            seen = follow_until(cluster.address, job_dir, "step 6/", timeout=240, launcher=proc)
            first_run = submission(job_dir)["id"]
            kill_job_nodes(cluster, seen, 2)
            launcher.wait_for_line(
                lambda ln: ln.startswith("ddlkit: restart 1/3 on "), "the restart on fewer nodes", timeout=180
            )
            cluster.add_node()  # a machine joins while the job runs on one node
            shrunk = wait_for(
                lambda: submission(job_dir)["id"] != first_run and submission(job_dir)["id"],
                "the restarted run's record",
                timeout=60,
                process=proc,
            )
            # once the shrunk job trains again, a preemption notice to its rank 0 ends it (it checkpoints)
            follow_until(
                cluster.address, job_dir, "train epoch", timeout=180, launcher=proc, after="instead of the planned 2"
            )
            rank_dir = Path(tempfile.gettempdir(), "ddlkit-ray", shrunk, "node-0")
            os.kill(
                wait_for(lambda: worker_pids(rank_dir).get(0), "the shrunk job's rank 0", timeout=30), signal.SIGTERM
            )
            proc.wait(timeout=400)
        out = launcher.out
        assert proc.returncode == 0, out[-4000:] + launcher.err[-4000:]
        assert "was lost" in seen + out, out[-4000:]
        assert (
            "ddlkit: restart 1/3 on 1 of 2 nodes (compute.min_nodes=1, 1 rank): trainer.on_resize="
            "keep_global_batch: per-rank batch 8 -> 8 x 2 micro-batches, lr unchanged\n"
        ) in out, out[-4000:]
        # the rank learnt the planned world size through the Ray job's runtime environment, and says so
        assert (
            "ddlkit: 1 rank instead of the planned 2: trainer.on_resize=keep_global_batch: per-rank batch 8 -> "
            "8 x 2 micro-batches, lr unchanged\n"
        ) in out, out[-4000:]
        assert re.search(r"ddlkit-ray: 1 rank\(s\) started on node\(s\) 0 \(\w+\);", out), out[-4000:]
        assert (
            "ddlkit: restart 2/3 on 2 of 2 nodes (compute.min_nodes=1, 2 ranks): trainer.on_resize="
            "keep_global_batch: per-rank batch 8 x 2 micro-batches -> 8, lr unchanged\n"
        ) in out, out[-4000:]
        shrink, grow = restarts(job_dir)
        assert (shrink["nodes"], shrink["planned_nodes"], shrink["world_size"]) == (1, 2, 1), shrink
        assert (grow["nodes"], grow["world_size"]) == (2, 2), grow
        assert 2 <= shrink["resumed_from"] < grow["resumed_from"], (shrink, grow)
        result = json.loads((job_dir / "result.json").read_text())
        assert (result["status"], result["steps"], result["restarts"], result["world_size"], result["resize"]) == (
            "completed",
            64,
            2,
            2,
            None,
        ), result
        assert result["resumed_from_step"] == grow["resumed_from"], result
        assert_every_sample_once(job_dir, epochs=4, samples=256, trace_dir=tmp_path / "elastic" / "trace")
        assert verify(latest_checkpoint(job_dir)) is None


@pytest.mark.slow
def test_a_restart_waits_for_capacity_and_goes_on_when_a_node_joins(tmp_path: Path) -> None:
    """Two nodes, a job on both that needs both (compute.min_nodes=nodes=2): a node of the job dies;
    the restart waits for capacity, saying so, a node joins, and the job resumes from its checkpoint
    and completes on two nodes."""
    needs_ray()
    from ddlkit_ray.testing import LocalRayCluster

    with LocalRayCluster(nodes=2, cpus_per_node=1, env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}) as cluster:
        proc = launch(
            cluster,
            tmp_path,
            "waits",
            "compute.nodes=2",
            "compute.min_nodes=2",
            "trainer.epochs=2",
            "restart.capacity_wait_s=300",
            *SLOW,
        )
        job_dir = tmp_path / "waits" / "job"
        with Reading(proc) as launcher:
            kill_job_nodes(cluster, follow_until(cluster.address, job_dir, "step 6/", timeout=240, launcher=proc), 2)
            launcher.wait_for_line(lambda ln: " waits for capacity: " in ln, "the wait for capacity", timeout=120)
            cluster.add_node()
            proc.wait(timeout=300)
        out = launcher.out
        assert proc.returncode == 0, out[-4000:] + launcher.err[-4000:]
        assert (
            "ddlkit: restart 1/3 waits for capacity: only 1 of its 2 nodes are up on compute=ray, fewer than "
            "compute.min_nodes=2; looking again every 1 s for up to "
        ) in out, out[-4000:]
        assert re.search(r"ddlkit: restart 1/3 on its 2 nodes after waiting \d+ s for capacity\n", out), out[-4000:]
        # the launcher judged the run by its ranks' exit records: the rank lost with its node failed first
        assert re.search(
            r"^ddlkit: restart 1/3: a rank was killed by SIGKILL from outside \(a lost node, a preemption\); it ended "
            r"at step \d+ \(Ray job \S+ failed with exit status 137 \(rank (\d)'s node \(\d\) was lost: \w+\); "
            r"rank \1 \(node \d\) failed first, with killed by signal SIGKILL\)",
            out,
            re.MULTILINE,
        ), out[-4000:]
        assert len(re.findall(r"ddlkit-ray: 2 rank\(s\) started on node\(s\) 0 \(\w+\), 1 \(\w+\)", out)) == 2, out
        result = json.loads((job_dir / "result.json").read_text())
        assert (result["status"], result["restarts"], result["world_size"]) == ("completed", 1, 2), result
        assert result["resumed_from_step"] >= 2, result
        assert restarts(job_dir)[0]["waited_for_capacity_s"] > 0  # the job's record keeps the wait


@pytest.mark.slow
def test_too_few_nodes_after_the_wait_for_capacity_end_the_job_in_one_line(tmp_path: Path) -> None:
    """Three nodes, compute.min_nodes=2: two of the job's nodes die and none comes back; the restart
    waits restart.capacity_wait_s, then the job fails with one line that says what it waited for, how
    long, and what to do; its checkpoint is intact."""
    needs_ray()
    from ddlkit_ray.testing import LocalRayCluster

    with LocalRayCluster(nodes=3, cpus_per_node=1, env={**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}) as cluster:
        proc = launch(
            cluster,
            tmp_path,
            "short",
            "compute.nodes=3",
            "compute.min_nodes=2",
            "trainer.epochs=1",
            "trainer.batch_size=4",
            "restart.capacity_wait_s=3",
            *SLOW,
        )
        job_dir = tmp_path / "short" / "job"
        try:
            kill_job_nodes(cluster, follow_until(cluster.address, job_dir, "step 4/", timeout=240, launcher=proc), 3)
        except BaseException:
            finish(proc, 0.1)
            raise
        out, err = finish(proc, 300)
    assert proc.returncode == 1, out[-4000:] + err[-4000:]
    assert "ddlkit: restart 1/3 waits for capacity: only 1 of its 3 nodes are up on compute=ray" in out, out[-4000:]
    assert "ddlkit: restart 1/3 on " not in out  # no run on fewer nodes
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("ddlkit: error: job ") and "Traceback" not in err, err[-4000:]
    checkpoint = latest_checkpoint(job_dir)
    assert checkpoint is not None and verify(checkpoint) is None
    step = checkpoint_step(checkpoint)
    assert step is not None and step >= 2, checkpoint
    assert (
        " not restarted: it waited 3 s (restart.capacity_wait_s) for compute.min_nodes=2 of its 3 nodes to be up "
        "on compute=ray, but only 1 is: bring nodes back or add some, lower compute.min_nodes, or wait longer "
        f"(restart.capacity_wait_s); it resumes from step {step} when run again: resume with: ddlkit "
    ) in lines[-1]
    assert (
        not (job_dir / "result.json").exists()
        or json.loads((job_dir / "result.json").read_text())["status"] != "completed"
    )


def test_a_dashboard_that_never_answers_is_one_line_within_seconds(tmp_path: Path) -> None:
    """A port that takes connections and never answers (a hung head node, another service):
    Ray's client waited for ever, and the launcher said nothing for minutes (issue 37, item 13)."""
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # the kernel accepts; nobody reads or answers
    address = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "ddlkit",
                "framework=pytorch",
                "compute=ray",
                f"compute.address={address}",
                f"hydra.run.dir={tmp_path / 'job'}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
    finally:
        listener.close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ddlkit: error: compute=ray: the Ray dashboard at {address} did not answer /api/version within 10 s. Is "
        f"compute.address={address} the dashboard's Jobs endpoint (http://<head>:8265), and is the head node running?"
    )
    assert took < 40, took
