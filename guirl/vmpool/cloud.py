"""Cloud desktops: one lifecycle for every cloud, each cloud's own calls behind a small adapter.

`CloudProvider` implements the pool's `Provider` interface over a `CloudAPI` (AWS, Volcengine, Aliyun:
`guirl/vmpool/clouds/`). What it guarantees, whichever the cloud:

- **No duplicate instances.** Every launch carries a client token, made once per VM and reused by every
  retry of that launch, so a call that timed out or was throttled after the cloud acted returns the same
  instance when retried.
- **No leaks past the TTL.** Every instance is tagged `guirl:run`, `guirl:pool`, `guirl:created` and
  `guirl:ttl` at creation (in the launch call itself, never after), and its user data arms a shutdown timer
  at the TTL (on AWS the instance terminates on shutdown). `reap` finds instances of runs that are no longer
  alive (their heartbeat has stopped) or past their TTL and terminates them; a pool reaps its own tag when
  it starts.
- **Throttling is waited out.** A throttled call (each cloud's codes) or one that failed in passing is
  retried with jittered exponential backoff, up to `cloud.api_attempts`; launches also go through a token
  bucket (`launch_rate_per_s`, `launch_burst`) and at most `launch_concurrency` at once.
- **Ready means answering.** A VM is ready when its instance runs, has a private address, and its VM
  server answers a health check on `vm_port` — polled with backoff, never a fixed sleep.
- **Resets keep the instance** where the cloud can replace the root volume (`cloud.reset = "replace_root"`):
  the instance and its address stay; otherwise (or `"relaunch"`) the instance is terminated and a new one
  launched under the same VM id.
- **Network hygiene.** Instances get private addresses only; `cluster_cidr` must be a private range, and the
  adapter checks that the security group opens `vm_port` to nothing wider.
- **Metrics** per provider: launch and reset latency by method, failures by cause, throttled calls,
  instance-minutes.

Secrets (access keys) are held by the adapter's SDK client only: never logged, never in a tag, never in
user data.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from guirl.config.validate import check_cidr
from guirl.vmpool.provider import ProviderError

log = logging.getLogger(__name__)

TAG_RUN = "guirl:run"
TAG_POOL = "guirl:pool"
TAG_CREATED = "guirl:created"
TAG_TTL = "guirl:ttl"
HEARTBEAT = "heartbeat.json"
"""The run's heartbeat, in its run directory: `{"run": ..., "time": ..., "interval_s": ...}`."""
SILENT_BEATS = 5
"""Heartbeats a run may miss before the reaper takes it for dead."""

LIVE_STATES = ("pending", "running", "stopping", "stopped")


@dataclass
class Instance:
    """One cloud instance as the adapter describes it (states normalised to EC2's names)."""

    id: str
    state: str
    """pending | running | stopping | stopped | terminating | terminated | error"""
    private_ip: str = ""
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def created(self) -> float:
        try:
            return float(self.tags.get(TAG_CREATED, "0"))
        except ValueError:
            return 0.0

    @property
    def expires(self) -> float:
        """When its TTL runs out (epoch seconds; inf when untagged)."""
        try:
            return self.created + float(self.tags[TAG_TTL])
        except (KeyError, ValueError):
            return float("inf")


class CloudError(ProviderError):
    """A cloud call failed. `throttled`: the cloud asked us to slow down; `retryable`: the same call may
    succeed later (throttling, a 5xx, a timeout); `code`: the cloud's error code."""

    def __init__(self, message: str, *, code: str = "", throttled: bool = False, retryable: bool = False):
        super().__init__(message)
        self.code, self.throttled, self.retryable = code, throttled, retryable or throttled


class CloudAPI(Protocol):
    """One cloud's calls (blocking SDK calls: the provider runs them on threads). Every method raises
    `CloudError` with the cloud's code; `describe` of unknown ids returns nothing for them."""

    name: str

    def launch(self, *, token: str, tags: dict[str, str], user_data: str) -> str:
        """Start one instance (idempotent by `token`); its id."""
        ...

    def describe(self, *, ids: list[str] | None = None, tags: dict[str, str] | None = None) -> list[Instance]:
        """Instances by id, or carrying every tag of `tags` (a value of "*": the key is present)."""
        ...

    def terminate(self, ids: list[str]) -> None:
        """Terminate (idempotent: gone or unknown ids are fine)."""
        ...

    def replace_root(self, instance_id: str) -> None:
        """Replace the root volume from the image and return once it is done and the instance runs again
        (it keeps its id and address); raises NotImplementedError where the cloud cannot."""
        ...

    def check_network(self, cidr: str, port: int) -> None:
        """Refuse (CloudError) a security group that opens `port` wider than `cidr`."""
        ...


def user_data(ttl_s: float) -> str:
    """The boot script: power off at the TTL (the instance's own backstop; no secret in it)."""
    minutes = max(1, int(ttl_s // 60))
    return (
        f"#!/bin/sh\n# guirl: the instance's lifetime backstop\nshutdown -P +{minutes} 'guirl ttl' || true\n"
    )


class TokenBucket:
    """`rate` acquisitions per second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.rate)  # the rate limit itself


@dataclass
class _VM:
    instance: str
    address: str
    tag: str
    started: float = field(default_factory=time.monotonic)


class CloudProvider:
    """The `Provider` of cloud desktops over `api` (see the module docstring).

    `run`: the run's name (tag `guirl:run`); `address_for(instance)`: where its VM server is reached
    (default `http://<private ip>:<vm_port>`; tests map instances to local desktops this way)."""

    def __init__(
        self,
        api: CloudAPI,
        *,
        run: str,
        cloud: Any,
        address_for: Callable[[Instance], str] | None = None,
        health: Callable[[str, float], Any] | None = None,
        alive: Callable[[str], bool] | None = None,
    ) -> None:
        self.api = api
        self.run = run
        self.cfg = cloud
        check_cidr(cloud.cluster_cidr)
        self.address_for = address_for or (lambda inst: f"http://{inst.private_ip}:{cloud.vm_port}")
        self._health = health or _vm_server_health
        self._alive = alive
        self.vms: dict[str, _VM] = {}
        self._bucket = TokenBucket(cloud.launch_rate_per_s, cloud.launch_burst)
        self._launching = asyncio.Semaphore(cloud.launch_concurrency)
        self.counters: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.launch_s: list[float] = []
        self.reset_s: dict[str, list[float]] = {"replace_root": [], "relaunch": []}
        self._instance_s = 0.0  # seconds of instances already gone
        self._network_checked = False
        self._network_lock = asyncio.Lock()  # concurrent first creates check the security group once
        # Blocking SDK calls get threads of their own: a root-volume replacement holds one for minutes, and
        # the event loop's default executor (a few threads) would stall every launch and poll behind them.
        self._threads = ThreadPoolExecutor(
            max_workers=cloud.launch_concurrency + 16, thread_name_prefix=f"cloud-{api.name}"
        )

    @property
    def name(self) -> str:
        return self.api.name

    # -- calls ----------------------------------------------------------------------------------------

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn` on a thread, retried with jittered exponential backoff while the cloud throttles or fails in
        passing (the same arguments: a launch keeps its client token)."""
        delay = 0.2
        for attempt in range(1, self.cfg.api_attempts + 1):
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    self._threads, functools.partial(fn, *args, **kwargs)
                )
            except CloudError as exc:
                if exc.throttled:
                    self.counters["throttled"] += 1
                if not exc.retryable or attempt == self.cfg.api_attempts:
                    self.failures[f"{what}:{exc.code or 'error'}"] += 1
                    raise
                await asyncio.sleep(random.uniform(0, delay))  # full jitter backoff
                delay = min(delay * 2, 20.0)
        raise AssertionError("unreachable")

    # -- the Provider interface -------------------------------------------------------------------------

    async def create(self, tag: str) -> str:
        """Launch an instance for pool `tag` and wait until its VM server answers; its id is the VM's."""
        if not self._network_checked:
            async with self._network_lock:
                if not self._network_checked:
                    await self._call(
                        "check_network", self.api.check_network, self.cfg.cluster_cidr, self.cfg.vm_port
                    )
                    self._network_checked = True
        started = time.monotonic()
        instance = await self._launch(tag)
        try:
            address = await self._ready(instance, started)
        except BaseException:
            await self._terminate(instance)
            self._instance_s += time.monotonic() - started  # billed all the same
            raise
        self.vms[instance] = _VM(instance, address, tag, started)
        self.launch_s.append(time.monotonic() - started)
        self.counters["launched"] += 1
        return instance

    async def _launch(self, tag: str) -> str:
        now = time.time()
        tags = {
            TAG_RUN: self.run,
            TAG_POOL: tag,
            TAG_CREATED: str(int(now)),
            TAG_TTL: str(int(self.cfg.ttl_s)),
        }
        token = f"guirl-{uuid.uuid4().hex}"  # one per VM: every retry of this launch reuses it
        async with self._launching:
            await self._bucket.take()
            return await self._call(
                "launch", self.api.launch, token=token, tags=tags, user_data=user_data(self.cfg.ttl_s)
            )

    async def _ready(self, instance: str, started: float) -> str:
        """Poll until the instance runs with a private address and its VM server answers; its address."""
        deadline = started + self.cfg.ready_timeout_s
        delay = 0.1
        address = ""
        seen = False
        while True:
            if not address:
                found = await self._call("describe", self.api.describe, ids=[instance])
                inst = found[0] if found else None
                if inst is None and seen:  # some clouds have no terminated state: deleted ones vanish
                    self.failures["launch:vanished"] += 1
                    raise ProviderError(f"{self.name} instance {instance} disappeared before it was ready")
                seen = seen or inst is not None
                if inst is not None and inst.state in ("terminated", "terminating", "error"):
                    self.failures["launch:" + inst.state] += 1
                    raise ProviderError(
                        f"{self.name} instance {instance} is {inst.state} before it was ready"
                    )
                if inst is not None and inst.state == "running" and inst.private_ip:
                    address = self.address_for(inst)
            if address and await self._health(address, min(5.0, self.cfg.ready_timeout_s)):
                return address
            if time.monotonic() > deadline:
                self.failures["ready:timeout"] += 1
                raise ProviderError(
                    f"{self.name} instance {instance} not ready within {self.cfg.ready_timeout_s:g} s "
                    f"({'no VM server answer at ' + address if address else 'not running with an address'})"
                )
            await asyncio.sleep(delay)  # a readiness poll's backoff
            delay = min(delay * 2, 5.0)

    def address(self, vm_id: str) -> str:
        return self.vms[vm_id].address

    async def healthy(self, vm_id: str, timeout_s: float) -> bool:
        """The VM's server answers (the pool's periodic check)."""
        vm = self.vms.get(vm_id)
        return vm is not None and bool(await self._health(vm.address, timeout_s))

    async def reset(self, vm_id: str) -> None:
        """Replace the root volume (keeping the instance), or terminate and relaunch under the same id."""
        vm = self.vms[vm_id]
        started = time.monotonic()
        method = self.cfg.reset
        if method == "replace_root":
            try:
                await self._call("replace_root", self.api.replace_root, vm.instance)
            except NotImplementedError:
                method = "relaunch"
            else:
                vm.address = await self._ready(vm.instance, started)
        if method == "relaunch":
            await self._terminate(vm.instance)
            self._instance_s += time.monotonic() - vm.started
            vm.instance, vm.started = await self._launch(vm.tag), time.monotonic()
            vm.address = await self._ready(vm.instance, started)
        self.reset_s[method].append(time.monotonic() - started)
        self.counters[f"reset.{method}"] += 1

    async def delete(self, vm_id: str) -> None:
        vm = self.vms.pop(vm_id, None)
        if vm is not None:
            await self._terminate(vm.instance)
            self._instance_s += time.monotonic() - vm.started

    async def _terminate(self, instance: str) -> None:
        await self._call("terminate", self.api.terminate, [instance])
        self.counters["terminated"] += 1

    async def list(self, tag: str) -> list[str]:
        found = await self._call("describe", self.api.describe, tags={TAG_POOL: tag, TAG_RUN: self.run})
        return [i.id for i in found if i.state in LIVE_STATES]

    async def reap(self, tag: str) -> list[str]:
        """At the pool's start: terminate instances of pool `tag` left by runs that are no longer alive, or
        past their TTL (the current run's are left alone)."""
        dead = await reap(self.api, pool=tag, alive=self._alive, keep_run=self.run, call=self._call)
        self.counters["reaped"] += len(dead)
        return [i.id for i in dead]

    def metrics(self) -> dict[str, Any]:
        """Per-provider figures: launches, resets by method, failures by cause, throttled calls,
        instance-minutes (live instances counted up to now)."""
        now = time.monotonic()
        live = sum(now - v.started for v in self.vms.values())

        def med(xs: list[float]) -> float | None:
            return round(statistics.median(xs), 3) if xs else None

        return {
            "provider": self.name,
            **{k: v for k, v in self.counters.items()},
            "launch_p50_s": med(self.launch_s),
            **{f"reset_{m}_p50_s": med(xs) for m, xs in self.reset_s.items()},
            "failures": dict(self.failures),
            "instance_minutes": round((self._instance_s + live) / 60, 2),
        }


async def _vm_server_health(address: str, timeout_s: float) -> bool:
    from guirl.vmpool.client import VMClient

    try:
        async with VMClient(address, timeout_s=timeout_s, retries=1) as client:
            return bool(await client.health(timeout_s))
    except Exception:  # noqa: BLE001 - not up yet is the common case while booting
        return False


# -- runs' heartbeats and the reaper ---------------------------------------------------------------------


def write_heartbeat(run_dir: Path, run: str, interval_s: float) -> None:
    """The run is alive now (the coordinator calls this every `interval_s`)."""
    tmp = run_dir / f".{HEARTBEAT}.tmp"
    tmp.write_text(
        json.dumps({"run": run, "time": time.time(), "interval_s": interval_s, "pid": os.getpid()})
    )
    os.replace(tmp, run_dir / HEARTBEAT)


def run_alive(runs_root: Path, run: str, *, now: float | None = None) -> bool | None:
    """True/False from `<runs_root>/<run>/heartbeat.json` (silent for `SILENT_BEATS` beats: dead); None when
    the run has no heartbeat here (another machine's run, or one that never beat)."""
    path = runs_root / run / HEARTBEAT
    try:
        beat = json.loads(path.read_text())
        age = (now or time.time()) - float(beat["time"])
        return age <= SILENT_BEATS * float(beat.get("interval_s", 30.0))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return False  # a damaged heartbeat says nothing is beating


async def reap(
    api: CloudAPI,
    *,
    run: str = "",
    pool: str = "",
    older_than_s: float | None = None,
    alive: Callable[[str], bool | None] | None = None,
    keep_run: str = "",
    dry_run: bool = False,
    now: float | None = None,
    call: Callable[..., Any] | None = None,
) -> list[Instance]:
    """Terminate (or with `dry_run`, only list) guirl's instances that should not exist any more: past their
    TTL, or of a run that is not alive (`alive(run)` False), or — when the run's liveness is unknown — older
    than `older_than_s`. `run` / `pool`: only those. `keep_run`'s instances are never taken."""
    now = now or time.time()
    tags = {TAG_RUN: run or "*"}
    if pool:
        tags[TAG_POOL] = pool

    async def direct(what: str, fn: Callable[..., Any], *a: Any, **k: Any) -> Any:
        return await asyncio.to_thread(fn, *a, **k)

    call = call or direct
    found = await call("describe", api.describe, tags=tags)
    doomed = []
    for inst in found:
        if inst.state not in LIVE_STATES:
            continue
        owner = inst.tags.get(TAG_RUN, "")
        if owner and owner == keep_run:
            continue
        verdict = alive(owner) if alive is not None else None
        expired = now >= inst.expires
        old = older_than_s is not None and now - inst.created >= older_than_s
        if expired or verdict is False or (verdict is None and old):
            doomed.append(inst)
    if doomed and not dry_run:
        await call("terminate", api.terminate, [i.id for i in doomed])
        log.warning("reaped %d %s instance(s): %s", len(doomed), api.name, [i.id for i in doomed])
    return doomed
