"""Where an engine takes new weights from: the tagged union `WeightSource` that `WeightsPublished` carries
from the learner to the broker and the broker hands to each engine's `update_weights`.

`WeightsFromDisk`: safetensors files the learner wrote. `WeightsFromBroadcast`: join the learner's weight
group (`WeightGroupSpec`) and receive the tensors it broadcasts; in SGLang's layout with the plan of
buckets (`SGLangBucket`) each engine asks its server for, one `update_weights_from_distributed` request per
bucket. Bounds are checked on decode (and `__post_init__` also guards direct construction), so a malformed
plan is refused at the broker's boundary, not half-way through an update. The torch side of these (the
group, the sender and the receiver) is `guirl.weights.broadcast`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

MAX_DIMS = 8
"""Dimensions a tensor of a bucket plan may have (as `types.MAX_DIMS`)."""
MAX_WORLD_SIZE = 1 << 16
"""Ranks a weight group may have (the learner and every engine's GPUs)."""
MAX_TIMEOUT_S = 7 * 86400.0
"""The longest a weight group's collectives or joining may wait (`train.weight_join_timeout_s` has the
same bound)."""

Backend = Literal["gloo", "nccl"]
Layout = Literal["guirl", "sglang"]
DTypeName = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]*$", max_length=32)]
"""A torch dtype's name without the `torch.` prefix (`bfloat16`); the receiving side resolves it."""
TensorName = Annotated[str, Meta(min_length=1, max_length=1024)]
Shape = Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=MAX_DIMS)]
Seconds = Annotated[float, Meta(gt=0, le=MAX_TIMEOUT_S)]


class WeightGroupSpec(msgspec.Struct, frozen=True):
    """Where and how the learner and the engines meet to broadcast weights (SGLang's
    `init_weights_update_group` pattern)."""

    host: Annotated[str, Meta(min_length=1, max_length=255)]
    """Address of the learner's rank 0, where the group's TCP store listens."""
    port: Annotated[int, Meta(ge=1, le=65535)]
    """The store's port (its own: not torchrun's MASTER_PORT)."""
    world_size: Annotated[int, Meta(ge=2, le=MAX_WORLD_SIZE)]
    """1 learner (rank 0) + the engines' ranks (1..N)."""
    group_name: Annotated[str, Meta(min_length=1, max_length=256)] = "guirl-weights"
    """Key prefix in the store: two groups on one store do not mix. An SGLang server keeps a group by this
    name until it is destroyed and refuses to form another one by it, so each group gets its own
    (`guirl.weights.broadcast.unique_group_name`)."""
    backend: Backend = "gloo"
    """`gloo` (CPU tensors; the only one tested here) or `nccl` (CUDA tensors)."""
    timeout_s: Seconds = 120.0
    """How long each collective (a tensor's or a bucket's broadcast) may wait for the peers before failing."""
    join_timeout_s: Seconds = 30.0
    """How long an engine (rank > 0) may wait to form the group (the learner's store to answer, every
    member to connect), apart from the transfer: a learner that died before the group formed costs the
    engines this much, not `timeout_s`. The learner itself waits `timeout_s` for the engines, which join
    only once the broker has drained them. (NCCL forms its communicator lazily, at the first broadcast:
    under `nccl` that one waits `timeout_s`.)"""
    layout: Layout = "guirl"
    """`guirl`: the store keys and wire format of `guirl.weights.broadcast` (hf engines). `sglang`: SGLang's
    (`init_custom_process_group`'s key prefixes; no header: the bucket plan travels with the source)."""

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2 (the learner and an engine), got {self.world_size}")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        for name in ("timeout_s", "join_timeout_s"):
            if not 0 < getattr(self, name) <= MAX_TIMEOUT_S:
                raise ValueError(f"{name} must be in (0, {MAX_TIMEOUT_S:g}] s, got {getattr(self, name)}")
        if self.layout not in ("guirl", "sglang"):
            raise ValueError(f"layout must be 'guirl' or 'sglang', got {self.layout!r}")

    @property
    def where(self) -> str:
        return f"weight group {self.group_name!r} at {self.host}:{self.port}"


class SGLangBucket(msgspec.Struct, frozen=True, kw_only=True):
    """One `update_weights_from_distributed` request of the `sglang` layout: the tensors one collective
    (flattened) or one collective each (per tensor) carries, in order."""

    names: Annotated[list[TensorName], Meta(min_length=1)]
    dtypes: list[DTypeName]
    shapes: list[Shape]

    def __post_init__(self) -> None:
        if not self.names or not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(
                f"bad weight bucket: {len(self.names)} names, {len(self.dtypes)} dtypes, "
                f"{len(self.shapes)} shapes"
            )
        for shape in self.shapes:
            if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
                raise ValueError(f"bad weight bucket: shape {shape}")


class _Source(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of the weight sources (tagged, in snake case as the messages are: a union of them decodes by
    its `type`)."""


class WeightsFromDisk(_Source, tag="weights_from_disk"):
    """Load the weights from safetensors files: the file `path`, or every `*.safetensors` file in it."""

    path: Annotated[str, Meta(max_length=4096)]


class WeightsFromBroadcast(_Source, tag="weights_from_broadcast"):
    """Join the learner's weight group `group` (an engine takes the ranks the broker gives it) and receive
    the weights it broadcasts; in the `sglang` layout, bucket by bucket as `buckets` plans (in sending
    order), which the `guirl` layout does not use (its plan travels in the broadcast's own header)."""

    group: WeightGroupSpec
    buckets: list[SGLangBucket] = []

    def __post_init__(self) -> None:
        if self.group.layout == "sglang" and not self.buckets:
            raise ValueError("a broadcast in the sglang layout needs its bucket plan")
        if self.group.layout == "guirl" and self.buckets:
            raise ValueError("a broadcast in the guirl layout carries no bucket plan (its header does)")


WeightSource = WeightsFromDisk | WeightsFromBroadcast
"""Where an engine takes new weights from (dispatch with `match`)."""
