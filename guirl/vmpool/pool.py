"""`VMPool`: a bounded set of VMs from one provider, leased to env workers.

Pre-warms VMs with bounded concurrency, leases them with a heartbeat (a lease whose holder stops
beating is taken back), resets a VM when it is released, health-checks every VM on a period and replaces
one that stops answering (its lease, if any, is marked broken: an environment fault, never a policy
failure) — a leased VM that answered its holder within the period (`heard`) is not probed — and keeps counts
that always add up. It never knows which provider it drives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from guirl.vmpool.client import VMClient
from guirl.vmpool.provider import Provider

log = logging.getLogger(__name__)


class PoolError(RuntimeError):
    """No VM could be had (pool closed, or none free within the timeout)."""


@dataclass
class Lease:
    """A VM lent to one holder until it is released (or broken, or expired)."""

    lease_id: str
    vm_id: str
    address: str
    acquired_at: float = field(default_factory=time.monotonic)
    last_beat: float = field(default_factory=time.monotonic)
    broken: str = ""  # why the VM was taken away (it died), or "" while it is usable
    heard_at: float = 0.0  # when the VM last answered its holder (`VMPool.heard`): no probe needed then


@dataclass
class _VM:
    vm_id: str
    address: str
    state: str = "idle"  # idle | busy | resetting
    lease: Lease | None = None
    generation: int = 0  # bumped at every reset: a health verdict about an older generation is stale
    idle_since: float = field(default_factory=time.monotonic)


class VMPool:
    """VMs from `provider`, at most `max_envs` at once."""

    def __init__(
        self,
        provider: Provider,
        *,
        tag: str = "guirl",
        max_envs: int = 4,
        prewarm: int = 0,
        prewarm_concurrency: int = 4,
        lease_ttl_s: float = 120.0,
        idle_ttl_s: float = 600.0,
        health_interval_s: float = 5.0,
        health_timeout_s: float = 5.0,
    ) -> None:
        self.provider = provider
        self.tag = tag
        self.max_envs = max_envs
        self.prewarm = min(prewarm, max_envs)
        self.lease_ttl_s = lease_ttl_s
        self.idle_ttl_s = idle_ttl_s
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self._create_slots = asyncio.Semaphore(max(1, prewarm_concurrency))
        self._vms: dict[str, _VM] = {}
        self._leases: dict[str, Lease] = {}
        self._starting = 0
        self._changed = asyncio.Condition()
        self._monitor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # resets the pool owns
        self._closed = False
        self.counters = {
            "created": 0,
            "failed": 0,
            "replaced": 0,
            "resets": 0,
            "leases": 0,
            "expired": 0,
            "retired": 0,
        }
        self._reset_s: list[float] = []

    # -- life ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Pre-warm `prewarm` VMs (at most `prewarm_concurrency` being created at once) and start the
        health monitor."""
        reap = getattr(self.provider, "reap", None)
        if reap is not None:  # a cloud's leftovers of this pool's tag, from runs that are gone
            self.counters["reaped"] = len(await reap(self.tag))
        results = await asyncio.gather(*(self._add_vm() for _ in range(self.prewarm)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:  # do not leave the VMs that did start behind
            await self.close()
            raise failures[0]
        self._monitor = asyncio.create_task(self._watch(), name="vmpool-monitor")

    async def close(self) -> None:
        """Delete every VM; leases become broken."""
        self._closed = True
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for lease in self._leases.values():
            lease.broken = lease.broken or "the pool closed"
        if self._tasks:  # let resets in flight finish before their VMs are deleted
            await asyncio.gather(*self._tasks, return_exceptions=True)
        vms, self._vms = list(self._vms.values()), {}
        results = await asyncio.gather(*(self.provider.delete(v.vm_id) for v in vms), return_exceptions=True)
        for vm, result in zip(vms, results, strict=True):
            if isinstance(result, BaseException):  # a cloud VM left running until its TTL or the reaper
                self.counters["delete_failed"] = self.counters.get("delete_failed", 0) + 1
                log.error("could not delete VM %s on close: %s", vm.vm_id, result)
        async with self._changed:
            self._changed.notify_all()

    async def __aenter__(self) -> VMPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- leasing ------------------------------------------------------------------------------------

    async def acquire(self, timeout: float = 600.0) -> Lease:
        """A ready VM: an idle one, a new one if under `max_envs`, else the next one released."""
        deadline = time.monotonic() + timeout
        async with self._changed:
            while True:
                if self._closed:
                    raise PoolError("the pool is closed")
                idle = next((v for v in self._vms.values() if v.state == "idle"), None)
                if idle is not None:
                    return self._lend(idle)
                if len(self._vms) + self._starting < self.max_envs:
                    self._starting += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PoolError(f"no VM free within {timeout:.0f} s ({self.metrics()})")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
        vm = await self._add_vm(reserved=True)
        async with self._changed:
            return self._lend(vm)

    def _lend(self, vm: _VM) -> Lease:
        lease = Lease(lease_id=uuid.uuid4().hex[:12], vm_id=vm.vm_id, address=vm.address)
        vm.state, vm.lease = "busy", lease
        self._leases[lease.lease_id] = lease
        self.counters["leases"] += 1
        return lease

    def heartbeat(self, lease_id: str) -> None:
        """The holder is still using its VM (call more often than `lease_ttl_s`)."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise PoolError(f"unknown lease {lease_id}")
        lease.last_beat = time.monotonic()

    def heard(self, lease: Lease) -> None:
        """The leased VM just answered its holder: the health monitor need not probe it this period (with a
        thousand desktops, a probe of each every few seconds is most of an env worker's work)."""
        lease.heard_at = time.monotonic()

    async def release(self, lease_id: str) -> None:
        """Give a VM back: it is reset to pristine, then lent again (or replaced if the reset fails)."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return
        vm = self._vms.get(lease.vm_id)
        if vm is None:  # already replaced (it died while leased)
            return
        # the pool owns the reset: a caller cancelled mid-release must not strand the VM in "resetting"
        task = asyncio.create_task(self._reset(vm), name=f"reset:{vm.vm_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.shield(task)

    # -- internals ----------------------------------------------------------------------------------

    async def _add_vm(self, reserved: bool = False, lend: bool = True) -> _VM:
        """A new VM. `reserved`: the caller already counted it in `_starting`; `lend`: it is for the
        caller to lend (busy), not to wait idle."""
        if not reserved:
            async with self._changed:
                self._starting += 1
        busy = reserved and lend
        try:
            async with self._create_slots:
                vm_id = await self.provider.create(self.tag)
        except BaseException:
            async with self._changed:
                self._starting -= 1
                self.counters["failed"] += 1
                self._changed.notify_all()
            raise
        if self._closed:  # the pool closed while this VM was being made: do not leak it
            async with self._changed:
                self._starting -= 1
            with contextlib.suppress(Exception):
                await self.provider.delete(vm_id)
            raise PoolError("the pool closed")
        vm = _VM(vm_id=vm_id, address=self.provider.address(vm_id), state="busy" if busy else "idle")
        async with self._changed:
            self._starting -= 1
            self._vms[vm_id] = vm
            self.counters["created"] += 1
            self._changed.notify_all()
        return vm

    async def _reset(self, vm: _VM) -> None:
        vm.state, vm.lease = "resetting", None
        vm.generation += 1
        t = time.monotonic()
        try:
            await self.provider.reset(vm.vm_id)
        except BaseException as exc:  # a VM that could not be reset is replaced, not trusted
            log.warning("reset of %s failed (%s); replacing it", vm.vm_id, exc)
            await self._replace(vm, f"reset failed: {exc}")
            return
        self._reset_s.append(time.monotonic() - t)
        self._reset_s = self._reset_s[-1000:]
        self.counters["resets"] += 1
        async with self._changed:
            vm.state, vm.idle_since = "idle", time.monotonic()
            self._changed.notify_all()

    async def _replace(self, vm: _VM, why: str) -> None:
        if self._vms.pop(vm.vm_id, None) is None:
            return
        self._starting += 1  # the replacement's slot, taken now: max_envs holds while we delete
        if vm.lease is not None:
            vm.lease.broken = why
            self._leases.pop(vm.lease.lease_id, None)
        self.counters["replaced"] += 1
        with contextlib.suppress(Exception):
            await self.provider.delete(vm.vm_id)
        if self._closed:
            self._starting -= 1
        else:
            try:
                await self._add_vm(reserved=True, lend=False)
            except Exception as exc:  # noqa: BLE001  (counted as failed; acquire() creates on demand)
                log.warning("could not create a replacement VM: %s", exc)
        async with self._changed:
            self._changed.notify_all()

    async def _healthy(self, vm: _VM) -> bool:
        check = getattr(self.provider, "healthy", None)
        if check is not None:  # the provider knows how its VMs are reached and probed
            return bool(await check(vm.vm_id, self.health_timeout_s))
        alive = getattr(self.provider, "alive", None)
        if alive is not None and not alive(vm.vm_id):
            return False
        async with VMClient(vm.address, timeout_s=self.health_timeout_s, retries=1) as client:
            return await client.health(self.health_timeout_s)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)  # the health-check period
            now = time.monotonic()
            for lease in list(self._leases.values()):
                if now - lease.last_beat > self.lease_ttl_s:
                    log.warning(
                        "lease %s on %s expired (no heartbeat); taking the VM back",
                        lease.lease_id,
                        lease.vm_id,
                    )
                    self.counters["expired"] += 1
                    lease.broken = "lease expired"
                    await self.release(lease.lease_id)
            await self._retire_idle(now)
            # a leased VM that answered its holder within the period is alive: only the others are probed
            checks = [
                (v, v.generation)
                for v in self._vms.values()
                if v.state == "idle"
                or (
                    v.state == "busy" and (v.lease is None or now - v.lease.heard_at > self.health_interval_s)
                )
            ]
            results = await asyncio.gather(*(self._healthy(v) for v, _ in checks), return_exceptions=True)
            for (vm, generation), ok in zip(checks, results, strict=True):
                current = vm.vm_id in self._vms and vm.generation == generation and vm.state != "resetting"
                if ok is not True and current:
                    log.warning("VM %s failed its health check; replacing it", vm.vm_id)
                    await self._replace(vm, "the VM stopped answering")

    async def _retire_idle(self, now: float) -> None:
        """Delete VMs idle for longer than `idle_ttl_s`, keeping `prewarm` of them ready."""
        idle = sorted((v for v in self._vms.values() if v.state == "idle"), key=lambda v: v.idle_since)
        for vm in idle[: max(0, len(self._vms) - self.prewarm)]:
            if now - vm.idle_since > self.idle_ttl_s and vm.state == "idle":
                del self._vms[vm.vm_id]
                with contextlib.suppress(Exception):
                    await self.provider.delete(vm.vm_id)
                self.counters["retired"] += 1  # counted once it is gone
                async with self._changed:
                    self._changed.notify_all()

    async def wait_changed(self, timeout: float) -> None:
        """Until the pool's state changes (a VM created, released, replaced), or `timeout`."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait(), timeout)

    def metrics(self) -> dict[str, Any]:
        """Counts (they add up: busy + idle + resetting + starting <= max_envs) and reset latency."""
        states = [v.state for v in self._vms.values()]
        return {
            "busy": states.count("busy"),
            "idle": states.count("idle"),
            "resetting": states.count("resetting"),
            "starting": self._starting,
            "max_envs": self.max_envs,
            **self.counters,
            "reset_p50_s": round(statistics.median(self._reset_s), 3) if self._reset_s else None,
        }
