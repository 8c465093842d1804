"""The learner's torch side on 1..N data-parallel ranks: the policy (FSDP2-sharded over the ranks), its
optimizer and the frozen reference, driven by rank 0.

Rank 0 is the Learner actor: it owns the mailbox, the trajectory buffer, the weight publishing and the
checkpoint bookkeeping, and calls the methods of its `Trainer`. Ranks 1..N-1 only run `Trainer.follow`.
Every method that needs all ranks — a train step, gathering the full state dict, writing or restoring a
checkpoint — first sends the command from rank 0 to the others over a gloo group of the learner's ranks
(msgpack bytes in a uint8 tensor: nothing is pickled), then does rank 0's part; each follower decodes
the command and does its own part, so the FSDP collectives line up.

`train_step` (step.py) is given the same global batch on every rank and makes the update one process
would make on the whole batch (tests/integration/test_fsdp.py checks that), so the number of ranks
changes the speed, not the result. A checkpoint is the same whatever the number of ranks that wrote it
(the model in Hugging Face format, the optimizer state keyed by parameter name), and any number of ranks
can resume from it.

Launching: under torchrun (RANK and WORLD_SIZE set) the ranks exist already; rank 0 starts the actor and
the others run `python -m guirl.learner.trainer` (this module's `main`). A local run with
`train.ranks > 1` has its actor process start the followers itself, with the same environment torchrun
would give them (`spawn_followers`).

The control group's timeout is long on purpose: a follower waits for the next command as long as the
learner waits for trajectories. A dead rank 0 is still noticed at once (gloo fails on the closed
connection), and the followers also die with their parent.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec

from guirl.cluster.spec import FollowerHost
from guirl.config.schema import TrainConfig
from guirl.learner.samples import TrainSample
from guirl.learner.step import BatchRejected

log = logging.getLogger(__name__)

__all__ = ["Trainer", "follower_command", "save_hf_model"]

CONTROL_TIMEOUT = timedelta(days=7)
"""How long a follower waits for rank 0's next command (see the module docstring)."""

_ENV_OPTIONS = "GUIRL_TRAINER_OPTIONS"
"""Environment variable through which a follower gets the trainer's options (JSON)."""


class _Command(msgspec.Struct, tag_field="op", forbid_unknown_fields=True):
    pass


class _Step(_Command, tag="step"):
    samples: list[TrainSample]


class _FullState(_Command, tag="full_state"):
    pass


class _Save(_Command, tag="save"):
    path: str


class _Stop(_Command, tag="stop"):
    pass


_command_decoder = msgspec.msgpack.Decoder(_Step | _FullState | _Save | _Stop)


class Trainer:
    """The model, optimizer and reference of one learner rank; see the module docstring.

    Blocking and torch-heavy: the actor calls it from one dedicated thread.
    """

    def __init__(
        self,
        *,
        ckpt: str,
        train: TrainConfig,
        seed: int = 0,
        temperature: float = 1.0,
        mixed_precision: bool | None = None,
        device: str = "",
    ) -> None:
        if device not in ("", "cpu", "cuda"):
            raise ValueError(f"device must be 'cpu', 'cuda' or '' (a GPU when there is one), got {device!r}")
        self.device = device
        self.ckpt = ckpt
        self.cfg = train
        self.seed = seed
        self.temperature = temperature if temperature > 0 else 1.0  # greedy samples: log-probs at T=1
        self.mixed_precision = mixed_precision
        self.info: Any = None
        self._ctl: Any = None  # the control group (gloo), when there are followers
        self.model: Any = None
        self.optimizer: Any = None
        self.ref_model: Any = None
        self.renderer: Any = None

    # -- setup ---------------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.info.rank if self.info is not None else 0

    @property
    def world(self) -> int:
        return self.info.world if self.info is not None else 1

    def load(
        self, resume_from: Path | None = None, *, rendezvous: dict[str, str] | None = None, store: Any = None
    ) -> None:
        """Join the ranks (torchrun's environment, or `rendezvous`: see `spawn_followers`), load and
        shard the model, make the optimizer and the reference; with `resume_from` (rank 0's checkpoint
        directory) restore the model, the optimizer and the RNG from it, on every rank. ValueError for a
        simulated learner's checkpoint (no model in it)."""
        import torch
        import torch.distributed as dist
        from transformers import Qwen3VLForConditionalGeneration
        from transformers.utils import logging as hf_logging

        from guirl.inference.chat import ChatRenderer
        from guirl.learner.fsdp import init_distributed, shard_model
        from guirl.learner.simulated import check_resumable

        check_resumable(resume_from, simulated=False)

        hf_logging.disable_progress_bar()  # progress bars on a service's stderr are noise
        backend = {"cpu": "gloo", "cuda": "nccl"}.get(self.device)
        self.info = init_distributed(backend, env=rendezvous, store=store)
        if self.info.initialized:
            self._ctl = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        torch.manual_seed(self.seed)
        on_gpu = self.info.device.type == "cuda"
        mixed = self.mixed_precision
        if mixed is None:
            mixed = on_gpu if self.cfg.mixed_precision == "auto" else self.cfg.mixed_precision == "bf16"
        checkpointing = (
            on_gpu
            if self.cfg.activation_checkpointing == "auto"
            else (self.cfg.activation_checkpointing == "on")
        )
        attn = attn_implementation(self.cfg.attn_implementation, on_gpu=on_gpu)
        ckpt = Path(self.ckpt)
        if not (ckpt / "config.json").is_file():
            raise ValueError(f"{str(ckpt)!r} is not a checkpoint directory (no config.json)")
        # Every rank loads the starting checkpoint (each node has it); a resumed run's weights come from
        # rank 0's checkpoint below.
        weights = resume_from / "model" if resume_from is not None and self.world == 1 else ckpt
        model = Qwen3VLForConditionalGeneration.from_pretrained(
            weights, local_files_only=True, torch_dtype=torch.float32, attn_implementation=attn
        )
        self.model = shard_model(
            model, self.info, mixed_precision=mixed, activation_checkpointing=checkpointing
        )
        self.model.train()
        if self.cfg.kl_coef > 0:  # the frozen reference: the starting checkpoint, even in a resumed run
            ref = Qwen3VLForConditionalGeneration.from_pretrained(
                ckpt, local_files_only=True, torch_dtype=torch.float32, attn_implementation=attn
            )
            ref.requires_grad_(False)
            self.ref_model = shard_model(
                ref, self.info, mixed_precision=mixed, activation_checkpointing=False
            )
            self.ref_model.eval()
        self.renderer = ChatRenderer.load(self.ckpt)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )
        if resume_from is not None:
            self._restore(resume_from)

    def _restore(self, ckpt: Path) -> None:
        """Rank 0 reads and checks the checkpoint's files first and tells every rank the outcome (over
        the control group) before any collective: a missing or foreign file fails all ranks alike, with
        the same error, instead of leaving the others waiting in a broadcast."""
        import torch
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        many = self.world > 1
        trainable = {name: p for name, p in self.model.named_parameters() if p.requires_grad}
        model_state: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        verdict: dict[str, Any] = {"error": "", "missing": []}
        if self.rank == 0:
            try:
                if many:
                    model_state = _load_hf_state(ckpt / "model")
                optim = torch.load(ckpt / "optimizer.pt", weights_only=True)
                verdict["missing"] = _check_optimizer_state(optim, set(trainable))
                rng = torch.load(ckpt / "rng.pt", weights_only=True)
            except Exception as exc:
                verdict["error"] = f"checkpoint {str(ckpt)!r} cannot be restored: {type(exc).__name__}: {exc}"
        if many:
            payload = json.dumps(verdict).encode() if self.rank == 0 else None
            verdict = json.loads(self._broadcast_bytes(payload))
        if verdict["error"]:
            raise ValueError(verdict["error"])
        if many:  # the model: rank 0 read it, the ranks take their shards
            set_model_state_dict(
                self.model,
                model_state,
                options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
            )
        # Not strict: a parameter without a gradient yet (the vision tower after text-only batches) has no
        # Adam state in the file. Loading gives every parameter a zeroed state (an lr-0 step), so those are
        # dropped again below: they start fresh at their first gradient, as in an uninterrupted run.
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=many, strict=False)
        set_optimizer_state_dict(self.model, self.optimizer, optim, options=opts)
        for name in verdict["missing"]:
            self.optimizer.state.pop(trainable[name], None)
        if self.rank == 0:  # rank 0's RNG (the only one saved; nothing on the others draws from theirs)
            torch.set_rng_state(rng["torch"])
            version, internal, gauss = rng["python"]
            random.setstate((version, tuple(internal), gauss))

    # -- the commands ----------------------------------------------------------------------------------

    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One update on the global batch `samples` (see `guirl.learner.step.train_step`)."""
        self._send(_Step(samples=samples))
        return self._step(samples)

    def full_state(self) -> dict[str, Any]:
        """The whole state dict on CPU (rank 0; `{}` on the others)."""
        self._send(_FullState())
        return self._full_state()

    def save(self, path: Path) -> None:
        """Write the model (Hugging Face format, with the tokenizer and image processor), `optimizer.pt`
        (full, keyed by parameter name) and `rng.pt` into the directory `path` (rank 0 writes)."""
        self._send(_Save(path=str(path)))
        self._save(path)

    def stop(self) -> None:
        """Release the followers (they return from `follow`) and leave the process group."""
        import torch.distributed as dist

        try:
            if self._ctl is not None and self.rank == 0:
                self._send(_Stop())  # fails if a follower is gone: the group is left all the same
        finally:
            self._ctl = None
            if self.info is not None and self.info.initialized and dist.is_initialized():
                dist.destroy_process_group()

    def follow(self) -> None:
        """A follower's loop: run rank 0's commands until it says stop."""
        while True:
            cmd = _command_decoder.decode(self._receive())
            match cmd:
                case _Step(samples=samples):
                    try:
                        self._step(samples)
                    except BatchRejected as exc:  # every rank rejected it before any collective
                        log.warning("batch rejected: %s", exc)
                case _FullState():
                    self._full_state()
                case _Save(path=path):
                    self._save(Path(path))
                case _Stop():
                    self.stop()
                    return

    def _full_state(self) -> dict[str, Any]:
        """This rank's part of gathering the whole state dict (rank 0 gets it; the others `{}`)."""
        from guirl.learner.fsdp import full_state_dict

        return full_state_dict(self.model)

    # -- the work each rank does -------------------------------------------------------------------------

    def _step(self, samples: list[TrainSample]) -> dict[str, float]:
        from guirl.learner.step import train_step

        c = self.cfg
        return train_step(
            self.model,
            self.optimizer,
            samples,
            self.renderer,
            eps_clip=c.eps_clip,
            eps_clip_high=c.eps_clip_high,
            tis_cap=c.tis_cap,
            loss_agg=c.loss_agg,
            max_tokens=c.micro_batch_tokens,
            temperature=self.temperature,
            max_grad_norm=c.grad_clip,
            dist_info=self.info,
            ref_model=self.ref_model,
            kl_coef=c.kl_coef,
            kl_kind=c.kl_kind,
        )

    def _save(self, path: Path) -> None:
        import torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        model_state = self._full_state()  # every rank: it all-gathers
        optim = get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if self.rank != 0:
            return
        save_hf_model(self.model, model_state, path / "model")
        self.renderer.tokenizer.save_pretrained(path / "model")
        self.renderer.image_processor.save_pretrained(path / "model")
        torch.save(optim, path / "optimizer.pt")
        version, internal, gauss = random.getstate()
        torch.save(
            {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}, path / "rng.pt"
        )

    # -- the control channel ------------------------------------------------------------------------------

    def _send(self, cmd: _Command) -> None:
        if self._ctl is None or self.world == 1:
            return
        if self.rank != 0:
            raise RuntimeError("only rank 0 gives commands")
        self._broadcast_bytes(msgspec.msgpack.encode(cmd))

    def _receive(self) -> bytes:
        if self._ctl is None:
            raise RuntimeError("follow() needs a process group (launch the ranks with torchrun)")
        return self._broadcast_bytes(None)

    def _broadcast_bytes(self, payload: bytes | None) -> bytes:
        import torch
        import torch.distributed as dist

        size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
        dist.broadcast(size, 0, group=self._ctl)
        n = int(size.item())
        if payload is not None:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            buf = torch.empty(n, dtype=torch.uint8)
        dist.broadcast(buf, 0, group=self._ctl)
        return payload if payload is not None else buf.numpy().tobytes()


def attn_implementation(choice: str, *, on_gpu: bool) -> str:
    """The attention kernel to load the model with: `choice` unless "auto", which is flash_attention_2 on a
    GPU when the flash-attn package is installed (it needs bf16/fp16 compute, which the GPU path has), and
    sdpa otherwise. Asking for flash_attention_2 without the package, or on CPU, is a clear error."""
    import importlib.util

    have_flash = importlib.util.find_spec("flash_attn") is not None
    if choice == "auto":
        return "flash_attention_2" if on_gpu and have_flash else "sdpa"
    if choice == "flash_attention_2" and not (on_gpu and have_flash):
        why = "the learner is on CPU" if not on_gpu else "flash-attn is not installed (pip install -e .[gpu])"
        raise ValueError(f"train.attn_implementation = flash_attention_2, but {why}")
    return choice


def _check_optimizer_state(optim: Any, trainable: set[str]) -> list[str]:
    """The trainable parameters the saved optimizer state has no entry for (never stepped); ValueError
    for a file that is not a full optimizer state keyed by parameter name, or that names parameters this
    model does not have (a different model: its moments would silently be lost)."""
    if not isinstance(optim, dict) or not isinstance(optim.get("state"), dict) or "param_groups" not in optim:
        raise ValueError("optimizer.pt is not an optimizer state dict")
    keys = set(optim["state"])
    if any(not isinstance(k, str) for k in keys):
        raise ValueError("optimizer.pt is keyed by parameter index (an older guirl's format), not by name")
    unknown = sorted(keys - trainable)
    if unknown:
        raise ValueError(
            f"optimizer.pt has state for {len(unknown)} parameter(s) this model lacks: {unknown[:3]}"
        )
    return sorted(trainable - keys)


def savable_state(state: dict[str, Any], *, tied: bool) -> dict[str, Any]:
    """`state` ready for safetensors: each tensor owning its storage (a gathered tensor may be a view into
    a larger buffer, and safetensors stores whole storages), without the LM head when it is tied to the
    embeddings (the loader ties it back)."""
    return {
        k: v.contiguous() if v.untyped_storage().nbytes() == v.nbytes else v.clone()
        for k, v in state.items()
        if not (tied and k == "lm_head.weight")
    }


def tied_embeddings(model: Any) -> bool:
    """Whether the LM head shares the input embedding's weight, read from the live model (the config's
    flags have changed meaning between transformers releases; a shared parameter stays one object under
    FSDP2)."""
    out, emb = model.get_output_embeddings(), model.get_input_embeddings()
    return out is not None and emb is not None and out.weight is emb.weight


def save_hf_model(model: Any, state: dict[str, Any], out: Path) -> None:
    """`state` (a full state dict on CPU) as a Hugging Face checkpoint in `out`: safetensors shards of at
    most 5 GB with their index, the config and the generation config. Works for an FSDP2-wrapped model,
    whose class is `FSDP<name>` (`save_pretrained` would write that into the config's architectures)."""
    from huggingface_hub import save_torch_state_dict
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # a progress bar on a service's stderr is noise
    out.mkdir(parents=True, exist_ok=True)
    config = model.config
    tied = tied_embeddings(model)
    state = savable_state(state, tied=tied)
    save_torch_state_dict(state, str(out), max_shard_size="5GB")
    name = type(model).__name__
    config.architectures = [name.removeprefix("FSDP")]
    config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)


def _load_hf_state(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else ["model.safetensors"]
    )
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(path / f)))
    if "lm_head.weight" not in state and "model.language_model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.language_model.embed_tokens.weight"]  # tied
    return state


# -- followers -------------------------------------------------------------------------------------------


def follower_command() -> list[str]:
    """The command line of a follower rank (its options travel in the environment)."""
    return [sys.executable, "-m", "guirl.learner.trainer"]


def follower_env(
    options: dict[str, Any], *, rank: int, world: int, master_port: int, master_addr: str = "127.0.0.1"
) -> dict[str, str]:
    """The environment torchrun would give rank `rank`, plus the trainer's options."""
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "GUIRL_PARENT_PID": str(os.getpid()),
        _ENV_OPTIONS: json.dumps(options),
    }


def spawn_followers(
    options: dict[str, Any],
    *,
    world: int,
    log_dir: Path,
    timeout_s: float = 600.0,
    remote: list[FollowerHost | None] | None = None,
    master_port: int = 0,
) -> tuple[list[Any], dict[str, str], Any]:
    """Start ranks 1..world-1; returns the processes, rank 0's rendezvous (torchrun's variables) and its
    store, already listening on its port (for `Trainer.load`). Their output goes to
    `log_dir/learner-rank<i>.log`.

    Ranks run on this machine, unless `remote[rank - 1]` places one on another cluster host
    (`guirl.cluster.spec.FollowerHost`): it is then started through
    that host's launcher (ssh / srun) with torchrun's variables pointing at this host's cluster address and
    `master_port`, and stops when its stdin closes (the launcher's connection is its lifeline)."""
    from guirl.net import host_address, listening_store

    remote = remote or [None] * (world - 1)
    across = any(r is not None for r in remote)
    # rank 0's store listens before the followers are told its port: no free-port probe, no race; on
    # loopback for ranks of this machine, on this host's cluster address when ranks run elsewhere
    master = host_address() if across else "127.0.0.1"
    store = listening_store(
        master, master_port if across else 0, world, timedelta(seconds=timeout_s), wait_for_workers=False
    )
    port = store.port
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(1, world):
        placed = remote[rank - 1]
        with open(log_dir / f"learner-rank{rank}.log", "ab") as out:
            if placed is None:
                env = follower_env(options, rank=rank, world=world, master_port=port, master_addr=master)
                procs.append(
                    subprocess.Popen(
                        follower_command(),
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )
                continue
            procs.append(_remote_follower(options, placed, rank, world, master, port, out))
    rendezvous = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
    }
    return procs, rendezvous, store


def _remote_follower(
    options: dict[str, Any], placed: FollowerHost, rank: int, world: int, master: str, port: int, out: Any
) -> Any:
    """Rank `rank` on another host, through its launcher; stdin is its lifeline."""
    from guirl.cluster.launch import die_with_us, make_launcher

    host = placed.spec
    launcher = make_launcher(placed.host, host, placed.cluster)
    variables = {
        "RANK": str(rank),
        "LOCAL_RANK": str(placed.local_rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "GUIRL_LIFELINE": "1",
        _ENV_OPTIONS: json.dumps(options),
    }
    if os.environ.get("CUDA_VISIBLE_DEVICES"):  # the learner's GPUs (the same ids on every learner host)
        variables["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    python = host.python or sys.executable
    argv = ["env", *[f"{k}={v}" for k, v in variables.items()], python, "-m", "guirl.learner.trainer"]
    argv.extend(["--cluster", placed.cluster, "--host", placed.host])  # its label, for --down
    return subprocess.Popen(
        launcher.run_argv(argv),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.PIPE,
        preexec_fn=die_with_us,
        start_new_session=True,
    )


def _lifeline() -> None:
    """Exit once stdin ends (rank 0's ssh or srun connection to this host went away)."""
    from guirl.cluster.agent import wait_for_eof

    wait_for_eof(0)
    os._exit(1)


def main() -> None:
    """A follower rank: build the trainer from the options in the environment and follow rank 0."""
    from guirl.log import setup_logging
    from guirl.proc import die_with_parent

    parent = int(os.environ.get("GUIRL_PARENT_PID", "0"))
    if parent:
        die_with_parent()
        if os.getppid() != parent:  # rank 0 died before prctl took effect
            sys.exit(1)
    elif os.environ.get("GUIRL_LIFELINE") == "1":  # on another host: rank 0's launcher connection is ours
        threading.Thread(target=_lifeline, name="lifeline", daemon=True).start()
    rank = int(os.environ.get("RANK", "-1"))
    if rank < 1:
        sys.exit(f"guirl.learner.trainer runs learner ranks 1..N-1 (RANK={os.environ.get('RANK')!r})")
    setup_logging(f"learner-rank{rank}")
    raw = os.environ.get(_ENV_OPTIONS)
    if not raw:
        sys.exit(f"{_ENV_OPTIONS} is not set: the trainer's options come from rank 0")
    opts = json.loads(raw)
    trainer = Trainer(
        ckpt=opts["ckpt"],
        train=msgspec.convert(opts.get("train", {}), TrainConfig),
        seed=int(opts.get("seed", 0)),
        temperature=float(opts.get("temperature", 1.0)),
    )
    store, rendezvous = None, None
    if (
        parent or os.environ.get("GUIRL_LIFELINE") == "1"
    ):  # started by rank 0, whose store listens at MASTER_PORT
        from torch.distributed import TCPStore

        rendezvous = dict(os.environ)
        store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            int(os.environ["WORLD_SIZE"]),
            is_master=False,
            timeout=timedelta(seconds=600),
        )
    trainer.load(
        Path(opts["resume_from"]) if opts.get("resume_from") else None, rendezvous=rendezvous, store=store
    )
    log.info("learner rank %d of %d ready, following rank 0", trainer.rank, trainer.world)
    trainer.follow()
    log.info("learner rank %d stopped", rank)


if __name__ == "__main__":
    main()
