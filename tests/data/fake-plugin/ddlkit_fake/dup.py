"""Registers storage=fake-ok too, which ddlkit_fake.ok already registered."""

from ddlkit import Registration, hookimpl
from ddlkit.testing.fakes import MemoryStorage


@hookimpl
def ddlkit_storage_backends():
    yield Registration("fake-ok", MemoryStorage, description="registered by ddlkit_fake.dup")
