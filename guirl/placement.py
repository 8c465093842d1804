"""Where each part of a run goes on the GPUs, from OpenClaw-RL's GUI-RL variables (NUM_GPUS, ACTOR_GPUS,
ROLLOUT_GPUS, PRM_GPUS) — pure logic, checked before anything starts.

Train mode splits the GPUs in order: the learner's ranks take the first ACTOR_GPUS, the rollout engines the
next ROLLOUT_GPUS, the PRM's judge the last PRM_GPUS, and the three must add up to NUM_GPUS (GUI-RL's
layouts: 4/4, 4/3/1). Eval mode has no learner: the rollout engines take the first ROLLOUT_GPUS (GUI-RL's
all-rollout layout is NUM_GPUS=8 ROLLOUT_GPUS=8). GPU ids are those of CUDA_VISIBLE_DEVICES when it is set
(its first NUM_GPUS entries), else 0..NUM_GPUS-1; CUDA is never asked, so `guirl train --dry-run` plans a
GPU run on a laptop. A config that uses no GPU (every engine and the learner on CPU) gets an empty plan and
no GPU checks at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import msgspec

from guirl.config.schema import (
    GuirlConfig,
    HFBackendConfig,
    InferenceConfig,
    PRMConfig,
    SGLangBackendConfig,
)
from guirl.config.validate import PlacementError, check_gpus, on_cuda, uses_gpus

__all__ = ["EnginePlacement", "Placement", "PlacementError", "apply", "plan", "uses_gpus", "vm_split"]


@dataclass(frozen=True)
class EnginePlacement:
    """One inference engine (a rollout engine or a judge engine) and its GPUs."""

    name: str
    """Engine name: `sglang0`, `hf1`, `judge-sglang0`, ..."""
    gpus: tuple[str, ...]
    """Physical GPU ids, for the CUDA_VISIBLE_DEVICES of a launched server process; () = none or external."""
    ordinals: tuple[int, ...]
    """Positions of those GPUs among the guirl process's visible devices (torch's `cuda:<i>`)."""
    url: str = ""
    """Attach mode: the running server's URL."""


@dataclass(frozen=True)
class Placement:
    """The GPU layout of one run: the learner's GPUs, the rollout engines and the judge engines."""

    mode: str
    uses_gpus: bool
    visible: tuple[str, ...] = ()
    learner_gpus: tuple[str, ...] = ()
    learner_ordinals: tuple[int, ...] = ()
    rollout: tuple[EnginePlacement, ...] = ()
    judge: tuple[EnginePlacement, ...] = ()
    notes: tuple[str, ...] = ()

    def learner_env(self) -> dict[str, str]:
        """Environment of the learner's rank processes: only the learner's GPUs visible ({} on CPU)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.learner_gpus)} if self.learner_gpus else {}

    def describe(self, cfg: GuirlConfig) -> str:
        """The plan as lines a person reads before a run starts."""
        lines = [f"plan for {self.mode} (nothing started)"]
        if self.uses_gpus:
            lines.append(f"GPUs: {len(self.visible)} ({','.join(self.visible)})")
        else:
            lines.append("GPUs: none (everything runs on CPU)")
        if self.mode == "train":
            lines.append("learner: " + _describe_learner(self, cfg))
        lines.append("rollout: " + _describe_engines(self.rollout, cfg.inference, cfg.inference.engines, ""))
        if self.mode == "train" and cfg.prm.enabled:
            lines.append("judge: " + _describe_engines(self.judge, cfg.prm, cfg.prm.engines, "judge-"))
        lines.append("env: " + _describe_env(self.mode, cfg))
        judge = (
            f", judge {cfg.model.prm_model_path or '(unset)'}"
            if self.mode == "train" and cfg.prm.enabled
            else ""
        )
        lines.append(f"model: policy {cfg.model.hf_ckpt or '(unset)'}{judge}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


# --------------------------------------------------------------------------- planning


def _visible(num_gpus: int, visible: str | None) -> tuple[str, ...]:
    """The first NUM_GPUS ids of CUDA_VISIBLE_DEVICES (the `visible` argument stands in for it), else
    0..NUM_GPUS-1."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if raw is None:
        return tuple(str(i) for i in range(num_gpus))
    if not raw.strip():
        raise PlacementError(f"CUDA_VISIBLE_DEVICES is empty (no GPU visible), but NUM_GPUS is {num_gpus}")
    ids = [part.strip() for part in raw.split(",")]
    if "" in ids:
        raise PlacementError(
            f"CUDA_VISIBLE_DEVICES={raw!r} has an empty entry: list GPU ids separated by commas"
        )
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise PlacementError(f"CUDA_VISIBLE_DEVICES={raw!r} lists GPU(s) {','.join(twice)} more than once")
    if len(ids) < num_gpus:
        raise PlacementError(
            f"CUDA_VISIBLE_DEVICES={raw!r} shows {len(ids)} GPU(s), but NUM_GPUS is {num_gpus}: "
            "lower NUM_GPUS or make more GPUs visible"
        )
    return tuple(ids[:num_gpus])


def _engines(
    backend: str,
    hf: HFBackendConfig,
    sglang: SGLangBackendConfig,
    engines: int,
    gpus: tuple[str, ...],
    first_ordinal: int,
    *,
    prefix: str,
) -> tuple[EnginePlacement, ...]:
    """The engines of one engine set (the rollout's or the judge's) over its `gpus`."""
    if backend == "sglang" and sglang.urls:
        return tuple(EnginePlacement(f"{prefix}sglang{i}", (), (), url) for i, url in enumerate(sglang.urls))
    if backend == "sglang":
        tp = sglang.tp_size  # a positive multiple of the GPUs: `check_gpus`
        return tuple(
            EnginePlacement(
                f"{prefix}sglang{i}",
                gpus[i * tp : (i + 1) * tp],
                tuple(range(first_ordinal + i * tp, first_ordinal + (i + 1) * tp)),
            )
            for i in range(len(gpus) // tp)
        )
    if backend == "hf" and on_cuda(hf):
        return tuple(
            EnginePlacement(f"{prefix}hf{i}", (g,), (first_ordinal + i,)) for i, g in enumerate(gpus)
        )
    return tuple(EnginePlacement(f"{prefix}{backend}{i}", (), ()) for i in range(engines))


def _idle_note(gpus: tuple[str, ...], var: str, why: str) -> str:
    return f"GPU(s) {','.join(gpus)} ({var}) sit idle: {why}"


def plan(cfg: GuirlConfig, mode: Literal["train", "eval"], *, visible: str | None = None) -> Placement:
    """The GPU layout of a run of `cfg` in `mode`; PlacementError when the variables do not fit together.

    `visible` stands in for the CUDA_VISIBLE_DEVICES environment variable (tests, other machines).
    """
    if not uses_gpus(cfg, mode):
        return Placement(mode=mode, uses_gpus=False)
    check_gpus(cfg, mode)  # the rules between the GPU settings (`guirl.config.validate`)
    c, inf, p = cfg.cluster, cfg.inference, cfg.prm
    ids = _visible(c.num_gpus, visible)
    notes: list[str] = []
    learner: tuple[str, ...] = ()
    judge: tuple[EnginePlacement, ...] = ()
    if mode == "train":
        learner_on_gpu = cfg.train.device != "cpu"
        actor_ids = ids[: c.actor_gpus]
        if learner_on_gpu:
            learner = actor_ids
        elif actor_ids:
            notes.append(
                _idle_note(actor_ids, "ACTOR_GPUS", 'the learner trains on CPU (train.device = "cpu")')
            )
        first = c.actor_gpus
        rollout_ids = ids[first : first + c.rollout_gpus]
        prm_first = first + c.rollout_gpus
        prm_ids = ids[prm_first:]
        if p.enabled:
            judge = _engines(
                p.backend,
                p.hf,
                p.sglang,
                p.engines,
                prm_ids,
                prm_first,
                prefix="judge-",
            )
            if prm_ids and not any(e.gpus for e in judge):
                notes.append(
                    _idle_note(prm_ids, "PRM_GPUS", f"the judge ({_kind(p.backend, p.sglang)}) uses none")
                )
    else:
        first = 0
        rollout_ids = ids[: c.rollout_gpus]
        if c.rollout_gpus < c.num_gpus:
            notes.append(
                f"{c.num_gpus - c.rollout_gpus} GPU(s) unused: {','.join(ids[c.rollout_gpus :])} "
                f"(NUM_GPUS {c.num_gpus}, ROLLOUT_GPUS {c.rollout_gpus}; eval mode has no learner or PRM)"
            )
    rollout = _engines(
        inf.backend,
        inf.hf,
        inf.sglang,
        inf.engines,
        rollout_ids,
        first,
        prefix="",
    )
    if rollout_ids and not any(e.gpus for e in rollout):
        notes.append(
            _idle_note(
                rollout_ids,
                "ROLLOUT_GPUS",
                f"the rollout engines ({_kind(inf.backend, inf.sglang)}) use none",
            )
        )
    return Placement(
        mode=mode,
        uses_gpus=True,
        visible=ids,
        learner_gpus=learner,
        learner_ordinals=tuple(range(len(learner))),
        rollout=rollout,
        judge=judge,
        notes=tuple(notes),
    )


def _placed(engines: tuple[EnginePlacement, ...]) -> bool:
    """Engines that the plan counted (GPU or attach placed), as opposed to `engines` copies on CPU."""
    return bool(engines) and all(e.gpus or e.url for e in engines)


def apply(cfg: GuirlConfig, placement: Placement) -> GuirlConfig:
    """`cfg` with the engine counts the plan made: `inference.engines` = the GPU or attached rollout
    engines, `prm.engines` = the judge's; counts of engines without GPUs are left as configured."""
    if _placed(placement.rollout):
        cfg = msgspec.structs.replace(
            cfg, inference=msgspec.structs.replace(cfg.inference, engines=len(placement.rollout))
        )
    if _placed(placement.judge):
        cfg = msgspec.structs.replace(cfg, prm=msgspec.structs.replace(cfg.prm, engines=len(placement.judge)))
    return cfg


# --------------------------------------------------------------------------- describing


def _kind(backend: str, sglang: SGLangBackendConfig) -> str:
    return "sglang, attached by URL" if backend == "sglang" and sglang.urls else backend


def _describe_learner(placement: Placement, cfg: GuirlConfig) -> str:
    t = cfg.train
    ranks = f"{t.ranks} FSDP2 rank{'s' if t.ranks != 1 else ''}"
    gpu = bool(placement.learner_gpus)
    precision = t.mixed_precision if t.mixed_precision != "auto" else ("bf16" if gpu else "fp32")
    if not gpu:
        return f"{ranks} on CPU, gloo, {precision}"
    return (
        f"{ranks} on GPUs {','.join(placement.learner_gpus)}, NCCL, {precision} mixed precision, "
        f"attention {t.attn_implementation}, weights to the engines by {t.weight_sync}"
    )


def _describe_engines(
    engines: tuple[EnginePlacement, ...], section: InferenceConfig | PRMConfig, count: int, prefix: str
) -> str:
    """One engine set: how many, which backend, and each engine's GPUs (or URL)."""
    backend = section.backend
    if not engines:  # a CPU-only plan: the engines as configured
        engines = tuple(EnginePlacement(f"{prefix}{backend}{i}", (), ()) for i in range(count))
    n = len(engines)
    head = f"{n} {backend} engine{'s' if n != 1 else ''}"
    if backend == "sglang" and section.sglang.urls:
        return f"{head}, attached: " + ", ".join(f"{e.name} {e.url}" for e in engines)
    if backend == "sglang":
        tp = section.sglang.tp_size
        return f"{head}, tp {tp}: " + ", ".join(
            f"{e.name} GPU{'s' if len(e.gpus) > 1 else ''} {','.join(e.gpus)}" for e in engines
        )
    if backend == "hf":
        if engines[0].gpus:
            return f"{head}, {section.hf.dtype}: " + ", ".join(
                f"{e.name} GPU {e.gpus[0]} (cuda:{e.ordinals[0]})" for e in engines
            )
        return f"{head} on CPU, {section.hf.dtype}"
    if backend == "openai":
        return f"{head}, no GPU: {section.openai.base_url}"
    return f"{head}, no GPU"


def _describe_env(mode: str, cfg: GuirlConfig) -> str:
    workers = cfg.env.workers
    head = f"{workers} worker{'s' if workers != 1 else ''}"
    rows = cfg.data.train if mode == "train" else cfg.data.eval
    if rows:
        return f"{head}, grounding rows from {rows} (GUI-R1 mode)"
    tasks = cfg.train.tasks if mode == "train" else cfg.eval.tasks
    return f"{head}, {cfg.env.max_envs} VMs ({cfg.env.provider}), tasks {tasks}"


def vm_split(total: int, workers: int, per_worker: int = 0) -> list[int]:
    """VMs of each worker: `per_worker` each when set, else `total` shared out as evenly as possible
    (every worker gets at least one)."""
    if per_worker:
        return [per_worker] * workers
    base, extra = divmod(max(total, workers), workers)
    return [base + (1 if i < extra else 0) for i in range(workers)]
