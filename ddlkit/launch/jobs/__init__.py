"""The launcher's side of submitted jobs: processes on this machine (:mod:`.process`), the index
that lets ``ddlkit jobs`` find a job again (:mod:`.index`), and the ``ddlkit jobs`` command
(:mod:`.cli`)."""
