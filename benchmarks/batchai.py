"""compute=batchai against the loopback Batch AI service (the real azure-mgmt-batchai 7.0.0 client
over HTTPS on 127.0.0.1, jobs run on this machine; no Azure service is contacted).

* **requests and time per submission**: ``BatchAITarget.submit`` of a job whose resources are all
  new (workspace, experiment, NFS file server, cluster: each created, a long-running operation),
  then of a second job that reuses them all, in a fresh loopback service per round. Every request
  the service got is counted (Batch AI, and Azure Files for the job directory), and apart from them
  the image check's requests to the registry (a loopback one, ``ddlkit.testing.registry``, that the
  service's nodes pull from). The service answers
  ``Retry-After: 0``; azure-core takes a 0 for no header and waits the client's polling interval,
  which compute=batchai sets to ``compute.poll_interval_s``: measured at 0.05 s (``--poll``) and,
  once, at its default of 5 s;
* **staging into the file server**: a dataset of ImageNet-sized files in Azurite, copied onto the
  file server (a directory of this machine standing for the NFS export) by compute=batchai's
  staging job (the whole step: the job's creation, its process, ddlkit's verified parallel copy,
  and the launcher seeing it succeed), against the same files copied into a directory by
  ``ddlkit data upload`` (today's way to put a dataset on a share, from a local copy); and the
  second staging of the same dataset (skipped: one look-up).

    python benchmarks/batchai.py [--rounds 3 --files 400 --kb 110]

Needs Azurite (``npm install -g azurite``) and ``pip install -e 'plugins/ddlkit-azure[batchai]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import summary, write_result

from ddlkit import JOB_FILE, JobSpec, __version__
from ddlkit.testing.registry import LoopbackRegistry
from ddlkit_azure.batchai import (
    BatchAIConfig,
    BatchAITarget,
    ClusterSettings,
    FileShareSettings,
)
from ddlkit_azure.batchai_client import ACCOUNT_KEY_ENV, Service
from ddlkit_azure.testing import start_azurite, stop_azurite
from ddlkit_azure.testing.batchai import FILES_KEY, BatchAILoopback
from ddlkit_azure.testing.loopback import (
    CREDENTIAL_ENV,
    LoopbackServer,
    install_az,
    make_certificate,
    sdk_environment,
)


def configure(service: BatchAILoopback, key: Path, poll: float, **more: object) -> BatchAIConfig:
    """The target's config; ddlkit's images from the registry the service's nodes pull from, where it has one."""
    if service.registry is not None:
        more.setdefault("registry", f"{service.registry.host}/ddlkit")
    return BatchAIConfig(
        subscription_id="bench",
        resource_group="rg",
        workspace="ws",
        endpoint=service.server.url,
        gpu=False,
        poll_interval_s=poll,
        framework="pytorch",
        storage="nfs",
        cluster=ClusterSettings(vm_size="Standard_D4_v2", ssh_public_key_file=str(key)),
        file_share=FileShareSettings(url=service.share_url),
        **more,
    )


def job_dir(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / JOB_FILE).write_text(json.dumps({"benchmark": name}))
    return path


def counted(server: LoopbackServer) -> dict[str, int]:
    kinds = Counter(
        "azure files"
        if not r.path.startswith("/subscriptions/")
        else f"{r.method} {'operation poll' if '/operationresults/' in r.path else 'batch ai'}"
        for r in server.requests()
    )
    return dict(sorted(kinds.items())) | {"total": sum(kinds.values())}


def submissions(tmp: Path, cert: object, key: Path, poll: float, rounds: int) -> dict[str, object]:
    first_s: list[float] = []
    second_s: list[float] = []
    first_n: dict[int, dict[str, int]] = {}
    second_n: dict[int, dict[str, int]] = {}
    checked = 0
    for number in range(rounds):
        root = tmp / f"submit-{poll}-{number}"
        with (
            LoopbackServer(cert) as server,
            LoopbackRegistry((cert.cert_file, cert.key_file), public={"ddlkit/pytorch"}) as registry,
        ):
            registry.push("ddlkit/pytorch", f"{__version__}-cpu")
            service = BatchAILoopback(server, root / "service", registry=registry)
            target = BatchAITarget(configure(service, key, poll))
            quiet = contextlib.redirect_stderr(io.StringIO())
            for name, times, counts in (("first", first_s, first_n), ("second", second_s, second_n)):
                spec = JobSpec(name=f"bench-{name}", job_dir=job_dir(root, name), args=("-c", "pass"))
                server.clear()
                registry.requests.clear()
                with quiet:
                    t0 = time.perf_counter()
                    handle = target.submit(spec)
                    times.append(time.perf_counter() - t0)
                counts[number] = counted(server)
                checked = len(registry.requests)
                handle.wait(60)
            service.stop()
    return {
        "poll_interval_s": poll,
        "first_job_s": summary(first_s),
        "second_job_s": summary(second_s),
        # the same in every round: the last round's
        "first_job_requests": first_n[rounds - 1],
        "second_job_requests": second_n[rounds - 1],
        "image_check_requests_per_job": checked,
    }


def staging(tmp: Path, cert: object, key: Path, files: int, kb: int) -> dict[str, object]:
    from ddlkit.launch.data_cli import upload
    from ddlkit.storage import build_manifest

    data = tmp / "dataset"
    for i in range(files):
        folder = data / "train" / f"n{i % 20:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.JPEG").write_bytes(os.urandom(kb * 1024 + (i * 977) % 4096))
    build_manifest(data).write(data / "manifest.tsv")
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    azurite = start_azurite(tmp / "azurite")
    try:
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            upload(data, "blob://bench/dataset", workers=16)
            t0 = time.perf_counter()
            upload(data, str(tmp / "share-by-upload" / "datasets" / "dataset"), workers=16)
            upload_s = time.perf_counter() - t0
        with LoopbackServer(cert) as server:
            service = BatchAILoopback(server, tmp / "staging-service")
            said: list[str] = []
            cfg = configure(service, key, 0.05, stage_from="blob://bench/dataset", data_root="datasets/dataset")
            client = Service(cfg, say=said.append)
            cluster, _ = client.prepare()
            t0 = time.perf_counter()
            client.stage(cluster)
            stage_s = time.perf_counter() - t0
            (job,) = [r.path.rsplit("/", 1)[-1] for r in server.requests("PUT", r".*/jobs/stage-.*")]
            report = json.loads(next(ln for ln in client.stdout_tail(job) if ln.startswith("{")))["staging"]
            t0 = time.perf_counter()
            client.stage(cluster)
            again_s = time.perf_counter() - t0
            staged = service.file_server_dir("ddlkit-nfs") / "datasets" / "dataset"
            assert sum(1 for p in staged.rglob("*.JPEG")) == files, "the staging copied the wrong files"
            service.stop()
    finally:
        stop_azurite(azurite.process)
    return {
        "files": files,
        "dataset_bytes": total,
        "staging_step_s": stage_s,
        "stage_copy_s": report["seconds"],
        "ddlkit_data_upload_s": upload_s,
        "staging_step_mb_per_s": total / 1e6 / stage_s,
        "stage_copy_mb_per_s": total / 1e6 / report["seconds"],
        "ddlkit_data_upload_mb_per_s": total / 1e6 / upload_s,
        "ratio_step_vs_upload": upload_s / stage_s,
        "ratio_copy_vs_upload": upload_s / report["seconds"],
        "second_staging_s": again_s,
        "second_staging_said": said[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--poll", type=float, default=0.05)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--kb", type=int, default=110)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cert = make_certificate(tmp / "tls")
        for name in CREDENTIAL_ENV:
            os.environ.pop(name, None)
        os.environ.update(sdk_environment(cert, install_az(tmp / "az")))
        os.environ[ACCOUNT_KEY_ENV] = FILES_KEY
        os.environ["DDLKIT_STATE_DIR"] = str(tmp / "state")
        key = tmp / "id.pub"
        key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJlbmNobWFyaw bench\n")
        fast = submissions(tmp, cert, key, args.poll, args.rounds)
        default = submissions(tmp, cert, key, 5.0, 1)
        staged = staging(tmp, cert, key, args.files, args.kb)
    for result in (fast, default):
        print(
            f"poll {result['poll_interval_s']} s: first job {result['first_job_s']['median']:.2f} s "
            f"({result['first_job_requests']['total']} requests), second "
            f"{result['second_job_s']['median']:.2f} s ({result['second_job_requests']['total']})"
        )
    print(
        f"staging {staged['dataset_bytes'] / 1e6:.1f} MB: step {staged['staging_step_s']:.2f} s "
        f"({staged['staging_step_mb_per_s']:.1f} MB/s; the copy itself {staged['stage_copy_mb_per_s']:.1f} MB/s) vs "
        f"ddlkit data upload {staged['ddlkit_data_upload_s']:.2f} s "
        f"({staged['ddlkit_data_upload_mb_per_s']:.1f} MB/s):"
        f" {staged['ratio_step_vs_upload']:.2f}x; again: {staged['second_staging_s']:.2f} s"
    )
    path = write_result(
        "batchai",
        {
            "benchmark": "batchai",
            "config": vars(args),
            "submission": fast,
            "submission_default_poll": default,
            "staging": staged,
        },
    )
    print(f"-> {path}")


if __name__ == "__main__":
    main()
