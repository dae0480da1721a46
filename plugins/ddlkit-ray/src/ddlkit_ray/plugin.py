"""Registers ``compute=ray``. Hook implementations only: nothing heavy at import (Ray is imported
when a job is submitted or followed)."""

from __future__ import annotations

import ddlkit


@ddlkit.hookimpl
def ddlkit_compute_targets():
    yield ddlkit.Registration(
        "ray",
        "ddlkit_ray.target:RayTarget",
        config="ddlkit_ray.target:RayConfig",
        description="one Ray job (Jobs API) per ddlkit job, nodes x procs_per_node ranks placed "
        "as a gang; the user's code travels with it, files come back by collect",
    )
