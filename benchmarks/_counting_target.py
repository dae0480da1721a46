"""``compute=counted``: compute=elsewhere (a stand-in remote cluster) whose handles count the
calls a launcher makes on them; each job's counts land in ``<compute.root>/calls/<job>.json``
when the launcher collects it. Loaded with ``DDLKIT_PLUGINS=_counting_target`` by
``benchmarks/remote_polling.py``."""

from __future__ import annotations

import json
import os
import time

from ddlkit import hookimpl
from ddlkit.registry import Registration
from ddlkit.testing.elsewhere import ElsewhereComputeConfig, ElsewhereHandle, ElsewhereTarget


class CountingHandle(ElsewhereHandle):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = {"status": 0, "logs": 0, "wait": 0}
        self.t0 = time.monotonic()

    def status(self):
        self.calls["status"] += 1
        return super().status()

    def logs(self, follow: bool = True):
        self.calls["logs"] += 1
        return super().logs(follow)

    def wait(self, timeout: float | None = None):
        self.calls["wait"] += 1
        return super().wait(timeout)

    def collect(self) -> None:
        super().collect()
        out = self.remote.job_dir.parent / "calls" / f"{self.name}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({**self.calls, "watched_s": time.monotonic() - self.t0}))


class CountingTarget(ElsewhereTarget):
    def submit(self, spec):
        inner = super().submit(spec)
        return CountingHandle(inner.remote, inner.name, inner.job_dir)


@hookimpl
def ddlkit_compute_targets():
    yield Registration(
        "counted",
        CountingTarget,
        config=ElsewhereComputeConfig,
        description="compute=elsewhere, counting the launcher's calls (benchmarks)",
    )


@hookimpl
def ddlkit_job_environment(config):
    # DDLKIT_PLUGINS names this module, which the ranks (a bare environment) must import too
    return {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
