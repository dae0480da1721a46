"""Entry-point targets for tests/test_plugins.py: a good plugin (ok), one whose import fails
(broken), one registering a name that ok registers too (dup), and one with a hook
implementation that does not match its spec (invalid, in a group of its own)."""
