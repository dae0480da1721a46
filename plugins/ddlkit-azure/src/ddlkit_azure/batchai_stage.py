"""What ``compute=batchai``'s staging job runs on a cluster node:
``python -m ddlkit_azure.batchai_stage blob://container/prefix DEST``.

It copies the dataset onto the file server the node mounts (``DEST``, below
``$AZ_BATCHAI_MOUNT_ROOT``) with ddlkit's own staging (:func:`ddlkit.storage.stage`): the
files its ``manifest.tsv`` lists, in parallel, each checked against its size and SHA-256 before it
is renamed into place; a copy that already matches transfers nothing. The blob credentials come
from the job's environment (its ``secrets``). Prints one JSON line, the staging report; exit
status 2 with one line for a problem the user fixes, 1 for a failed copy.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ddlkit.errors import DdlkitError, exit_code_for
from ddlkit.storage import open_storage, stage

#: files copied at once
WORKERS = 16


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m ddlkit_azure.batchai_stage blob://container/prefix DEST", file=sys.stderr)
        return 2
    source, dest = argv[0], Path(os.path.expandvars(argv[1]))
    try:
        report = stage(open_storage(source), dest, describe=source, workers=WORKERS, live=False)
    except DdlkitError as err:
        print(f"ddlkit: error: {err}", file=sys.stderr)
        return exit_code_for(err)
    print(json.dumps({"staging": report.as_dict()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
