"""compute=azureml against the loopback Azure ML workspace (the real azure-ai-ml SDK over HTTPS on
127.0.0.1, storage in Azurite, jobs run on this machine; no Azure service is contacted).

* **submission latency**, command to job accepted: from starting ``ddlkit --detach compute=azureml
  framework=fake ...`` (the real CLI: interpreter start-up, composing, validating, importing the
  SDK, the workspace and cluster checks, the code upload) to the loopback receiving the job's PUT,
  and to the CLI's return; baseline in the same rounds: the same command with ``compute=local``.
  **with a code snapshot** (a package of 50 files, 5 MB, in the launch directory, named by
  ``data.target``): the same to the job accepted, the first submission of a tree (the snapshot
  uploaded) and a second one of the same tree (nothing of it uploaded: counted as the blobs under
  the snapshots' folder that are new or have a new ETag), against the same command with
  ``data=synthetic`` (nothing shipped); each round changes one file, so its first submission is
  a new snapshot. Every job is waited for before the next submission, and must succeed.
  In-process, warm: ``AzureMLTarget.submit`` against a hand-written minimal SDK submission
  (``MLClient.jobs.create_or_update(command(...))`` of the same code directory and image), and the
  REST calls each makes (apart from them, the requests of ddlkit's image check: the jobs name an
  image in a loopback registry, ``ddlkit.testing.registry``, which ddlkit asks for it first);
* **REST calls per job-minute while following**: a job that prints for ``--follow-s`` seconds,
  followed as ``ddlkit`` follows one (``logs(follow=True)``, then ``wait()``) at the default
  ``compute.poll_interval_s``, every request the workspace got counted; baseline: the SDK's own
  ``MLClient.jobs.stream`` following the same kind of job;
* **start-up**: ``ddlkit --cfg job compute=azureml ...`` against ``ddlkit --cfg job`` (compute=local),
  and whether composing imported ``azure.ai.ml`` (``-X importtime``); for scale, importing
  ``azure.ai.ml`` alone.

    python benchmarks/azureml.py [--rounds 3 --follow-s 60]

Needs Azurite (``npm install -g azurite``) and ``pip install -e plugins/ddlkit-azure azure-ai-ml``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import summary, write_result

from ddlkit.jobdir import JOB_FILE
from ddlkit.testing.registry import LoopbackRegistry
from ddlkit_azure.testing import start_azurite, stop_azurite
from ddlkit_azure.testing.azureml import DEFAULT_DATASTORE, LoopbackWorkspace
from ddlkit_azure.testing.loopback import (
    CREDENTIAL_ENV,
    LoopbackServer,
    install_az,
    make_certificate,
    sdk_environment,
)

#: the image the jobs name (framework=fake has none of ddlkit's): in the loopback registry, for anyone to pull
FAKE_REPOSITORY, FAKE_TAG = "ddlkit/fake", "bench-cpu"
FAKE = (
    "framework=fake",
    "data.image_size=8",
    "data.length=32",
    "data.val_length=8",
    "data.num_classes=4",
    "trainer.batch_size=4",
    "trainer.epochs=1",
)
#: the code snapshot's package: its data module, and 48 more files that make it 50 files, 5 MB
USER_DATA = (
    "import numpy as np\n\n\ndef samples(split, n=32):\n"
    "    rng = np.random.default_rng(0 if split == 'train' else 1)\n"
    "    return rng.uniform(0, 1, (n, 8, 8, 3)).astype('float32'), rng.integers(0, 4, n)\n"
)
SNAPSHOT_FILES, SNAPSHOT_BYTES = 50, 5_000_000
CUSTOM = (
    "framework=fake",
    "data=custom",
    "data.target=my_pkg.data:samples",
    "data.num_classes=4",
    "data.image_size=8",
    "trainer.batch_size=4",
    "trainer.epochs=1",
)
TICKS = "import time\nfor i in range({n}):\n    print('tick', i, flush=True); time.sleep(0.5)"


def workspace_args(ws: LoopbackWorkspace, image: str) -> list[str]:
    return [
        "compute=azureml",
        f"compute.subscription_id={ws.subscription}",
        f"compute.resource_group={ws.resource_group}",
        f"compute.workspace={ws.workspace}",
        "compute.cluster=gpu-cluster",
        f"compute.image={image}",
    ]


def job_puts(server: LoopbackServer) -> list:
    return server.requests("PUT", r".*/workspaces/[^/]+/jobs/[^/]+")


def cli_submission(base: Path, ws: LoopbackWorkspace, image: str, i: int) -> dict[str, float]:
    """Wall time of ``ddlkit --detach`` on both targets; for azureml, also until the job's PUT arrived."""
    seen = len(job_puts(ws.server))
    t0_wall, t0 = time.time(), time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "--detach",
            *workspace_args(ws, image),
            *FAKE,
            f"hydra.run.dir={base / f'cli-azureml-{i}'}",
        ],
        check=True,
        capture_output=True,
        cwd=base,
    )
    azureml_s = time.monotonic() - t0
    accepted_s = job_puts(ws.server)[seen].time - t0_wall
    t0 = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlkit",
            "--detach",
            "compute=local",
            *FAKE,
            f"hydra.run.dir={base / f'cli-local-{i}'}",
        ],
        check=True,
        capture_output=True,
        cwd=base,
    )
    local_s = time.monotonic() - t0
    return {"azureml_cli_returned_s": azureml_s, "azureml_job_accepted_s": accepted_s, "local_cli_returned_s": local_s}


def user_package(project: Path) -> None:
    """``my_pkg`` in ``project``: its data module, and files of random bytes up to SNAPSHOT_FILES
    files of SNAPSHOT_BYTES in all (what a package with its vocabularies or small weights is)."""
    package = project / "my_pkg"
    (package / "assets").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text(USER_DATA)
    rest = SNAPSHOT_FILES - 2
    for i in range(rest):
        (package / "assets" / f"part_{i:02d}.bin").write_bytes(os.urandom(SNAPSHOT_BYTES // rest))


def snapshot_blobs(ws: LoopbackWorkspace) -> dict[str, str]:
    container = ws._service().get_container_client(ws.datastores[DEFAULT_DATASTORE])
    return {blob.name: blob.etag for blob in container.list_blobs(name_starts_with="ddlkit-code/")}


def snapshot_submission(base: Path, ws: LoopbackWorkspace, image: str, i: int) -> dict[str, float]:
    """``ddlkit --detach`` to the job accepted with the package's snapshot (a new tree, then the same
    tree again) and without one; how many of the snapshot's blobs each upload wrote."""
    project = base / "project"
    if not project.exists():
        user_package(project)
    (project / "my_pkg" / "__init__.py").write_text(f"ROUND = {i}\n")  # a new tree: a new snapshot
    row: dict[str, float] = {}
    for key, overrides in (
        ("first_with_snapshot", CUSTOM),
        ("second_with_snapshot", CUSTOM),
        ("without_snapshot", FAKE),
    ):
        seen, before = len(job_puts(ws.server)), snapshot_blobs(ws)
        job_dir = base / f"snapshot-{key}-{i}"
        t0_wall, t0 = time.time(), time.monotonic()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ddlkit",
                "--detach",
                *workspace_args(ws, image),
                *overrides,
                f"hydra.run.dir={job_dir}",
            ],
            check=True,
            capture_output=True,
            cwd=project,
        )
        row[f"{key}_cli_returned_s"] = time.monotonic() - t0
        put = job_puts(ws.server)[seen]
        row[f"{key}_job_accepted_s"] = put.time - t0_wall
        after = snapshot_blobs(ws)
        row[f"{key}_blobs_uploaded"] = sum(1 for name, tag in after.items() if before.get(name) != tag)
        job = ws.wait(put.path.rsplit("/", 1)[-1])
        assert job.state == "Completed", (key, job.states, job.error)
    return row


def target(ws: LoopbackWorkspace, image: str, **changes: object):
    from omegaconf import OmegaConf

    from ddlkit_azure.azureml import AzureMLConfig, AzureMLTarget

    cfg = AzureMLConfig(
        subscription_id=ws.subscription,
        resource_group=ws.resource_group,
        workspace=ws.workspace,
        cluster="gpu-cluster",
        image=image,
        framework="fake",
        dist="none",
        data_root=None,
        storage="local",
    )
    return AzureMLTarget(OmegaConf.merge(OmegaConf.structured(cfg), changes))


def in_process_submission(
    base: Path, ws: LoopbackWorkspace, registry: LoopbackRegistry, image: str, i: int
) -> dict[str, float]:
    """``AzureMLTarget.submit`` vs the SDK's bare ``create_or_update`` of the same job (warm client)."""
    from azure.ai.ml import Output, command
    from azure.ai.ml.entities import Environment

    from ddlkit.interfaces import JobSpec

    tgt = target(ws, image)
    client = tgt.workspace.client
    job_dir = base / f"inproc-{i}"
    job_dir.mkdir()
    (job_dir / JOB_FILE).write_text("{}")
    spec = JobSpec(name=f"bench-{i}", job_dir=job_dir, args=("-c", "print('hi')"))
    before, asked = len(ws.server.requests()), len(registry.requests)
    t0 = time.monotonic()
    tgt.submit(spec)
    ddlkit_s, ddlkit_calls = time.monotonic() - t0, len(ws.server.requests()) - before
    image_check_calls = len(registry.requests) - asked

    bare = base / f"bare-{i}"
    bare.mkdir()
    (bare / JOB_FILE).write_text("{}")
    before = len(ws.server.requests())
    t0 = time.monotonic()
    with contextlib.redirect_stderr(io.StringIO()):
        client.jobs.create_or_update(
            command(
                name=f"bare-{i}-{os.getpid()}",
                code=str(bare),
                command="python -c \"print('hi')\"",
                environment=Environment(image=image),
                compute="gpu-cluster",
                outputs={"job_dir": Output(type="uri_folder", mode="rw_mount")},
            )
        )
    bare_s, bare_calls = time.monotonic() - t0, len(ws.server.requests()) - before
    return {
        "ddlkit_submit_s": ddlkit_s,
        "ddlkit_requests": ddlkit_calls,
        "ddlkit_image_check_requests": image_check_calls,
        "bare_sdk_submit_s": bare_s,
        "bare_sdk_requests": bare_calls,
    }


def follow_ddlkit(base: Path, ws: LoopbackWorkspace, image: str, follow_s: float) -> dict[str, float]:
    from ddlkit.interfaces import JobSpec

    tgt = target(ws, image)  # the default compute.poll_interval_s
    job_dir = base / "follow-ddlkit"
    job_dir.mkdir()
    (job_dir / JOB_FILE).write_text("{}")
    handle = tgt.submit(JobSpec(name="follow", job_dir=job_dir, args=("-c", TICKS.format(n=int(follow_s * 2)))))
    before = len(ws.server.requests())
    t0 = time.monotonic()
    text = "".join(handle.logs(follow=True))
    status = handle.wait()
    elapsed = time.monotonic() - t0
    calls = len(ws.server.requests()) - before
    assert status.state.value == "succeeded" and f"tick {int(follow_s * 2) - 1}" in text, (status, text[-300:])
    return {
        "poll_interval_s": tgt.cfg.poll_interval_s,
        "followed_s": elapsed,
        "requests": calls,
        "requests_per_job_minute": calls / (elapsed / 60),
    }


def follow_sdk_stream(base: Path, ws: LoopbackWorkspace, image: str, follow_s: float) -> dict[str, float]:
    from azure.ai.ml import command
    from azure.ai.ml.entities import Environment

    client = target(ws, image).workspace.client
    code = base / "follow-sdk"
    code.mkdir()
    (code / "ticks.py").write_text(TICKS.format(n=int(follow_s * 2)))
    with contextlib.redirect_stderr(io.StringIO()):
        job = client.jobs.create_or_update(
            command(
                name=f"stream-{os.getpid()}",
                code=str(code),
                command="python ticks.py",
                compute="gpu-cluster",
                environment=Environment(image=image),
            )
        )
    before = len(ws.server.requests())
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        client.jobs.stream(job.name)
    elapsed = time.monotonic() - t0
    calls = len(ws.server.requests()) - before
    assert f"tick {int(follow_s * 2) - 1}" in out.getvalue(), out.getvalue()[-300:]
    return {"followed_s": elapsed, "requests": calls, "requests_per_job_minute": calls / (elapsed / 60)}


def startup(base: Path, ws: LoopbackWorkspace, image: str, rounds: int) -> dict:
    azureml = [sys.executable, "-m", "ddlkit", "--cfg", "job", *workspace_args(ws, image)]
    local = [sys.executable, "-m", "ddlkit", "--cfg", "job"]
    sdk = [sys.executable, "-c", "import azure.ai.ml"]
    times: dict[str, list[float]] = {
        "ddlkit_cfg_job_azureml_s": [],
        "ddlkit_cfg_job_local_s": [],
        "import_azure_ai_ml_s": [],
    }
    for _ in range(rounds):
        for key, argv in zip(times, (azureml, local, sdk), strict=True):
            t0 = time.monotonic()
            subprocess.run(argv, check=True, capture_output=True, cwd=base)
            times[key].append(time.monotonic() - t0)
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", *azureml[1:]], capture_output=True, text=True, cwd=base, check=True
    ).stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in trace.splitlines() if "|" in line}
    return {
        **{k: summary(v) for k, v in times.items()},
        "imports_ddlkit_azure_azureml": "ddlkit_azure.azureml" in imported,
        "imports_azure_ai_ml": any(m.startswith("azure.ai.ml") for m in imported),
        "imports_azure_identity": any(m.startswith("azure.identity") for m in imported),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--follow-s", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddlkit-bench-azureml-") as tmp:
        base = Path(tmp)
        azurite = start_azurite(base / "azurite")
        cert = make_certificate(base / "tls")
        try:
            with (
                LoopbackServer(cert) as server,
                LoopbackWorkspace(server, azurite, base / "workspace") as ws,
                LoopbackRegistry((cert.cert_file, cert.key_file), public={FAKE_REPOSITORY}) as registry,
            ):
                image = registry.push(FAKE_REPOSITORY, FAKE_TAG)
                for name in CREDENTIAL_ENV:
                    os.environ.pop(name, None)
                os.environ.update(sdk_environment(cert, install_az(base / "bin")))
                os.environ.update(ws.environment)
                os.environ.update({"DDLKIT_PLUGINS": "ddlkit.testing.fakes", "DDLKIT_STATE_DIR": str(base / "state")})
                cli = [cli_submission(base, ws, image, i) for i in range(args.rounds)]
                snapshot = [snapshot_submission(base, ws, image, i) for i in range(args.rounds)]
                inproc = [in_process_submission(base, ws, registry, image, i) for i in range(args.rounds)]
                follow = follow_ddlkit(base, ws, image, args.follow_s)
                stream = follow_sdk_stream(base, ws, image, args.follow_s)
                start = startup(base, ws, image, args.rounds)
                proxied = sorted({host for host, _ in ws.proxy.connects})
        finally:
            stop_azurite(azurite.process)

    def med(rows: list[dict], k: str) -> dict:
        return summary([r[k] for r in rows])

    payload = {
        "endpoint": "loopback Azure ML workspace (ddlkit_azure.testing.azureml): real azure-ai-ml "
        f"{__import__('importlib.metadata').metadata.version('azure-ai-ml')}, HTTPS on 127.0.0.1, "
        f"blob traffic via the intercepting proxy to Azurite (hosts: {', '.join(proxied)}); "
        "the jobs' image in a loopback registry (ddlkit.testing.registry) on 127.0.0.1",
        "submission_cli": {k: med(cli, k) for k in cli[0]},
        "submission_cli_code_snapshot": {
            "snapshot": f"{SNAPSHOT_FILES} files, {SNAPSHOT_BYTES / 1e6:g} MB",
            **{k: med(snapshot, k) for k in snapshot[0]},
        },
        "submission_in_process": {k: med(inproc, k) for k in inproc[0]},
        "following": {
            "ddlkit": follow,
            "sdk_jobs_stream": stream,
            "ratio_sdk_over_ddlkit": stream["requests_per_job_minute"] / follow["requests_per_job_minute"],
        },
        "startup": start,
    }
    path = write_result("azureml", payload)
    print(json.dumps(payload, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
