"""Weights broadcast over the learner's weight group (rank 0) to the engines' ranks (SGLang's
`update_weights_from_distributed` pattern; the group itself is `guirl.weights.broadcast`).

`GuirlLayoutPublisher`: guirl's wire format (a header, then packed buckets), received by hf engines.
`SGLangLayoutPublisher`: SGLang's, bucket by bucket as the plan in the source says (each engine asks its
server for each bucket over HTTP), flattened or one collective per tensor.

The group is set up on the first publish and kept while the same number of engine ranks takes part
(`regroup`); `close` leaves it, and the next publish sets up a fresh one (under a fresh name: SGLang
refuses a name it still holds, e.g. a failed group's).
"""

from __future__ import annotations

from typing import Any

from guirl.messages.weights import Backend, Layout, SGLangBucket, WeightGroupSpec, WeightsFromBroadcast
from guirl.net import free_port
from guirl.weights.broadcast import WeightSender, sglang_buckets, unique_group_name
from guirl.weights.publisher import cast_state


class _BroadcastPublisher:
    """What both layouts share: the group, the sender, the version prepared and not yet sent."""

    layout: Layout

    def __init__(
        self,
        *,
        host: str,
        backend: Backend = "gloo",
        timeout_s: float = 120.0,
        join_timeout_s: float = 30.0,
        bucket_bytes: int = 64 << 20,
        dtype: str = "",
    ) -> None:
        """`host`: the learner host's address the engines reach (loopback on one machine); `dtype`: what
        floating-point tensors travel as ("" or "float32": as trained)."""
        self.host, self.backend = host, backend
        self.timeout_s, self.join_timeout_s = timeout_s, join_timeout_s
        self.bucket_bytes, self.dtype = bucket_bytes, dtype
        self.engine_ranks = 1
        self.group: WeightGroupSpec | None = None
        self._sender: WeightSender | None = None
        self._pending: tuple[int, dict[str, Any], list[SGLangBucket]] | None = None

    def regroup(self, engine_ranks: int) -> None:
        """The engines' ranks that take the next broadcast: a group of another size (an engine died or
        came back) is left, and the next publish sets up one of the engines that are up now."""
        if self.group is not None and self.group.world_size != 1 + engine_ranks:
            self.close()
        self.engine_ranks = engine_ranks

    def prepare(self, version: int, state: dict[str, Any]) -> WeightsFromBroadcast:
        if self.group is None:
            self.group = WeightGroupSpec(
                host=self.host,
                port=free_port(self.host),
                world_size=1 + self.engine_ranks,
                group_name=unique_group_name(),
                backend=self.backend,
                timeout_s=self.timeout_s,
                join_timeout_s=self.join_timeout_s,
                layout=self.layout,
            )
            self._sender = WeightSender()
        ready = cast_state(state, self.dtype)
        buckets = self._plan(ready)
        self._pending = (version, ready, buckets)
        return WeightsFromBroadcast(group=self.group, buckets=buckets)

    def send(self) -> int:
        """Join (the first time: blocks until every engine has) and send the prepared version."""
        group, sender, pending = self.group, self._sender, self._pending  # `close` may run meanwhile
        if group is None or sender is None or pending is None:
            raise RuntimeError("send() without a prepared version")
        self._pending = None
        if not sender.is_open:
            sender.open(group)
        return self._send(sender, *pending)

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
        self.group = self._sender = self._pending = None

    def _plan(self, state: dict[str, Any]) -> list[SGLangBucket]:
        raise NotImplementedError

    def _send(
        self, sender: WeightSender, version: int, state: dict[str, Any], plan: list[SGLangBucket]
    ) -> int:
        raise NotImplementedError


class GuirlLayoutPublisher(_BroadcastPublisher):
    """guirl's layout: one broadcast carries its own header (names, dtypes, shapes, bucket plan)."""

    layout: Layout = "guirl"

    def _plan(self, state: dict[str, Any]) -> list[SGLangBucket]:
        return []

    def _send(
        self, sender: WeightSender, version: int, state: dict[str, Any], plan: list[SGLangBucket]
    ) -> int:
        return sender.broadcast(state, version, self.bucket_bytes).nbytes


class SGLangLayoutPublisher(_BroadcastPublisher):
    """SGLang's layout: the bucket plan travels in the source; one collective per bucket (`flattened`) or
    per tensor, in the plan's order."""

    layout: Layout = "sglang"

    def __init__(self, *, flattened: bool = True, **options: Any) -> None:
        super().__init__(**options)
        self.flattened = flattened

    def _plan(self, state: dict[str, Any]) -> list[SGLangBucket]:
        return sglang_buckets(state, self.bucket_bytes)

    def _send(
        self, sender: WeightSender, version: int, state: dict[str, Any], plan: list[SGLangBucket]
    ) -> int:
        return sum(sender.send_sglang_bucket(state, b, flattened=self.flattened) for b in plan)
