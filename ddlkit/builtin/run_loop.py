"""The default ``ddlkit_run_loop``: prepare the data, then let the framework train.

Registered ``trylast`` so a plugin's own loop (or a wrapper around this one) takes precedence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..interfaces import RunContext


@hookimpl(trylast=True)
def ddlkit_run_loop(run: RunContext) -> bool:
    run.data.prepare(run)
    run.framework.train(run)
    return True
