"""Blob -> local SSD staging: ddlkit's ``stage`` against what a user would write, on Azurite.

A dataset of ImageNet-sized files (about 110 KB each) is uploaded once with ``ddlkit data
upload``; then, into fresh directories, in one run:

* ddlkit: ``storage=local_ssd``'s staging (files in parallel, each hash-verified against the manifest);
* sequential: a plain loop of ``download_blob(name).readinto(file)``, one blob after the other;
* SDK parallel: the same loop with ``download_blob(..., max_concurrency=N)``, the SDK's own
  parallelism (which splits one large blob into ranges; ImageNet's blobs are single ranges);
* ddlkit again into the same directory: it must transfer 0 bytes.

Needs ``azurite-blob`` (``npm install -g azurite``).

    python benchmarks/staging.py [--files 600 --kb 110 --workers 16]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import write_result


def make_files(root: Path, files: int, kb: int) -> None:
    for i in range(files):
        folder = root / "train" / f"n{i % 20:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.JPEG").write_bytes(os.urandom(kb * 1024 + (i * 977) % 4096))


def download_all(container: object, names: list[str], dest: Path, max_concurrency: int) -> None:
    for name in names:
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            container.download_blob(name, max_concurrency=max_concurrency).readinto(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=600)
    ap.add_argument("--kb", type=int, default=110)
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args()

    from azure.storage.blob import BlobServiceClient

    from ddlkit.launch.data_cli import upload
    from ddlkit.storage import build_manifest, open_storage, stage
    from ddlkit_azure.testing import start_azurite, stop_azurite

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        server = start_azurite(tmp / "azurite")
        try:
            os.environ["AZURE_STORAGE_CONNECTION_STRING"] = server.connection_string
            src = tmp / "src"
            make_files(src, args.files, args.kb)
            build_manifest(src).write(src / "manifest.tsv")
            url = "blob://bench/imagenet"
            t0 = time.perf_counter()
            upload(src, url, workers=args.workers)
            upload_s = time.perf_counter() - t0
            total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())

            container = BlobServiceClient.from_connection_string(server.connection_string).get_container_client("bench")
            names = sorted(b.name for b in container.list_blobs(name_starts_with="imagenet/"))
            timings = {}
            t0 = time.perf_counter()
            download_all(container, names, tmp / "sequential", 1)
            timings["sequential_download_blob"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            download_all(container, names, tmp / "sdk_parallel", args.workers)
            timings["sdk_max_concurrency"] = time.perf_counter() - t0
            first = stage(open_storage(url), tmp / "ssd", describe=url, workers=args.workers, live=False)
            timings["ddlkit_stage"] = first.seconds
            second = stage(open_storage(url), tmp / "ssd", describe=url, workers=args.workers, live=False)
        finally:
            stop_azurite(server.process)
    mb_s = {name: total / 1e6 / s for name, s in timings.items()}
    for name, s in timings.items():
        print(f"{name}: {s:.2f}s, {mb_s[name]:.1f} MB/s")
    print(f"second staging: {second.bytes_transferred} bytes in {second.seconds:.2f}s")
    path = write_result(
        "staging",
        {
            "benchmark": "staging",
            "config": vars(args),
            "dataset_bytes": total,
            "blobs": len(names),
            "upload_s": round(upload_s, 3),
            "seconds": timings,
            "mb_per_s": mb_s,
            "ratio_vs_sequential": timings["sequential_download_blob"] / timings["ddlkit_stage"],
            "ratio_vs_sdk_parallel": timings["sdk_max_concurrency"] / timings["ddlkit_stage"],
            "first_staging": first.as_dict(),
            "second_staging": second.as_dict(),
            "second_staging_bytes": second.bytes_transferred,
        },
    )
    print(
        f"ddlkit staging {mb_s['ddlkit_stage'] / mb_s['sequential_download_blob']:.2f}x the sequential loop, "
        f"{mb_s['ddlkit_stage'] / mb_s['sdk_max_concurrency']:.2f}x the SDK's max_concurrency -> {path}"
    )


if __name__ == "__main__":
    main()
