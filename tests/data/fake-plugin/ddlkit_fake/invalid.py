"""Implements ddlkit_step_end with an argument the hook spec does not offer."""

from ddlkit import hookimpl


@hookimpl
def ddlkit_step_end(run, step, loss):
    pass
