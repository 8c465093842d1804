"""Data-parallel training with FSDP2: process-group setup from torchrun's environment, sharding of a
Qwen-VL model per decoder layer and vision block, the full state dict on rank 0, and the split of a
global batch over ranks.

`train_step` (`guirl/learner/step.py`) takes the same global batch on every rank, trains on this rank's
share and gives the update one process would make on the whole batch: the loss is normalised by the
global batch's count, and FSDP's gradient reduction is made a plain sum (see `sum_gradient_reduction`).

Every rank must run the same FSDP collectives in the same order: an all-gather per sharded module in
each forward, a reduce-scatter per module in each backward. Two things would break that, and the step
prevents both: a rank with fewer micro-batches (the step pads it with idle ones), and a rank whose
micro-batch has no image while another's has (the vision blocks would run on one rank only; the step
adds a masked-out row with a tiny image, see `idle_sample`).
"""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from guirl.inference.chat import ChatRenderer
from guirl.learner.samples import TrainSample

__all__ = [
    "DistInfo",
    "full_state_dict",
    "idle_sample",
    "init_distributed",
    "shard_model",
    "split_for_rank",
    "sum_gradient_reduction",
]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the data-parallel job."""

    rank: int
    """Global rank, 0 .. world - 1."""
    world: int
    """Number of ranks (1 when not launched distributed)."""
    local_rank: int
    """Rank on this machine: the index of this process's GPU."""
    device: torch.device
    """Where the model and batches live: `cuda:<local_rank>` with NCCL, CPU with gloo."""
    initialized: bool = False
    """Whether a default process group exists (false for the single-process no-op)."""


def init_distributed(
    backend: str | None = None,
    *,
    timeout_s: float = 600.0,
    env: Mapping[str, str] | None = None,
    store: dist.Store | None = None,
) -> DistInfo:
    """Join the default process group from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/MASTER_PORT), or from `env` when given (a process that starts its own ranks: this
    process's environment is left alone; `store`: rank 0's rendezvous store, already listening);
    `backend` defaults to NCCL when a GPU is present, else gloo.

    Not launched by torchrun (no RANK/WORLD_SIZE): a single-process `DistInfo` and no group. Already
    initialised: the existing group's `DistInfo`.
    """
    env = os.environ if env is None else env
    local_rank = int(env.get("LOCAL_RANK", "0"))
    if dist.is_initialized():
        backend = dist.get_backend()
        return DistInfo(
            dist.get_rank(), dist.get_world_size(), local_rank, _device(backend, local_rank), initialized=True
        )
    if "RANK" not in env or "WORLD_SIZE" not in env:
        single = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        return DistInfo(0, 1, 0, _device(single, 0))
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = _device(backend, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    master = None
    if store is None and env is not os.environ:
        master = f"tcp://{env.get('MASTER_ADDR', '127.0.0.1')}:{env['MASTER_PORT']}"
    _gloo_interface(backend, env.get("MASTER_ADDR", "127.0.0.1"))
    _init_group(backend, master, store, rank, world, timeout_s, device)
    return DistInfo(rank, world, local_rank, device, initialized=True)


def _gloo_interface(backend: str, master_addr: str) -> None:
    """Gloo devices on the interface the ranks meet on: loopback for ranks of one host, the host's cluster
    address (`GUIRL_HOST_ADDRESS`) across hosts. Left to itself gloo binds the address the hostname resolves
    to, an interface the cluster file may not have named. Set for the process's lifetime (later groups, such
    as the trainer's control group, make devices of their own); an explicit GLOO_SOCKET_IFNAME is kept."""
    from guirl.net import HOST_ADDRESS_ENV, interface_of

    if "gloo" not in backend or "GLOO_SOCKET_IFNAME" in os.environ:
        return
    name = ""
    if master_addr == "127.0.0.1":
        name = "lo" if "lo" in {n for _, n in socket.if_nameindex()} else ""
    elif os.environ.get(HOST_ADDRESS_ENV):
        name = interface_of(os.environ[HOST_ADDRESS_ENV])
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def _init_group(
    backend: str,
    master: str | None,
    store: Any,
    rank: int,
    world: int,
    timeout_s: float,
    device: torch.device,
) -> None:
    dist.init_process_group(
        backend,
        init_method=master,
        store=store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        # NCCL: bind the group to this GPU now rather than guess it at the first collective.
        device_id=device if device.type == "cuda" else None,
    )


def _device(backend: str, local_rank: int) -> torch.device:
    # `backend` may be a device map such as "cpu:gloo,cuda:nccl": any NCCL means the model is on a GPU.
    return torch.device("cuda", local_rank) if "nccl" in backend else torch.device("cpu")


def shard_model(
    model: torch.nn.Module, dist_info: DistInfo, *, mixed_precision: bool, activation_checkpointing: bool
) -> torch.nn.Module:
    """FSDP2-shard `model` in place over all ranks and return it: `fully_shard` on each block that
    transformers declares unsplittable (`_no_split_modules`: for Qwen3-VL every
    `model.model.language_model.layers[i]` and `model.model.visual.blocks[i]`), then on the root, which
    holds the embeddings, LM head, norms and vision mergers.

    `mixed_precision`: bf16 compute with fp32 master weights and fp32 gradient reduction (for GPUs).
    `activation_checkpointing`: recompute each block in backward (transformers' non-reentrant
    checkpointing of the same blocks; it keeps the parameter names, so state dicts are unchanged).
    Gradient reduction is a sum (`sum_gradient_reduction`). Without a process group the model is only
    moved to `dist_info.device` (and checkpointed when asked).
    """
    if activation_checkpointing:
        # A transformers model (PreTrainedModel); typed as a Module so this file needs no transformers import.
        cast(Any, model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not dist.is_initialized():
        return model.to(dist_info.device)
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules: nothing to shard per block")
    mesh = init_device_mesh(dist_info.device.type, (dist_info.world,))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    sum_gradient_reduction(model)
    return model


def sum_gradient_reduction(model: torch.nn.Module) -> None:
    """Make every FSDP module of `model` reduce gradients by a plain sum across ranks (FSDP's default
    is the mean).

    `train_step` divides each rank's loss by the global batch's count, so the per-rank gradients are
    parts of the global gradient and add up to it; a mean would shrink it by the world size. A sum
    needs no compensating loss scale and is the same op on NCCL and gloo. Root parameters a rank did
    not use in a backward reduce as zeros, so a stray unused parameter cannot mismatch the collective.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
            module.set_reduce_scatter_unused_params(True, recurse=False)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on CPU, on rank 0; every other rank gets `{}` (but must call it too:
    it all-gathers). Without a process group, a CPU copy of `model.state_dict()`."""
    if not dist.is_initialized():
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    # full_state_dict + cpu_offload: gathered module by module to rank 0's CPU, so no rank ever holds the
    # whole unsharded model on the GPU.
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if dist.get_rank() == 0 else {}


def split_for_rank(samples: list[TrainSample], rank: int, world: int) -> list[TrainSample]:
    """This rank's share of `samples`: deterministic (every rank computes the same partition), balanced by
    tokens (largest first to the least-loaded rank, ties to the lower rank), each share in the batch's
    order.

    With at least `world` samples every rank gets one (an empty rank is always the least loaded). With
    fewer, ranks `len(samples)`.. get `[]`; `train_step` then runs an idle (zero-loss) forward and
    backward there so the collectives still match.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world {world}")
    loads = [0] * world
    owner = [0] * len(samples)
    for i in sorted(range(len(samples)), key=lambda i: (-samples[i].n_tokens, i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        owner[i] = r
        loads[r] += samples[i].n_tokens
    return [s for s, r in zip(samples, owner) if r == rank]


def idle_sample(renderer: ChatRenderer) -> TrainSample:
    """A minimal sample with one tiny image, for a rank with nothing (or no image) to train on in a
    micro-batch: `train_step` masks its response out, so it adds no loss, no gradient and no metric, but
    it runs the vision blocks and so their collectives."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (127, 127, 127)).save(buf, "PNG")
    image = buf.getvalue()
    tok: Any = renderer.tokenizer
    start, end = tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"])
    prompt = [start] + [renderer.image_token_id] * renderer.image_tokens(image) + [end]
    pad = tok.pad_token_id if tok.pad_token_id is not None else end
    return TrainSample(
        prompt_ids=prompt,
        response_ids=[pad],
        behaviour_logprobs=[0.0],
        images=[image],
        advantage=0.0,
        policy_version=-1,
        episode_id="<idle>",
        step=0,
        group_id="<idle>",
    )
