"""How the learner's weights reach the engines. `Publishing`: when (each version, overlapped with the next
update; again while the engines may not hold them) and told to whom (the broker, then the coordinator).
`WeightDelivery`: how, through the transports of `guirl.weights` (one publisher each) and the fallback
around them. With `train.weight_sync = "broadcast"` each version goes over the learner's weight group to
the engines that are up, in the layout their backend reads; when none is up, or the broadcast fails, the
disk path serves that version and a fresh group is set up next time. With "disk", every version is a
safetensors file the engines load.

Delivery runs on a thread of its own, one at a time; the broker is told where its engines take the
weights from (a `WeightSource`) while they are being sent, and answers once every engine serves them.
Phase times: `broadcast_s` (sending), `engine_s` (from the last byte sent to the broker's answer).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import msgspec

from guirl.config.schema import TrainConfig
from guirl.messages.types import StatsRequest, WeightsPublished
from guirl.messages.weights import WeightsFromBroadcast, WeightSource
from guirl.net import host_address
from guirl.runtime.errors import ActorError
from guirl.weights.disk import DiskPublisher
from guirl.weights.publisher import WeightPublisher

log = logging.getLogger(__name__)


class WeightTransport(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The learner's side of the weight broadcast (the driver picks it from the inference backend)."""

    layout: Literal["guirl", "sglang"] = "guirl"
    """The wire layout the engines read: guirl's (hf engines) or SGLang's."""
    flattened: bool = True
    """`sglang` layout: one collective per bucket (SGLang's `flattened_bucket`), else one per tensor."""
    backend: Literal["gloo", "nccl"] = "gloo"
    dtype: Literal["", "float32", "bfloat16", "float16"] = ""
    """What floating-point tensors travel as ("" or "float32": as trained)."""


Tell = Callable[[WeightSource], Awaitable[bool]]
"""Tell the broker the engines' source of a version; whether it says they all serve it."""


class WeightDelivery:
    """The learner's weight transport (see the module docstring). `counters` and `busy` are the actor's."""

    def __init__(
        self,
        disk: WeightPublisher,
        broadcaster: Any = None,
        *,
        counters: Any,
        busy: Callable[[str], Any],
        name: str = "learner",
    ) -> None:
        self.disk, self.broadcaster = disk, broadcaster
        self.counters, self.busy = counters, busy
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"weights-{name}")

    @classmethod
    def make(
        cls,
        cfg: TrainConfig,
        run_dir: Path,
        transport: WeightTransport,
        *,
        epoch: int,
        timeout_s: float,
        counters: Any,
        busy: Callable[[str], Any],
        name: str = "learner",
    ) -> WeightDelivery:
        """The learner's transport per `cfg.weight_sync`; a weight group's collectives wait `timeout_s`."""
        from guirl.weights.broadcast_publisher import GuirlLayoutPublisher, SGLangLayoutPublisher

        broadcaster = None
        broadcast = cfg.weight_sync == "broadcast"
        if broadcast and cfg.simulated_update_s:
            log.info("a simulated learner has no weights to broadcast: each version goes by the disk path")
            broadcast = False
        if broadcast:
            group = {
                "host": host_address(),  # the learner host's cluster address (loopback on one machine)
                "backend": transport.backend,
                "timeout_s": timeout_s,
                "join_timeout_s": cfg.weight_join_timeout_s,
                "bucket_bytes": cfg.weight_bucket_mb << 20,
                "dtype": transport.dtype,
            }
            if transport.layout == "sglang":
                broadcaster = SGLangLayoutPublisher(flattened=transport.flattened, **group)
            else:
                broadcaster = GuirlLayoutPublisher(**group)
        disk = DiskPublisher(run_dir / "weights", epoch=epoch)
        return cls(disk, broadcaster, counters=counters, busy=busy, name=name)

    async def deliver(
        self,
        version: int,
        state: dict[str, Any],
        *,
        tied: bool,
        tell: Tell,
        live_ranks: Callable[[], Awaitable[int]] | None,
    ) -> dict[str, float]:
        """Make `state` (the full state dict, `tied`: its LM head shares the embeddings) the engines'
        `version`; `live_ranks`: the weight-group ranks of the engines up now (None: no broker to broadcast
        to). Returns the phase times; raises when the engines did not take it."""
        from guirl.learner.trainer import savable_state

        with self.busy("gather"):  # may clone every gathered tensor: busy, as the sending that follows
            state = await self._thread(functools.partial(savable_state, state, tied=tied))
        timings: dict[str, float] = {}
        if self.broadcaster is not None and live_ranks is not None:
            if await self._broadcast(version, state, tell, await live_ranks(), timings):
                return timings
        if not await self._publish(self.disk, version, state, tell, timings):
            raise ActorError(f"the broker did not take version {version}")
        return timings

    async def _broadcast(
        self, version: int, state: dict[str, Any], tell: Tell, ranks: int, timings: dict[str, float]
    ) -> bool:
        """False: the disk path serves this version."""
        from guirl.weights.broadcast import WeightSyncError

        if ranks == 0:
            return False  # no engine up to join: the disk path keeps the version for when they are back
        try:
            await self._thread(self.broadcaster.regroup, ranks)
            ok = await self._publish(self.broadcaster, version, state, tell, timings)
        except WeightSyncError as exc:
            log.warning(
                "weight broadcast of version %d failed (%s); the engines load it from disk", version, exc
            )
            self.counters["publish.broadcast_failed"] += 1
            ok = False
        if not ok:  # the group failed, or the engines left (the broker abandoned or failed the update)
            await self._thread(self.broadcaster.close)
        return ok

    async def _publish(
        self, publisher: WeightPublisher, version: int, state: dict[str, Any], tell: Tell, timings: dict
    ) -> bool:
        """Get the weights ready, tell the broker where its engines take them from, and send them while
        they do; whether the broker says they serve them."""
        with self.busy("save_weights" if publisher is self.disk else "gather"):
            source = await self._thread(publisher.prepare, version, state)
        told = asyncio.create_task(tell(source))  # a broadcast's engines join while it is sent
        sent = time.monotonic()
        try:
            nbytes = await self._thread(publisher.send)
        except BaseException:
            told.cancel()
            raise
        sending_s = time.monotonic() - sent
        ok = await told
        if isinstance(source, WeightsFromBroadcast):
            timings.update(broadcast_s=sending_s, engine_s=time.monotonic() - sent - sending_s)
            self.counters["publish.broadcast_bytes"] += nbytes
        return ok

    async def _thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        """Leave the weight group (from any thread: a delivery blocked in a collective fails now, not at its
        timeout)."""
        if self.broadcaster is not None:
            self.broadcaster.close()

    def shutdown(self) -> None:
        """Let the delivery thread go (what it runs ends by itself: see `close`)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


REPUBLISH_MAX_S = 60.0
REPUBLISH_INTERVAL_S = 5.0
"""At most this often the learner publishes its weights again to engines that may not hold them."""


class Publishing:
    """Each version the learner makes: gathered (`gather`, on the actor's torch thread), delivered to the
    broker's engines (`WeightDelivery`) and announced to the coordinator (which opens its staleness gate).
    Delivery overlaps the next update (`overlap`) unless asked to `wait`, one at a time: the next publish
    waits for the previous one. While the engines may not hold the learner's current weights (a publish
    failed, the broker restarted: `again`), they are published again, at most every few seconds and only
    while the broker answers. `broker` and `coord` are the actor's connections (None: not in this run)."""

    def __init__(
        self,
        delivery: WeightDelivery,
        *,
        broker: Any,
        coord: Any,
        epoch: int,
        engines: int,
        timeout_s: float,
        counters: Any,
        overlap: bool,
    ) -> None:
        self.delivery, self.broker, self.coord = delivery, broker, coord
        self.epoch, self.engines, self.timeout_s = epoch, engines, timeout_s
        self.counters, self.overlap = counters, overlap
        self.last_publish: dict[str, Any] = {}
        """`publish.*` metrics of the last version delivered (phase times, and its version)."""
        self.pending = False  # the engines may not hold the current weights: publish them again
        self._gen = 0  # bumped by each cause to publish again; a delivery clears only its own
        self._again_at = 0.0
        self._backoff = 0.0
        self._task: asyncio.Task | None = None  # the delivery of the last version, while it runs

    @classmethod
    def make(
        cls,
        cfg: TrainConfig,
        run_dir: Path,
        transport: WeightTransport,
        *,
        epoch: int,
        broker: Any,
        coord: Any,
        engines: int,
        timeout_s: float,
        counters: Any,
        busy: Callable[[str], Any],
        name: str = "learner",
    ) -> Publishing:
        """The learner's publishing per `cfg` (`weight_sync`, `overlap_publish`); `engines`: the weight-group
        ranks of the broker's engines when it cannot say how many are up; `timeout_s`: of each request (a
        weight group's collectives wait at most 120 s of it)."""
        delivery = WeightDelivery.make(
            cfg,
            run_dir,
            transport,
            epoch=epoch,
            timeout_s=min(120.0, timeout_s),
            counters=counters,
            busy=busy,
            name=name,
        )
        return cls(
            delivery,
            broker=broker,
            coord=coord,
            epoch=epoch,
            engines=engines,
            timeout_s=timeout_s,
            counters=counters,
            overlap=cfg.overlap_publish,
        )

    async def publish(
        self,
        version: int,
        gather: Callable[[], Awaitable[dict[str, Any]]],
        *,
        tied: bool,
        current: Callable[[], int],
        wait: bool = False,
    ) -> float:
        """Publish `version` (`tied`: its LM head shares the embeddings); the seconds the caller was held
        up. `current()`: the learner's version when the delivery ends (it settles `pending` only then)."""
        started = time.monotonic()
        await self.drain()
        state = await gather()
        gather_s = time.monotonic() - started
        task = asyncio.create_task(
            self._deliver(version, state, tied, gather_s, current), name=f"publish-v{version}"
        )
        if wait or not self.overlap:
            await task
        else:
            self._task = task
        return time.monotonic() - started

    def again(self) -> None:
        """The engines may not hold the current weights: publish them again soon."""
        self.pending = True
        self._gen += 1

    async def again_if_needed(
        self, version: int, gather: Callable[[], Awaitable[dict[str, Any]]], *, tied: bool
    ) -> None:
        """Publish `version` again when `again` asked for it, its time has come and the broker answers."""
        if not self.pending or self.broker is None:
            return
        if self._task is not None and not self._task.done():
            return  # a delivery is under way: it settles the flag
        if time.monotonic() < self._again_at or self.broker.state != "alive":
            return
        self.counters["publish.again"] += 1
        await self.publish(version, gather, tied=tied, current=lambda: version, wait=True)
        if self.pending:  # it failed again: back off (a large model's publish is not free), from its end
            self._backoff = min(REPUBLISH_MAX_S, max(REPUBLISH_INTERVAL_S, 2 * self._backoff))
            self._again_at = time.monotonic() + self._backoff

    async def drain(self) -> None:
        """Wait for the delivery under way (the last version reaches the engines before the run is done)."""
        if self._task is not None:
            await self._task
            self._task = None

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _deliver(
        self, version: int, state: dict[str, Any], tied: bool, gather_s: float, current: Callable[[], int]
    ) -> None:
        gen = self._gen
        try:
            timings = await self.delivery.deliver(
                version,
                state,
                tied=tied,
                tell=functools.partial(self._tell_broker, version),
                live_ranks=self._live_ranks if self.broker is not None else None,
            )
            await self._tell(
                self.coord, WeightsPublished(version=version, learner_step=version, epoch=self.epoch)
            )
        except Exception as exc:  # the engines keep the previous version; published again soon
            self.counters["publish.failed"] += 1
            log.error("publishing version %d failed: %r", version, exc)
            self.again()
            return
        if version == current() and gen == self._gen:  # nothing asked for it again meanwhile
            self.pending = False
            self._backoff = 0.0
        timings = {"gather_s": gather_s, **timings}
        self.last_publish = {f"publish.{k}": round(v, 4) for k, v in timings.items()} | {
            "publish.version": version
        }

    async def _tell_broker(self, version: int, source: WeightSource) -> bool:
        msg = WeightsPublished(version=version, learner_step=version, epoch=self.epoch, source=source)
        return await self._tell(self.broker, msg)

    async def _tell(self, conn: Any, msg: WeightsPublished) -> bool:
        if conn is None:
            return True
        try:
            await conn.request(msg, timeout=self.timeout_s)
            return True
        except ActorError as exc:  # the broker restarting: it is told again (see `again_if_needed`)
            self.counters["tell.failed"] += 1
            log.warning("could not tell %s about version %d: %s", conn.name, msg.version, exc)
            return False

    async def _live_ranks(self) -> int:
        """The weight-group ranks of the broker's healthy engines now (all of them, if it cannot say)."""
        try:
            reply = await self.broker.request(StatsRequest(), timeout=self.timeout_s)
        except ActorError as exc:
            log.warning("could not ask the broker which engines are up: %s", exc)
            return self.engines
        return int(getattr(reply, "counters", {}).get("weights.live_ranks", self.engines))
