"""Learner → engine weight broadcast over a dedicated process group (SGLang's
`update_weights_from_distributed` pattern): the learner's rank 0 and N engine processes meet at a TCP
store on its own port and form a group of their own, separate from any torchrun default group.

The group is built from the public backend classes (`ProcessGroupGloo(store, rank, size, timeout)`,
`ProcessGroupNCCL(store, rank, size, options)`) and used through their own collective methods, not
with `init_process_group` / `new_group`: those act on the one process-global default group (which the
learner already has under torchrun, and an engine must not be made to have), and
`_new_process_group_helper` is private, with a signature that changes between torch releases. The
store is made with `TCPStore(host, port, world, is_master=...)` here, never through `rendezvous`:
under torchrun `TORCHELASTIC_USE_AGENT_STORE=True` turns that into a client on every rank and the join
deadlocks (NOTES).

Wire format of one broadcast, all from rank 0: the header's length (one int64), the header (msgpack
bytes as uint8: version, every tensor's name / dtype / shape, the bucket plan), then one collective per
bucket. Tensors under 1 MiB (norms, biases: most of a model's tensors, little of its bytes) are packed
as raw bytes into buckets of up to `bucket_bytes`, which cuts the number of collectives; packing bytes,
not values, means a bucket never splits on dtype and any dtype (bf16, bool) travels bit-exact through
any backend. A tensor of 1 MiB or more is its own bucket, sent from (and received into) its own storage:
packing it would only add two copies (measured on gloo, 100 M parameters: packing everything into
64 MiB buckets delivered 1.2-1.3 GB/s, this 1.6-2.5 GB/s; bench/weights.py).

Where the group meets (`WeightGroupSpec`) and the `sglang` layout's bucket plan (`SGLangBucket`) travel to
the engines inside a `WeightsFromBroadcast`: they are wire structs of `guirl.messages.weights`, re-exported
here.
"""

from __future__ import annotations

import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from guirl.messages.weights import SGLangBucket, WeightGroupSpec
from guirl.net import gloo_group, listening_store

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "BroadcastStats",
    "SGLangBucket",
    "WeightGroupSpec",
    "WeightGroupTimeout",
    "WeightReceiver",
    "WeightSender",
    "WeightSyncError",
    "check_dtypes",
    "sglang_buckets",
    "state_digest",
    "unique_group_name",
]
DEFAULT_BUCKET_BYTES = 64 << 20
_IN_PLACE_BYTES = 1 << 20  # a tensor this large goes alone, without packing (see the module docstring)
_FORMAT = 1  # bumped when the header changes shape: both sides must run the same guirl


class WeightSyncError(RuntimeError):
    """The weight group failed: a peer left, the header is malformed, or the sides disagree."""


class WeightGroupTimeout(WeightSyncError, TimeoutError):
    """A peer did not show up (`join_timeout_s`) or stopped answering (`timeout_s`); retrying may work."""


def unique_group_name() -> str:
    """A weight group name no other group of any run has (SGLang refuses a name it already holds, e.g. a
    group whose broadcast failed and was not destroyed)."""
    return f"guirl-weights-{secrets.token_hex(8)}"


@dataclass
class BroadcastStats:
    """What one `broadcast` moved and how long rank 0 took to send it."""

    version: int
    seconds: float
    nbytes: int
    tensors: int
    buckets: int

    @property
    def gbytes_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class _TensorMeta(msgspec.Struct, array_like=True, frozen=True):
    name: str
    dtype: str  # torch dtype name without the "torch." prefix
    shape: list[int]


class _Header(msgspec.Struct, frozen=True):
    format: int
    version: int
    tensors: list[_TensorMeta]
    buckets: list[list[int]]  # indices into `tensors`, in byte order within each bucket


_header_decoder = msgspec.msgpack.Decoder(_Header)


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a 1-D uint8 view (no copy)."""
    return t.reshape(-1).view(torch.uint8)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncError(f"header names an unknown dtype {name!r}")
    return dtype


def _plan_buckets(nbytes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive small tensors packed up to `bucket_bytes`; a tensor of `_IN_PLACE_BYTES` (or
    `bucket_bytes`, if less) or more goes alone, sent in place; empty tensors go nowhere (the receiver
    allocates them from the header)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, n in enumerate(nbytes):
        if n == 0:
            continue
        if n >= min(bucket_bytes, _IN_PLACE_BYTES):
            buckets.append([i])
            continue
        if size + n > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        buckets.append(current)
    return buckets


class _Group:
    """The store and the backend of one weight group (shared by sender and receiver)."""

    def __init__(self, spec: WeightGroupSpec, rank: int) -> None:
        self.spec, self.rank = spec, rank
        join_s = spec.join_timeout_s if rank > 0 else spec.timeout_s  # forming the group
        timeout = timedelta(seconds=join_s)
        self.op_timeout = timedelta(seconds=spec.timeout_s)  # each collective
        self.device = torch.device("cpu")
        start = time.monotonic()
        try:
            if rank > 0:
                _wait_for_listener(spec)  # bounded: the store client's own retries take ~3x its timeout
            left = timedelta(seconds=max(1.0, join_s - (time.monotonic() - start)))
            # is_master waits (wait_for_workers) until all world_size members have connected, or times out.
            if rank == 0:  # listening on the group's host only (a plain TCPStore binds every interface)
                self.store = listening_store(spec.host, spec.port, spec.world_size, left)
            else:
                self.store = dist.TCPStore(
                    spec.host, spec.port, spec.world_size, is_master=False, timeout=left
                )
            prefixed = dist.PrefixStore(spec.group_name, self.store)
            if spec.layout == "sglang":
                # SGLang joins with init_custom_process_group: PrefixStore(group_name), then torch's
                # _new_process_group_helper adds "<group_name>/" and the device type's "<device>/".
                device_type = "cpu" if spec.backend == "gloo" else "cuda"
                prefixed = dist.PrefixStore(
                    f"{device_type}/", dist.PrefixStore(f"{spec.group_name}/", prefixed)
                )
            if spec.backend == "gloo":
                self.pg: Any = gloo_group(prefixed, rank, spec.world_size, timeout)
            else:
                self.pg = _nccl_group(prefixed, rank, spec.world_size, timeout)
                self.device = torch.device("cuda", torch.cuda.current_device())
        except WeightSyncError:
            raise
        except RuntimeError as exc:  # DistStoreError / DistNetworkError, or gloo's own connect errors
            if not _timed_out(exc):  # e.g. the port is taken: retrying the same spec will not help
                raise WeightSyncError(f"{spec.where}: rank {rank} could not form the group: {exc}") from exc
            raise WeightGroupTimeout(
                f"{spec.where}: rank {rank} could not form the group of {spec.world_size} within "
                f"{join_s:g} s ({'engines' if rank == 0 else 'the learner'} did not join?): "
                f"{exc}"
            ) from exc

    def broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = self.op_timeout
        try:
            self.pg.broadcast([t], opts).wait()
        except RuntimeError as exc:
            kind = WeightGroupTimeout if _timed_out(exc) else WeightSyncError
            raise kind(f"{self.spec.where}: broadcast failed on rank {self.rank}: {exc}") from exc

    def close(self) -> None:
        try:
            self.pg.shutdown()  # closes its connections: a peer blocked in a collective fails now
        except RuntimeError:
            pass  # already broken; nothing left to release
        self.pg = None
        self.store = None


def _timed_out(exc: RuntimeError) -> bool:
    """Torch reports a timeout, a lost peer and a taken port with the same few classes (RuntimeError,
    DistError); only the text tells a timeout, the one failure worth retrying, from the others."""
    text = str(exc).lower()
    return "timed out" in text or "wait timeout" in text  # a store wait says the latter


def _nccl_group(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if nccl is None or not torch.cuda.is_available():
        raise WeightSyncError("backend 'nccl' needs a CUDA build of torch and a GPU")
    opts = nccl.Options()
    opts._timeout = timeout
    return nccl(store, rank, size, opts)


def _wait_for_listener(spec: WeightGroupSpec) -> None:
    """Until the learner's store accepts connections, or `join_timeout_s` has passed."""
    deadline = time.monotonic() + spec.join_timeout_s
    delay = 0.02
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((spec.host, spec.port), timeout=max(0.05, left)):
                return
        except OSError as exc:
            if left <= 0:
                raise WeightGroupTimeout(
                    f"{spec.where}: the learner (rank 0) did not open it within {spec.join_timeout_s:g} s: "
                    f"{exc}"
                ) from exc
        time.sleep(min(delay, max(0.0, left)))  # a retry backoff, not synchronisation
        delay = min(delay * 2, 0.5)


class _Member:
    """One side's membership of the weight group: joined once, used across updates, left by `close`."""

    _role = ""

    def __init__(self) -> None:
        self._group: _Group | None = None

    @property
    def is_open(self) -> bool:
        return self._group is not None

    def _join(self, spec: WeightGroupSpec, rank: int) -> None:
        if self._group is not None:
            raise WeightSyncError(f"{spec.where}: {self._role} already open")
        self._group = _Group(spec, rank)

    def close(self) -> None:
        """Leave the group (peers blocked in a collective fail at once rather than at their timeout)."""
        if self._group is not None:
            self._group.close()
            self._group = None

    def _require(self) -> _Group:
        if self._group is None:
            raise WeightSyncError(f"weight {self._role} is not open")
        return self._group


class WeightSender(_Member):
    """Rank 0 of the weight group: the learner's side. `open` blocks until every engine has joined."""

    _role = "sender"

    def open(self, spec: WeightGroupSpec) -> None:
        """Create the store (as its master) and the group; fails with `WeightGroupTimeout` when the
        engines do not all join within `spec.join_timeout_s`."""
        self._join(spec, 0)

    def broadcast(
        self, state_dict: dict[str, torch.Tensor], version: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> BroadcastStats:
        """Send `state_dict` (names in its own order) as `version` to every engine of the group."""
        group = self._require()
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        started = time.perf_counter()
        names = list(state_dict)
        tensors = [state_dict[n].detach() for n in names]
        sizes = [t.numel() * t.element_size() for t in tensors]
        buckets = _plan_buckets(sizes, bucket_bytes)
        header = msgspec.msgpack.encode(
            _Header(
                format=_FORMAT,
                version=version,
                tensors=[
                    _TensorMeta(n, str(t.dtype).removeprefix("torch."), list(t.shape))
                    for n, t in zip(names, tensors)
                ],
                buckets=buckets,
            )
        )
        group.broadcast(torch.tensor([len(header)], dtype=torch.int64, device=group.device))
        group.broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(group.device))
        # One staging buffer, reused: a bucket's broadcast has completed before the next is packed.
        staging: torch.Tensor | None = None
        for bucket in buckets:
            if len(bucket) == 1:
                t = tensors[bucket[0]].to(group.device).contiguous()
                group.broadcast(_byte_view(t))
                continue
            total = sum(sizes[i] for i in bucket)
            if staging is None or staging.numel() < total:
                staging = torch.empty(max(total, bucket_bytes), dtype=torch.uint8, device=group.device)
            offset = 0
            for i in bucket:
                staging[offset : offset + sizes[i]].copy_(_byte_view(tensors[i].contiguous()))
                offset += sizes[i]
            group.broadcast(staging[:total])
        return BroadcastStats(
            version=version,
            seconds=time.perf_counter() - started,
            nbytes=sum(sizes) + len(header) + 8,
            tensors=len(tensors),
            buckets=len(buckets),
        )

    def send_sglang_bucket(
        self, state_dict: dict[str, torch.Tensor], bucket: SGLangBucket, *, flattened: bool
    ) -> int:
        """Send one bucket of the `sglang` layout (the engines were asked for it over HTTP): one collective
        of the tensors' bytes back to back (`flattened`), or one per tensor, in the bucket's order.
        Returns the bytes sent."""
        group = self._require()
        tensors = [state_dict[n].detach() for n in bucket.names]
        for t, dtype, shape in zip(tensors, bucket.dtypes, bucket.shapes):
            if str(t.dtype).removeprefix("torch.") != dtype or list(t.shape) != shape:
                raise WeightSyncError(f"{group.spec.where}: the bucket plan does not match the state dict")
        if not flattened:
            for t in tensors:
                group.broadcast(t.to(group.device).contiguous())
            return sum(t.numel() * t.element_size() for t in tensors)
        flat = torch.cat([_byte_view(t.to(group.device).contiguous()) for t in tensors])
        group.broadcast(flat)
        return flat.numel()


def check_dtypes(buckets: list[SGLangBucket]) -> None:
    """ValueError unless every dtype of the plan names a torch dtype (the wire only checks its spelling)."""
    for bucket in buckets:
        for name in bucket.dtypes:
            try:
                _dtype(name)
            except WeightSyncError as exc:
                raise ValueError(f"bad weight bucket: {exc}") from exc


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def sglang_buckets(
    state_dict: dict[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[SGLangBucket]:
    """The state dict cut into buckets of up to `bucket_bytes` (a larger tensor is a bucket of its own),
    empty tensors left out. Within a bucket the tensors go by decreasing element size, so that every
    tensor of a flattened bucket starts at a byte offset its dtype can be viewed at (SGLang's
    `FlattenedTensorBucket` refuses unaligned ones)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    names = [n for n, t in state_dict.items() if t.numel()]
    sizes = [state_dict[n].numel() * state_dict[n].element_size() for n in names]
    out: list[SGLangBucket] = []
    current: list[str] = []
    size = 0

    def close() -> None:
        if current:
            current.sort(key=lambda n: -state_dict[n].element_size())  # stable: name order within a size
            out.append(
                SGLangBucket(
                    names=list(current),
                    dtypes=[str(state_dict[n].dtype).removeprefix("torch.") for n in current],
                    shapes=[list(state_dict[n].shape) for n in current],
                )
            )

    for name, n in zip(names, sizes):
        if current and size + n > bucket_bytes:
            close()
            current, size = [], 0
        current.append(name)
        size += n
    close()
    return out


class WeightReceiver(_Member):
    """An engine's side of the weight group (ranks 1..N); stays open across updates."""

    _role = "receiver"

    @property
    def spec(self) -> WeightGroupSpec | None:
        return self._group.spec if self._group is not None else None

    @property
    def rank(self) -> int:
        return self._group.rank if self._group is not None else -1

    def open(self, spec: WeightGroupSpec, rank: int) -> None:
        """Join the learner's group as `rank`; fails with `WeightGroupTimeout` when the learner does not
        show up within `spec.join_timeout_s`."""
        if not 0 < rank < spec.world_size:
            raise ValueError(
                f"{spec.where}: an engine's rank must be in 1..{spec.world_size - 1}, got {rank}"
            )
        self._join(spec, rank)

    def receive(self) -> tuple[int, dict[str, torch.Tensor]]:
        """Wait for one broadcast; returns its version and the state dict (in the sender's name order,
        on this side's device: CPU for gloo)."""
        group = self._require()
        length = torch.zeros(1, dtype=torch.int64, device=group.device)
        group.broadcast(length)
        n = int(length.item())
        if not 0 < n < 1 << 30:
            raise WeightSyncError(f"{group.spec.where}: implausible header length {n}")
        raw = torch.empty(n, dtype=torch.uint8, device=group.device)
        group.broadcast(raw)
        try:
            header = _header_decoder.decode(raw.cpu().numpy().tobytes())
        except msgspec.DecodeError as exc:
            raise WeightSyncError(f"{group.spec.where}: malformed header: {exc}") from exc
        if header.format != _FORMAT:
            raise WeightSyncError(
                f"{group.spec.where}: header format {header.format}, this side speaks {_FORMAT}"
            )
        if any(not 0 <= i < len(header.tensors) for bucket in header.buckets for i in bucket):
            raise WeightSyncError(f"{group.spec.where}: header's bucket plan names tensors it does not list")
        tensors = [torch.empty(m.shape, dtype=_dtype(m.dtype), device=group.device) for m in header.tensors]
        sizes = [t.numel() * t.element_size() for t in tensors]
        staging: torch.Tensor | None = None
        for bucket in header.buckets:
            if len(bucket) == 1:
                group.broadcast(_byte_view(tensors[bucket[0]]))  # straight into the tensor's storage
                continue
            total = sum(sizes[i] for i in bucket)
            if staging is None or staging.numel() < total:
                staging = torch.empty(total, dtype=torch.uint8, device=group.device)
            group.broadcast(staging[:total])
            offset = 0
            for i in bucket:
                _byte_view(tensors[i]).copy_(staging[offset : offset + sizes[i]])
                offset += sizes[i]
        return header.version, {m.name: t for m, t in zip(header.tensors, tensors)}

    def receive_sglang_bucket(
        self, bucket: SGLangBucket, *, flattened: bool
    ) -> list[tuple[str, torch.Tensor]]:
        """The engine's side of `WeightSender.send_sglang_bucket` (what an SGLang server does for one
        `update_weights_from_distributed` request)."""
        group = self._require()
        if not flattened:
            tensors = [
                torch.empty(s, dtype=_dtype(d), device=group.device)
                for d, s in zip(bucket.dtypes, bucket.shapes)
            ]
            for t in tensors:
                group.broadcast(t)
            return list(zip(bucket.names, tensors))
        sizes = [_numel(s) * _dtype(d).itemsize for d, s in zip(bucket.dtypes, bucket.shapes)]
        flat = torch.empty(sum(sizes), dtype=torch.uint8, device=group.device)
        group.broadcast(flat)
        # views into the one buffer, as SGLang's FlattenedTensorBucket reconstructs them (no second copy;
        # the plan orders a bucket by decreasing element size, so every view is aligned)
        tensors, offset = [], 0
        for d, shape, n in zip(bucket.dtypes, bucket.shapes, sizes, strict=True):
            tensors.append(flat[offset : offset + n].view(_dtype(d)).reshape(shape))
            offset += n
        return list(zip(bucket.names, tensors))


def state_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: equal digests mean
    bit-identical weights."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(_byte_view(t).numpy().tobytes())
    return h.hexdigest()
