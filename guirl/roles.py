"""The roles of a run, one named constructor each: what every actor is given (`broker_spec`, `worker_specs`,
`learner_spec`, `prm_spec`, `coordinator`), and `RunActors`, which starts them on the run's cluster and
stops them together. `guirl eval` and `guirl train` (on one machine or from `bin/launch_cluster`) build
their actors here, so every mode gives a role the same slice of the config.

Each spec's options are the role's typed options (`Options` on the actor class), checked again by the
supervisor before any process starts.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import msgspec

from guirl.actors.coordinator import Coordinator
from guirl.config import GuirlConfig
from guirl.errors import InputError, RunError
from guirl.runtime.process import ActorOptionsError, ActorSpec
from guirl.runtime.supervisor import Supervisor
from guirl.vmpool.tasks.suite import SkippedTask, SuiteTask, check_supported, load_suite

# -- what each role is given --------------------------------------------------------------------------


def cpu_set(cpus: list[int], setting: str) -> list[int]:
    """`cpus` checked against the cores this process may use (a clear error, not a failed actor start)."""
    usable = os.sched_getaffinity(0)
    bad = sorted(set(cpus) - usable)
    if bad:
        raise InputError(f"{setting}: core(s) {bad} not available here (usable: {sorted(usable)})")
    return sorted(set(cpus))


def _options(struct: msgspec.Struct) -> dict[str, Any]:
    return msgspec.to_builtins(struct)


def broker_spec(
    cfg: GuirlConfig, ckpt: str, run_dir: Path, *, judge_ckpt: str | None = None, placement: Any = None
) -> ActorSpec:
    """The inference broker (eval and train modes alike); with `judge_ckpt`, it also serves the PRM's judge
    under `prm.model_name`; with `placement` (`guirl.placement.Placement`), its engines go on the planned
    GPUs."""
    from guirl.actors.broker import BrokerGpus, BrokerOptions, JudgeModel

    placed = BrokerGpus()
    if placement is not None and placement.uses_gpus:
        placed = BrokerGpus(
            rollout_gpus=[list(e.gpus) for e in placement.rollout],
            rollout_devices=[f"cuda:{e.ordinals[0]}" if e.ordinals else "" for e in placement.rollout],
            judge_gpus=[list(e.gpus) for e in placement.judge],
            judge_devices=[f"cuda:{e.ordinals[0]}" if e.ordinals else "" for e in placement.judge],
        )
    options = BrokerOptions(
        inference=cfg.inference,
        ckpt=ckpt,
        screen=[cfg.env.screen_width, cfg.env.screen_height],
        coordinates=cfg.agent.coordinates,
        response_format=cfg.agent.response_format,
        judge=JudgeModel(prm=cfg.prm, ckpt=judge_ckpt) if judge_ckpt is not None else None,
        placement=placed,
        log_dir=str(run_dir / "logs"),
    )
    return ActorSpec(
        name="broker",
        target="guirl.actors.broker:InferenceBroker",
        bind=[cfg.endpoints.broker],
        run_dir=str(run_dir),
        cpus=cpu_set(cfg.cluster.rollout_cpus, "cluster.rollout_cpus"),
        options=_options(options),
    )


@dataclass(frozen=True)
class Peers:
    """The endpoints an env worker talks to ("" where the run has no such role)."""

    coordinator: str
    broker: str
    learner: str = ""
    prm: str = ""


def worker_specs(cfg: GuirlConfig, run_dir: Path, peers: Peers, *, mode: str) -> Callable[..., ActorSpec]:
    """`make_worker(index, vms, prewarm=0)`: env worker `index` of the run (a dataset worker in GUI-R1 mode)
    with `vms` desktops, the agent, environment and timeouts of `cfg`, pinned to `cluster.rollout_cpus`.
    A run's control socket calls it too, to add workers while the run goes on."""
    from guirl.actors.env_worker import EnvWorkerOptions

    dataset = bool(cfg.data.train if mode == "train" else cfg.data.eval)
    cpus = cpu_set(cfg.cluster.rollout_cpus, "cluster.rollout_cpus")

    def make_worker(index: int, vms: int, prewarm: int = 0) -> ActorSpec:
        options = EnvWorkerOptions(
            coordinator=peers.coordinator,
            broker=peers.broker,
            learner=peers.learner,
            run_dir=str(run_dir),
            agent=cfg.agent,
            env=cfg.env,
            cloud=cfg.cloud if cfg.env.provider not in ("local", "replay") else None,
            vms=vms,
            prewarm=min(vms, prewarm) if mode == "eval" else None,
            setup_timeout_s=cfg.eval.setup_timeout_s,
            policy_timeout_s=cfg.inference.request_timeout_s,
            fault_kill_vm_at_step=cfg.faults.kill_vm_at_step if index == 0 and mode == "eval" else -1,
            prm=peers.prm,
            prm_history_images=cfg.prm.history_images if peers.prm else 0,
            prm_queue=cfg.prm.worker_queue if peers.prm else 256,
        )
        target = "guirl.actors.env_worker:EnvWorker"
        if dataset:
            from guirl.actors.dataset_worker import DatasetWorkerOptions

            options = DatasetWorkerOptions(**msgspec.structs.asdict(options), data=cfg.data)
            target = "guirl.actors.dataset_worker:DatasetWorker"
        return ActorSpec(
            name=f"worker{index}", target=target, run_dir=str(run_dir), cpus=cpus, options=_options(options)
        )

    return make_worker


def learner_spec(
    cfg: GuirlConfig,
    run_dir: Path,
    ckpt: str,
    broker: str,
    coordinator: str,
    placement: Any = None,
    resume_from: Path | None = None,
) -> ActorSpec:
    """The learner: `train`'s algorithm on the policy `ckpt`, taking trajectories from the env workers and
    publishing each version to `broker` and `coordinator` in the weight transport of `weight_transport`."""
    from guirl.actors.learner import LearnerOptions

    r = cfg.rollout
    on_gpu = bool(placement is not None and placement.learner_gpus) or cfg.train.device == "cuda"
    options = LearnerOptions(
        train=cfg.train,
        ckpt=ckpt,
        run_dir=str(run_dir),
        n_samples=r.n_samples_per_prompt,
        batch_size=r.batch_size,
        temperature=cfg.agent.temperature,
        broker=broker,
        coordinator=coordinator,
        device="cuda" if on_gpu else (cfg.train.device or "cpu"),
        seed=cfg.run.seed,
        engines=weight_ranks(cfg),
        resume_from=str(resume_from or ""),
        ranks=cfg.train.ranks,
        prm_timeout_s=cfg.prm.score_timeout_s,
        weights=weight_transport(cfg, on_gpu),
    )
    return ActorSpec(
        name="learner",
        target="guirl.actors.learner:Learner",
        bind=[cfg.endpoints.learner],
        run_dir=str(run_dir),
        cpus=cpu_set(cfg.cluster.learner_cpus, "cluster.learner_cpus"),
        env=placement.learner_env() if placement is not None else {},
        options=_options(options),
    )


def weight_ranks(cfg: GuirlConfig) -> int:
    """How many engine ranks join the learner's weight group: one per hf engine; per SGLang server, its
    tensor-parallel ranks."""
    inference = cfg.inference
    if inference.backend != "sglang":
        return inference.engines
    servers = len(inference.sglang.urls) if inference.sglang.urls else inference.engines
    return servers * inference.sglang.tp_size


def weight_transport(cfg: GuirlConfig, on_gpu: bool) -> Any:
    """The learner's side of the weight sync: its layout (the sglang backend's, or guirl's own for hf
    engines), flattened buckets or not, collective backend (NCCL on GPUs) and wire dtype."""
    from guirl.learner.publish import WeightTransport

    t, inference = cfg.train, cfg.inference
    sglang = inference.backend == "sglang"
    dtype = t.weight_dtype
    if dtype == "auto":
        dtype = "bfloat16" if sglang else inference.hf.dtype
    return WeightTransport(
        layout="sglang" if sglang else "guirl",
        flattened=inference.sglang.weight_load_format == "flattened_bucket",
        backend={"auto": "nccl" if on_gpu else "gloo"}.get(t.weight_backend, t.weight_backend),
        dtype=dtype,
    )


def prm_spec(cfg: GuirlConfig, run_dir: Path, broker: str, learner: str) -> ActorSpec:
    """The PRM actor: judges through `broker`; its scores go to `learner` when it trains on them
    (`step_wise`), else they are only recorded beside the episodes."""
    from guirl.actors.prm import PRMOptions

    options = PRMOptions(
        broker=broker,
        learner=learner if cfg.train.advantage == "step_wise" else "",
        run_dir=str(run_dir),
        prm=cfg.prm,
    )
    return ActorSpec(
        name="prm",
        target="guirl.actors.prm:PRMActor",
        bind=[cfg.endpoints.prm],
        run_dir=str(run_dir),
        cpus=cpu_set(cfg.cluster.rollout_cpus, "cluster.rollout_cpus"),
        options=_options(options),
    )


def coordinator(
    cfg: GuirlConfig,
    run_dir: Path,
    mode: str,
    tasks: list[SuiteTask],
    eval_tasks: list[SuiteTask] = (),
    *,
    first_seq: int = 0,
) -> Coordinator:
    """The coordinator (in the driver's process): hands out `tasks` (and, in train mode, GRPO groups under
    the staleness bound, and `eval_tasks` every `train.eval_every` versions); writes the run's ledger.
    `first_seq`: the episode ids a resumed eval's earlier sessions used."""
    common = {
        "heartbeat_dir": str(run_dir),
        "heartbeat_s": cfg.cloud.heartbeat_s,
        "max_attempts": cfg.eval.max_attempts,
        "max_steps": cfg.agent.max_steps,
        "seed": cfg.run.seed,
        "runtime": cfg.runtime,
        "codec": cfg.codec,
        "bind": [cfg.endpoints.coordinator],
    }
    if mode == "eval":
        return Coordinator("coordinator", tasks=tasks, mode="eval", first_seq=first_seq, **common)
    t, r = cfg.train, cfg.rollout
    return Coordinator(
        "coordinator",
        tasks=tasks,
        mode="train",
        n_samples=r.n_samples_per_prompt,
        batch_size=r.batch_size,
        max_staleness=t.max_staleness,
        last_version=t.updates,
        state_path=str(run_dir / "coordinator.json"),
        eval_tasks=list(eval_tasks),
        eval_every=t.eval_every,
        eval_log=str(run_dir / "eval.jsonl"),
        **common,
    )


# -- what each mode runs on ---------------------------------------------------------------------------


def run_settings(cfg: GuirlConfig) -> set[str]:
    """What the run's configuration provides to tasks that need a setting (Chrome's DevTools, Google)."""
    from guirl.vmpool.apps import atspi_missing
    from guirl.vmpool.tasks.check import available_settings

    env = cfg.env
    if env.provider == "replay":  # a recording shows whatever its desktop had: nothing is set up again
        return available_settings(devtools=True, drive=True, account=True, atspi=True)
    local = env.provider == "local"
    return available_settings(
        devtools=env.chromium_port > 0,  # a local desktop's, through its server's tunnel
        drive=bool(env.google_drive_settings),
        account=bool(env.google_account),
        atspi=not local or (env.accessibility and not atspi_missing()),
        local=local,
    )


def suite(
    cfg: GuirlConfig, mode: str, *, in_training: bool = False
) -> tuple[list[SuiteTask], list[SkippedTask]]:
    """The tasks a mode hands out, checked before any VM starts: `eval.tasks` (its domains and limit) or
    `train.tasks`, or in GUI-R1 mode the rows of `data.eval` / `data.train` (the mode's own `limit`,
    `--limit`, else `data.limit`; the evaluations in training take `data.limit` only); and the unsupported
    tasks skipped (listed in the summary, never run). `in_training`: the evaluations a train run makes every
    `train.eval_every` versions."""
    from guirl.data.tasks import dataset_tasks

    d, e, t = cfg.data, cfg.eval, cfg.train
    if mode == "train" and d.train:
        return dataset_tasks(d.train, "train", t.limit or d.limit), []
    if mode == "eval" and (d.train if in_training else d.eval):  # in training, the workers' kind decides
        return dataset_tasks(d.eval, "eval", d.limit if in_training else (e.limit or d.limit)), []
    if mode == "train":
        tasks = load_suite(t.tasks, domains=t.domains, limit=t.limit)
        skipped = (t.skip_unsupported, t.tasks)
    else:
        tasks = load_suite(e.tasks, examples_dir=e.examples_dir, domains=e.domains, limit=e.limit)
        skipped = (e.skip_unsupported, e.tasks)
    recorded = None
    if cfg.env.provider == "replay":  # replayed desktops play only the tasks their recording has
        from guirl.vmpool.provider import ProviderError
        from guirl.vmpool.replay import load_recording

        try:
            recorded = load_recording(
                cfg.env.replay.run, (cfg.env.screen_width, cfg.env.screen_height)
            ).tasks()
        except ProviderError as exc:
            raise InputError(f"env.replay.run: {exc}") from None
    return check_supported(
        tasks, skip_unsupported=skipped[0], source=skipped[1], available=run_settings(cfg), recorded=recorded
    )


# -- starting and stopping them -----------------------------------------------------------------------


class RunActors:
    """The actors of one run on its cluster (`guirl.cluster.run.ClusterRun`): the coordinator in this
    process, the others supervised; `start` places each on its host and says which one did not start and
    why. On exit everything stops: the control socket, the supervised actors, then the coordinator."""

    def __init__(self, cfg: GuirlConfig, run_dir: Path, cluster: Any, coord: Coordinator, mode: str) -> None:
        self.cfg, self.run_dir, self.cluster, self.coord, self.mode = cfg, run_dir, cluster, coord, mode
        self.sup = Supervisor(cfg, run_dir=str(run_dir), launchers=cluster.launchers)
        self._coord_task: asyncio.Task | None = None
        self.writer: Any = None
        self.monkey: Any = None

    async def __aenter__(self) -> RunActors:
        self._coord_task = await self.coord.start()
        try:
            await self.sup.__aenter__()
        except BaseException:
            await self._stop_coordinator()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            try:
                await self.cluster.close()
            finally:
                await self.sup.__aexit__(*exc)
        finally:
            await self._stop_coordinator()

    async def _stop_coordinator(self) -> None:
        self.coord.request_shutdown(f"{self.mode} done")
        if self._coord_task is not None:
            await self._coord_task

    async def start(self, spec: ActorSpec) -> str:
        """Start `spec` on the host the cluster gives its role (broker, learner, prm) and return its
        endpoint; RunError naming it if it does not start."""
        handle = await self._start(self.cluster.place(spec, spec.name))
        return handle.endpoints[0]

    async def _start(self, spec: ActorSpec) -> Any:
        try:
            return await self.sup.start(spec)
        except ActorOptionsError:
            raise  # refused before any process started: an input error, no log to see
        except Exception as exc:
            raise RunError(f"the {spec.name} did not start: {exc}; see its log above") from exc

    async def start_workers(
        self,
        make_worker: Callable[..., ActorSpec],
        prewarm: list[int] | None = None,
        *,
        together: bool = True,
    ) -> None:
        """One env worker per cluster slot: started together (eval: RunError naming the first that did not
        start), or one after another (train: each ready before the next starts)."""
        self.make_worker = make_worker
        specs = [
            self.cluster.on_host(make_worker(i, vms, prewarm[i] if prewarm else 0), host)
            for i, (host, vms) in enumerate(self.cluster.slots)
        ]
        if not together:
            for spec in specs:
                await self._start(spec)
            return
        try:
            async with asyncio.TaskGroup() as tg:
                for spec in specs:
                    tg.create_task(self.sup.start(spec))
        except* Exception as group:  # say which worker and why, not a traceback of the task group
            first = group.exceptions[0]
            if isinstance(first, ActorOptionsError):
                raise first from None
            raise RunError(f"an env worker did not start: {first}; see its log above") from first

    async def follow(self, follow: Callable[[Any], Any], out: TextIO, *, watch: dict[str, str]) -> None:
        """Serve the cluster's control socket and write `status.json` (asking the actors in `watch`, role ->
        endpoint) while `follow(status_printer)` runs, with the run's chaos monkey loose; nothing is left
        stopped after."""
        from guirl.chaos import start_monkey
        from guirl.cluster.run import StatusPrinter
        from guirl.status import StatusWriter

        await self.cluster.serve(self.sup, self.make_worker, out, self.coord)
        try:
            self.writer = StatusWriter(self.run_dir, self.coord, mode=self.mode)
            for role, endpoint in watch.items():
                getattr(self.writer, f"watch_{role}")(endpoint)
            status = StatusPrinter(self.cluster, self.cluster.status_interval_s, out, self.writer)
            self.monkey = start_monkey(
                self.cfg, self.mode, self.run_dir, self.sup, self.coord, self.writer, out
            )
            try:
                await follow(status)
            finally:
                if self.monkey is not None:
                    self.monkey.release()
        finally:  # no add/remove may run while (or after) the actors are stopped
            await self.cluster.close()

    async def stop(self) -> None:
        """Stop the supervised actors, settle the episodes their workers left unreported, write the last
        `status.json` (every actor down, the run done)."""
        await self.sup.stop_all()
        self.coord.settle_unreported(self.run_dir / "episodes")
        if self.writer is not None:
            self.writer.maybe(self.sup, force=True)
