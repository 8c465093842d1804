"""The actors of the transport demo (`guirl demo`, until the RL loop exists).

The flow mirrors the real system's: a coordinator hands out episodes on request (pull), workers run
them step by step against a broker (here the echo actor, standing in for the inference broker) sending
one synthetic screenshot per step, and report each episode's one end state. Workers retry transient
failures (a broker that died and is being restarted) with backoff, and abort an episode only when the
broker stays unreachable — counted as an environment error, never as a policy failure.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from typing import Any

import msgspec

from guirl.messages import Blob, CoordinatorChannel, DiagChannel
from guirl.messages.types import (
    Ack,
    Echo,
    EchoReply,
    EpisodeAssignment,
    EpisodeEnded,
    Message,
    NoWork,
    Register,
    WorkRequest,
)
from guirl.runtime.base import Actor, Request
from guirl.runtime.errors import ActorError
from guirl.runtime.retry import retry_idempotent

log = logging.getLogger(__name__)


def synthetic_screen(width: int, height: int, seed: int) -> bytes:
    """A small PNG 'desktop': a coloured background, a title bar and a window (pure zlib, no Pillow)."""
    bg = bytes(((seed * 37) % 200, (seed * 91) % 200, 140))
    rows = []
    for y in range(height):
        if y < 12:
            row = b"\x30\x30\x38" * width
        elif height // 4 <= y < height * 3 // 4:
            left, right = width // 6 + seed % 20, width * 5 // 6
            row = bg * left + b"\xf0\xf0\xf0" * (right - left) + bg * (width - right)
        else:
            row = bg * width
        rows.append(b"\x00" + row)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"".join(rows), 6))
        + chunk(b"IEND", b"")
    )


class DemoCoordinator(Actor):
    """Hands out `episodes` episodes and tracks each id to exactly one end state."""

    channel = CoordinatorChannel

    def __init__(self, name: str, *, episodes: int, max_steps: int, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.todo = [f"ep{i:03d}" for i in range(episodes)]
        self.max_steps = max_steps
        self.assigned: dict[str, str] = {}
        self.ended: dict[str, EpisodeEnded] = {}
        self.workers: set[str] = set()
        self.all_ended = asyncio.Event()
        self.progress = asyncio.Event()  # set at every end state; waiters clear it
        self.total = episodes

    async def handle(self, req: Request) -> Message | None:
        match req.msg:
            case Register(name=name):
                self.workers.add(name)
                return Ack(note=f"{len(self.workers)} workers")
            case WorkRequest(worker=worker):
                if not self.todo:
                    return NoWork(retry_after_s=0.0, reason="done")
                episode = self.todo.pop(0)
                self.assigned[episode] = worker
                return EpisodeAssignment(
                    episode_id=episode,
                    task_id=f"demo-{episode}",
                    group_id=episode[:4],
                    task={"instruction": "send one screenshot per step to the broker"},
                    max_steps=self.max_steps,
                    seed=int(episode[2:]),
                )
            case EpisodeEnded(episode_id=episode) if episode not in self.assigned:
                self.counters["episodes.unknown_end"] += 1
                return Ack(ok=False, note=f"episode {episode!r} was never assigned")
            case EpisodeEnded(episode_id=episode) if episode in self.ended:
                self.counters["episodes.duplicate_end"] += 1
                return Ack(ok=False, note="already ended")
            case EpisodeEnded(episode_id=episode, status=status) as ended:
                self.ended[episode] = ended
                self.counters[f"episodes.{status}"] += 1
                self.progress.set()
                if len(self.ended) == self.total:
                    self.all_ended.set()
                return Ack()
        return await super().handle(req)


class DemoWorkerOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    coordinator: str
    """The coordinator's endpoint."""
    broker: str
    """The (echo) broker's endpoint."""
    width: int = 320
    """Width of the synthetic screenshots."""
    height: int = 200
    """Height of the synthetic screenshots."""
    step_latency_s: float = 0.0
    """Seconds the broker takes per step (`Echo.delay_s`)."""


class DemoWorker(Actor):
    """Pulls episodes from the coordinator and plays them against the broker."""

    channel = DiagChannel
    Options = DemoWorkerOptions

    def __init__(self, name: str, options: DemoWorkerOptions, **runtime: Any) -> None:
        super().__init__(name, **runtime)
        self.step_latency_s = options.step_latency_s
        self.coordinator_ep, self.broker_ep = options.coordinator, options.broker
        self.width, self.height = options.width, options.height

    async def setup(self) -> None:
        self.coord = self.connect("coordinator", self.coordinator_ep, CoordinatorChannel)
        self.broker = self.connect("broker", self.broker_ep, DiagChannel)

    async def main(self) -> None:
        rt = self.runtime
        await self.coord.request(Register(role="env_worker", name=self.name))
        while True:
            work = await self.coord.request(WorkRequest(worker=self.name))
            match work:
                case NoWork(reason="done"):
                    return
                case NoWork(retry_after_s=delay):
                    await asyncio.sleep(delay)
                case EpisodeAssignment() as ep:
                    ended = await self._play(ep)
                    # the coordinator ignores a repeated end state, so reporting one is safe to retry
                    await retry_idempotent(
                        lambda ended=ended: self.coord.request(ended),
                        attempts=20,
                        initial=rt.reconnect_backoff_initial_s,
                        cap=rt.reconnect_backoff_max_s,
                    )

    async def _play(self, ep: EpisodeAssignment) -> EpisodeEnded:
        rt = self.runtime
        for step in range(ep.max_steps):
            png = synthetic_screen(self.width, self.height, ep.seed * 100 + step)
            echo = Echo(
                text=f"{ep.episode_id} step {step}",
                blobs=[Blob(png)],
                return_blobs=False,
                delay_s=self.step_latency_s,
            )
            try:
                # an Echo is idempotent, so it may be retried while the broker restarts
                reply = await retry_idempotent(
                    lambda echo=echo: self.broker.request(echo, timeout=5.0),
                    attempts=30,
                    initial=rt.reconnect_backoff_initial_s,
                    cap=rt.reconnect_backoff_max_s,
                )
            except ActorError as exc:
                log.warning("episode %s aborted at step %d: %s", ep.episode_id, step, exc)
                return EpisodeEnded(
                    episode_id=ep.episode_id,
                    status="aborted",
                    steps=step,
                    env_error=str(exc)[:300],
                    reason="broker unreachable",
                )
            if not isinstance(reply, EchoReply) or reply.sizes != [len(png)]:
                raise RuntimeError(f"broker answered {reply!r} to a {len(png)}-byte screenshot")
        return EpisodeEnded(episode_id=ep.episode_id, status="completed", reward=1.0, steps=ep.max_steps)
