"""A well-behaved plugin: registers storage=fake-ok."""

from ddlkit import Registration, hookimpl
from ddlkit.testing.fakes import MemoryStorage


@hookimpl
def ddlkit_storage_backends():
    yield Registration("fake-ok", MemoryStorage, description="registered by ddlkit_fake.ok")
