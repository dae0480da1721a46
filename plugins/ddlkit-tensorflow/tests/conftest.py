"""The plugin's tests load ddlkit's test kit: the jobs they submit are recorded in a state directory
of the session's own, never in the user's ``ddlkit jobs list``."""

pytest_plugins = ["ddlkit.testing"]
