"""The provider interface: how the pool gets, resets and gives back VMs, whatever cloud (or none)."""

from __future__ import annotations

from typing import Protocol


class ProviderError(RuntimeError):
    """A provider operation failed (the VM could not be created, reset or deleted)."""


class Provider(Protocol):
    """Creates and manages VMs. Every method has its own timeout; the pool never knows which cloud.

    A VM is named by the id `create` returns; `address` is what a `VMClient` connects to
    (`http://HOST:PORT` for a network VM, `unix:///PATH` for a local one)."""

    async def create(self, tag: str) -> str:
        """A new, ready VM tagged `tag` (the pool's or the run's name)."""
        ...

    def address(self, vm_id: str) -> str:
        """Where the VM's server listens."""
        ...

    async def reset(self, vm_id: str) -> None:
        """Bring the VM back to its pristine state and wait until it is ready again."""
        ...

    async def delete(self, vm_id: str) -> None:
        """Destroy the VM (idempotent)."""
        ...

    async def list(self, tag: str) -> list[str]:
        """Ids of the VMs carrying `tag` (to find and reap leftovers)."""
        ...
