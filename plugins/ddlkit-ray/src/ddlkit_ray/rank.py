"""What a ``compute=ray`` rank actor starts, in the rank's job directory on its node:
``python -m ddlkit_ray.rank -- COMMAND...`` (COMMAND: the ddlkit worker).

It runs COMMAND under ddlkit's rank minder (:mod:`ddlkit.compute.rank_minder`: ``rank-N.log``,
the exit record, signals, no orphans). The rank's place in the job comes from the variables its
actor set (:data:`ddlkit_ray.driver.LAYOUT`): the driver knows the gang's layout, so there is
nothing to translate. Standard library and the rank minder only: it starts once per rank.
"""

from __future__ import annotations

import os
import sys

from ddlkit.compute import rank_minder as minder
from ddlkit.compute.layout import RankLayout

#: how many of a failed rank's last lines reach the console (the handle's message quotes its end)
TAIL_LINES = 15
#: what the actor sets and the minder passes on (the rank minder requires ddlkit's node layout)
VARIABLES = RankLayout.variables()


def main(argv: list[str] | None = None) -> int:
    minder.forward_signals()  # first of all: a stop request while this rank starts must not kill it
    command = minder.entry_command(sys.argv[1:] if argv is None else argv, "ddlkit_ray.rank")
    if command is None:
        return 2
    variables = {key: os.environ[key] for key in VARIABLES if key in os.environ}
    return minder.run(
        command, rank=int(variables["RANK"]), variables=variables, name="ddlkit_ray", tail_lines=TAIL_LINES
    )


if __name__ == "__main__":
    sys.exit(main())
