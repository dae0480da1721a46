"""A plugin whose import fails, as one with a missing dependency does."""

import ddlkit_fake_missing_dependency  # noqa: F401 -- the import is the point: it fails
