"""The ``ddlkit jobs`` command (:mod:`.cli`): list, status, logs, attach and cancel of submitted
jobs, found again through the launcher's job index (:mod:`ddlkit.launch.index`)."""
