"""Every rule between config fields, in one place: `load_config(mode=...)`, `--dry-run`, `guirl eval` and
`guirl train` all run `validate`, so they cannot disagree about what a run may be given.

`validate(cfg, "eval")` and `validate(cfg, "train")` check what a run of that mode needs before anything
starts (a cloud's settings, the backend a training run needs, GPU counts that add up...); a config loaded
without a mode (to be shown, or handed to `bin/launch_cluster`, whose run validates it) is only
type-checked. When a cluster file names each role's GPUs, their counts replace NUM_GPUS, ACTOR_GPUS...:
the run checks the rest with `gpus=False`, and `guirl.placement` the counts the roles give. Each failure is
an `InputError` naming the keys to set. What depends on the machine (`CUDA_VISIBLE_DEVICES`, the cores a
process may use) is checked where it is used (`guirl.placement`, `guirl.roles.cpu_set`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from guirl.config.schema import ENV_VARS, GuirlConfig, HFBackendConfig, SGLangBackendConfig
from guirl.errors import InputError


class PlacementError(InputError):
    """The GPU layout cannot work; the message names the values and the variables that set them."""


CLOUDS = ("aws", "volcengine", "aliyun")
CLOUD_REQUIRED = {
    "aws": ("image_id", "subnet_id", "security_group_id"),
    "volcengine": ("access_key", "secret_key", "image_id", "subnet_id", "security_group_id"),
    "aliyun": ("access_key_id", "access_key_secret", "image_id", "vswitch_id", "security_group_id"),
}
"""The `[cloud.<provider>]` settings each cloud provider cannot start a VM without."""


def validate(cfg: GuirlConfig, mode: str | None = None, *, gpus: bool = True) -> None:
    """Check `cfg`'s cross-field rules for a run in `mode` ("eval" or "train"; None: a config only
    loaded, to be shown or handed on, which any well-typed tree is); InputError otherwise. `gpus=False`
    leaves out the GPU counts (NUM_GPUS...), which a cluster file naming its roles' GPUs replaces."""
    found = problems(cfg, mode, gpus=gpus)
    if len(found) == 1:
        raise InputError(found[0])
    if found:
        raise InputError(f"{len(found)} problems:\n" + "\n".join(f"  - {p}" for p in found))


def problems(cfg: GuirlConfig, mode: str | None = None, *, gpus: bool = True) -> list[str]:
    """Every rule `cfg` breaks for a run in `mode`, each rule's message once (`validate` raises them)."""
    if mode not in (None, "eval", "train"):
        raise ValueError(f"mode must be None, 'eval' or 'train', got {mode!r}")
    if mode is None:
        return []
    checks: list[Callable[[], None]] = [lambda: check_chaos(cfg)]
    if gpus:
        checks.append(lambda: check_gpus(cfg, mode))
    desktops = not (cfg.data.eval if mode == "eval" else cfg.data.train or cfg.data.eval)
    if desktops:  # GUI-R1 mode plays grounding rows, with its own prompt and no VM
        checks += [lambda: check_cloud(cfg.env.provider, cfg.cloud), lambda: check_prompt_style(cfg)]
        checks.append(lambda: check_replay(cfg))
        checks.append(lambda: check_task_lists(cfg, mode))
    else:
        checks.append(lambda: check_rows(cfg, mode))
    if mode == "train":
        checks.append(lambda: check_train(cfg))
    found = []
    for check in checks:
        try:
            check()
        except InputError as exc:
            found.append(str(exc))
    return found


def check_rows(cfg: GuirlConfig, mode: str) -> None:
    """GUI-R1 mode plays the rows of `data.train` / `data.eval`: the settings that choose OSWorld tasks
    (domains, unsupported ones skipped) would be ignored, so they are refused; `--limit` takes the rows."""
    rows, section = (cfg.data.eval, cfg.eval) if mode == "eval" else (cfg.data.train, cfg.train)
    if not rows:
        return
    given = [f"{mode}.domains (--domain)"] if section.domains else []
    given += [f"{mode}.skip_unsupported (--skip-unsupported)"] if section.skip_unsupported else []
    resets = [f"--set {mode}.domains=[]"] if section.domains else []
    resets += [f"--set {mode}.skip_unsupported=false"] if section.skip_unsupported else []
    if given:
        raise InputError(
            f"{' and '.join(given)} choose{'s' if len(given) == 1 else ''} OSWorld tasks, but this {mode} "
            f"plays the rows of data.{mode} ({rows}), which have none; leave "
            f"{'it' if len(given) == 1 else 'them'} out ({', '.join(resets)}; --limit N takes the first "
            "N rows)"
        )


def check_chaos(cfg: GuirlConfig) -> None:
    """Busy faults are `HoldGil` messages, refused unless fault injection is on."""
    if cfg.chaos.seed and cfg.chaos.busy and not cfg.runtime.fault_injection:
        raise InputError("chaos.busy faults make actors hold the GIL: set runtime.fault_injection = true")


def check_cidr(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """`cidr` as a network, refused unless it is a private range (the VM server is no internet service)."""
    if not cidr:
        raise InputError("cloud.cluster_cidr is required for a cloud provider (e.g. 10.0.0.0/16)")
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        raise InputError(f"cloud.cluster_cidr {cidr!r} is not an address range: {exc}") from None
    if not net.is_private or net.prefixlen == 0:
        raise InputError(
            f"cloud.cluster_cidr {cidr!r} would open the VM server (it runs any command it is sent) to the "
            "internet: give the cluster's private range"
        )
    return net


def check_replay(cfg: GuirlConfig) -> None:
    """Replayed desktops need a recorded run, and take typed actions only (they run no programs)."""
    env = cfg.env
    if env.provider != "replay":
        return
    if not env.replay.run:
        raise InputError('env.provider = "replay" needs env.replay.run: the recorded run directory to replay')
    if not (Path(env.replay.run) / "episodes").is_dir():
        raise InputError(f"env.replay.run = {env.replay.run!r} is not a run directory (no episodes/)")
    if env.action_space != "computer_use":
        raise InputError(
            'env.provider = "replay" takes typed actions only (a replayed desktop runs no programs): '
            'set env.action_space = "computer_use"'
        )


def check_replay_source(cfg: GuirlConfig, run_dir: Path) -> None:
    """A run cannot replay itself: its episodes would overwrite the screens being replayed."""
    if cfg.env.provider == "replay" and Path(cfg.env.replay.run).resolve() == Path(run_dir).resolve():
        raise InputError(f"env.replay.run is the run directory being written ({run_dir}): replay another run")


def check_cloud(provider: str, cloud: object) -> None:
    """The settings a cloud provider needs (and a private `cloud.cluster_cidr`); nothing for `local` or
    `replay`."""
    if provider in ("local", "replay"):
        return
    if provider not in CLOUDS:
        raise InputError(f"env.provider = {provider!r}: not a cloud (one of {', '.join(CLOUDS)})")
    section = getattr(cloud, provider)
    keys = [f"cloud.{provider}.{k}" for k in CLOUD_REQUIRED[provider] if not getattr(section, k)]
    if not cloud.cluster_cidr:  # type: ignore[attr-defined]
        keys.insert(0, "cloud.cluster_cidr")
    found = []
    if keys:  # all of them at once, each with the variable that sets it
        env_of = {path: name for name, path in ENV_VARS.items()}
        missing = [f"{k} ({env_of[k]})" if k in env_of else k for k in keys]
        found.append(f"env.provider = {provider!r} needs {', '.join(missing)}")
    if cloud.cluster_cidr:  # type: ignore[attr-defined]
        try:
            check_cidr(cloud.cluster_cidr)  # type: ignore[attr-defined]
        except InputError as exc:
            found.append(str(exc))
    if found:
        raise InputError("; ".join(found))


def check_task_lists(cfg: GuirlConfig, mode: str) -> None:
    """The task lists a run plays are named (OSWorld's configs leave them to GUI-RL's variables)."""
    unset = []
    if mode == "train" and not cfg.train.tasks:
        unset.append("train.tasks (GUI_TRAIN_TASKS)")
    if (mode == "eval" or cfg.train.eval_every) and not cfg.eval.tasks:
        unset.append("eval.tasks (GUI_EVAL_TASKS)")
    if unset:
        raise InputError(
            f"no task list: set {' and '.join(unset)} to a meta list, e.g. an OSWorld checkout's "
            "evaluation_examples/test_nochrome.json"
        )


def check_prompt_style(cfg: GuirlConfig) -> None:
    """`agent.prompt_style = "gui-rl"` can be honoured: it is a computer-use prompt whose tools block the
    checkpoint's own template renders, which an OpenAI-compatible server does not."""
    if cfg.agent.prompt_style != "gui-rl":
        return
    if cfg.agent.response_format != "computer_use":
        raise InputError('agent.prompt_style = "gui-rl" needs agent.response_format = "computer_use"')
    if cfg.inference.backend == "openai":
        raise InputError(
            'agent.prompt_style = "gui-rl" needs inference.backend "hf" or "sglang": an OpenAI-compatible '
            "server rewrites the tools block that GUI-RL's prompt has the chat template render"
        )


def check_train(cfg: GuirlConfig) -> None:
    """The settings a train run needs."""
    t = cfg.train
    if t.simulated_update_s:  # the control plane measured around a timed update: no model anywhere
        if cfg.inference.backend != "scripted" or not cfg.inference.scripted.tokens:
            raise InputError(
                "train.simulated_update_s (a learner without a model) needs engines without one: "
                'inference.backend = "scripted" with inference.scripted.tokens = true'
            )
        if t.ranks != 1:
            raise InputError("train.simulated_update_s is one learner rank: set train.ranks = 1")
    elif cfg.inference.backend not in ("hf", "sglang"):
        raise InputError(
            f"inference.backend={cfg.inference.backend!r}: training needs the engine's token ids and "
            'log-probs; use "hf" or "sglang" (the scripted backend only with a simulated learner: '
            "train.simulated_update_s)"
        )
    if not t.updates:
        raise InputError("train.updates must be set (> 0): the number of policy updates to make")
    frames = trajectory_frames(cfg.agent.max_steps)
    if frames > cfg.codec.max_frames:  # the env worker could not send a long episode's samples
        raise InputError(
            f"codec.max_frames = {cfg.codec.max_frames} is below the {frames} frames a "
            f"trajectory of agent.max_steps = {cfg.agent.max_steps} steps can take: raise it to {frames}"
        )
    if t.advantage == "step_wise" and not cfg.prm.enabled:
        raise InputError('train.advantage = "step_wise" needs PRM scores: set prm.enabled = true')
    if cfg.data.train:  # GUI-R1 mode
        if t.advantage == "step_wise":
            raise InputError('train.advantage = "step_wise" is for desktop episodes; GUI-R1 mode is "grpo"')
        if t.eval_every and not cfg.data.eval:
            raise InputError("train.eval_every in GUI-R1 mode needs data.eval (held-out rows)")


def trajectory_frames(max_steps: int) -> int:
    """The most wire frames a trajectory of `max_steps` steps takes: body and header, and per step its three
    tensors (prompt ids, response ids, log-probs) and its screen. A screen travels once: a history image is
    an earlier step's screen, the same bytes (`guirl.agent.prompt.keep_resized`)."""
    return 2 + 4 * max_steps


def on_cuda(hf: HFBackendConfig) -> bool:
    return hf.device.startswith("cuda")


def _judge_on_gpus(cfg: GuirlConfig) -> bool:
    """The PRM's judge wants GPUs of its own (a launched SGLang server, or transformers on CUDA)."""
    p = cfg.prm
    return (p.backend == "sglang" and not p.sglang.urls) or (p.backend == "hf" and on_cuda(p.hf))


def uses_gpus(cfg: GuirlConfig, mode: Literal["train", "eval"]) -> bool:
    """Whether a run of `cfg` in `mode` puts anything on a GPU (or attaches to SGLang servers)."""
    inf = cfg.inference
    if inf.backend == "sglang" or (inf.backend == "hf" and on_cuda(inf.hf)):
        return True
    if mode != "train":
        return False
    p = cfg.prm
    judge = p.enabled and (p.backend == "sglang" or (p.backend == "hf" and on_cuda(p.hf)))
    return judge or cfg.train.device == "cuda"


def check_gpus(cfg: GuirlConfig, mode: str) -> None:
    """NUM_GPUS, ACTOR_GPUS, ROLLOUT_GPUS, PRM_GPUS, `train.ranks` and the SGLang servers' `tp_size` fit
    together (PlacementError naming them otherwise); nothing to check for a run that uses no GPU. Where the
    GPUs go is `guirl.placement`."""
    if not uses_gpus(cfg, mode):  # type: ignore[arg-type]
        return
    c, p = cfg.cluster, cfg.prm
    _check_tp(cfg.inference.backend, cfg.inference.sglang, c.rollout_gpus, "ROLLOUT_GPUS", "inference")
    if mode != "train":
        if c.rollout_gpus > c.num_gpus:
            raise PlacementError(
                f"ROLLOUT_GPUS ({c.rollout_gpus}) is more than NUM_GPUS ({c.num_gpus}): eval mode serves "
                "rollouts on at most all of them"
            )
        return
    learner_on_gpu = cfg.train.device != "cpu"
    if c.actor_gpus < 1 and learner_on_gpu:
        raise PlacementError(
            "ACTOR_GPUS is 0, but train mode needs at least one GPU for the learner "
            '(ACTOR_GPUS=0 is the eval layout; train.device = "cpu" keeps the learner off the GPUs)'
        )
    total = c.actor_gpus + c.rollout_gpus + c.prm_gpus
    if total != c.num_gpus:
        raise PlacementError(
            f"ACTOR_GPUS ({c.actor_gpus}) + ROLLOUT_GPUS ({c.rollout_gpus}) + PRM_GPUS ({c.prm_gpus}) "
            f"= {total}, but NUM_GPUS is {c.num_gpus}: they must add up"
        )
    if c.prm_gpus and not p.enabled:
        raise PlacementError(
            f"PRM_GPUS is {c.prm_gpus}, but the PRM is off (prm.enabled = false): set PRM_GPUS=0 "
            "or enable the PRM"
        )
    if p.enabled and _judge_on_gpus(cfg) and not c.prm_gpus:
        raise PlacementError(
            f'PRM_GPUS is 0, but the PRM\'s judge (prm.backend = "{p.backend}") runs on GPUs of its own: '
            "give it PRM_GPUS (and take them from ACTOR_GPUS or ROLLOUT_GPUS)"
        )
    if learner_on_gpu and cfg.train.ranks != c.actor_gpus:
        raise PlacementError(
            f"train.ranks ({cfg.train.ranks}) must equal ACTOR_GPUS ({c.actor_gpus}): the learner "
            "runs one FSDP2 rank per actor GPU"
        )
    if p.enabled:
        _check_tp(p.backend, p.sglang, c.prm_gpus, "PRM_GPUS", "prm")


def _check_tp(backend: str, sglang: SGLangBackendConfig, gpus: int, var: str, section: str) -> None:
    """The SGLang servers guirl launches for one engine set take `tp_size` GPUs each, so `var` (its GPU
    count) is a positive multiple of it; servers given by URL take none here."""
    if backend != "sglang" or sglang.urls:
        return
    tp = sglang.tp_size
    if gpus < tp or gpus % tp:
        raise PlacementError(
            f"{var} ({gpus}) is not a positive multiple of {section}.sglang.tp_size ({tp}): each SGLang "
            f"server takes {tp} GPU(s)"
        )
