"""The EnvWorker actor: owns K VMs and plays episodes on them.

Each of its K slots pulls an assignment from the coordinator and runs the episode loop on a leased VM:
reset (the pool restores the VM; the task's setup steps run) → up to `max_steps` of
screenshot → prompt → `PolicyRequest` to the broker → parse → act → evaluate, then reports the episode's
one end state. Per episode it writes `episodes/<task>/<episode>/`: `step_NNN.png` (the screen the
policy saw at each step, and `final.png`), `traj.jsonl` (one line per step) and `result.json`.

What is whose fault is decided here, carefully (OpenClaw-RL's GUI-RL got these wrong):
- every action the prompt offers executes (`triple_click`, `hscroll` included);
- an episode cut off at the step limit is TRUNCATED and evaluated as it stands (no FAIL is sent, so an
  infeasible task is not solved by running out of steps);
- an unparseable response ends the episode as a policy failure (score 0, outcome `parse_error`);
- a VM that dies, a setup or evaluator that breaks, or a broker that stays unreachable is an
  environment error: the episode ends `retried` and the coordinator runs the task again elsewhere.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from guirl.agent.actions import TERMINAL, AnyAction, Fail
from guirl.agent.gui_r1_desktop import build_gui_r1_prompt, parse_gui_r1
from guirl.agent.parse import ParseError, parse_response
from guirl.agent.prompt import (
    PromptConfig,
    PromptTooLong,
    StepRecord,
    build_prompt,
    gui_rl_step,
    keep_resized,
)
from guirl.config.schema import AgentConfig, CloudConfig, EnvConfig
from guirl.fileio import write_json_atomic
from guirl.learner.rewards import outcome_reward
from guirl.messages import Blob, CoordinatorChannel, LearnerChannel, PolicyChannel, PRMChannel
from guirl.messages.codec import CodecError
from guirl.messages.types import (
    Ack,
    ChatMessage,
    EpisodeAssignment,
    EpisodeDelivered,
    EpisodeEnded,
    EpisodeRejected,
    Image,
    NoWork,
    PolicyRequest,
    PolicyResponse,
    Register,
    SamplingParams,
    StepSample,
    Trajectory,
    Transition,
    WorkRequest,
)
from guirl.runtime.base import Actor
from guirl.runtime.errors import ActorError
from guirl.runtime.retry import backoff_delays, retry_idempotent
from guirl.vmpool.client import VMClient, VMError
from guirl.vmpool.pool import PoolError, VMPool
from guirl.vmpool.provider import ProviderError
from guirl.vmpool.replay import ReplayDiverged
from guirl.vmpool.tasks.check import needs_devtools
from guirl.vmpool.tasks.evaluate import EvaluationError, evaluate
from guirl.vmpool.tasks.model import TaskError, parse_task
from guirl.vmpool.tasks.setup import SetupError, TaskContext, run_setup
from guirl.vmpool.tunnel import devtools_endpoint

log = logging.getLogger(__name__)

POLICY_ATTEMPTS = 8
"""Tries of one policy request (overloaded broker, broker restarting) before the episode is an env error."""


POOL_FIGURES_S = 2.0
"""Seconds between rewrites of `pools/<worker>.json` while nothing but leases changes."""


class EnvFault(Exception):
    """Something outside the policy broke the episode (VM, setup, evaluator, broker)."""


@dataclass
class _Episode:
    ep: EpisodeAssignment
    dir: Path
    steps: int = 0
    outcome: str = ""
    score: float | None = None
    parse_error: str = ""
    history: list[StepRecord] = field(default_factory=list)
    versions: set[int] = field(default_factory=set)
    samples: list[StepSample] = field(default_factory=list)  # train mode: what the learner gets
    screens: list[Image] = field(default_factory=list)
    screen_index: dict[bytes, int] = field(default_factory=dict)  # sha256 of a prompt image -> screens
    prm_dropped: list[int] = field(default_factory=list)  # steps the PRM will never see
    reward: float | None = None  # a rule reward (GUI-R1 mode) instead of the outcome reward of `score`
    reward_parts: dict[str, float] = field(default_factory=dict)
    evaluation_errors: list[str] = field(default_factory=list)  # what scored 0 by raising (see evaluate)
    evaluation: dict[str, Any] = field(default_factory=dict)  # how the score was reached (see evaluate)

    def add_sample(self, step: int, prompt: Any, response: PolicyResponse, action_line: str) -> None:
        """Keep a step as a training sample: the engine's exact tokens, each prompt image once."""
        if response.prompt_ids is None or response.response_ids is None or response.logprobs is None:
            raise EnvFault(
                "the engine returned no token ids: training needs a backend that does (hf, sglang; scripted "
                "with inference.scripted.tokens)"
            )
        refs = []
        for png, (w, h) in zip(prompt.images, prompt.image_sizes, strict=True):
            digest = hashlib.sha256(png).digest()
            if digest not in self.screen_index:
                self.screen_index[digest] = len(self.screens)
                self.screens.append(Image(data=Blob(png), width=w, height=h))
            refs.append(self.screen_index[digest])
        self.samples.append(
            StepSample(
                step=step,
                prompt_ids=response.prompt_ids,
                response_ids=response.response_ids,
                logprobs=response.logprobs,
                policy_version=response.policy_version,
                policy_epoch=response.policy_epoch,
                response_text=response.text,
                action=action_line,
                image_refs=refs,
            )
        )


def _messages_json(messages: list[ChatMessage]) -> list[dict]:
    """The prompt as traj.jsonl stores it: text verbatim, images as `{"image": index}`, a message's tool
    schemas (`ChatMessage.tools`) as `tools` when it has any."""
    out = []
    for m in messages:
        parts = [{"text": p.text} if hasattr(p, "text") else {"image": p.index} for p in m.parts]
        entry: dict = {"role": m.role, "parts": parts}
        if m.tools:
            entry["tools"] = list(m.tools)
        out.append(entry)
    return out


class EnvWorkerOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    coordinator: str
    """The coordinator's endpoint (episodes out, end states back)."""
    broker: str
    """The inference broker's endpoint (the policy's actions)."""
    run_dir: str
    """The run directory: each episode's folder goes under `episodes/`."""
    learner: str = ""
    """The learner's endpoint (train mode: trajectories go there); empty in eval mode."""
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    """The policy's prompt, response format and sampling (`[agent]`)."""
    env: EnvConfig = msgspec.field(default_factory=EnvConfig)
    """The desktops (`[env]`)."""
    cloud: CloudConfig | None = None
    """The cloud's settings (`[cloud]`), for a cloud provider; None for local desktops."""
    vms: int = 1
    """Desktops this worker keeps."""
    prewarm: int | None = None
    """Desktops started before the first episode (None: `env.prewarm_envs`)."""
    setup_timeout_s: float = 300.0
    """Seconds a task's setup steps may take."""
    policy_timeout_s: float = 600.0
    """Seconds a policy request may take."""
    fault_kill_vm_at_step: int = -1
    """`faults.kill_vm_at_step`: kill the first episode's VM at this step (-1 = off)."""
    lease_ttl_s: float = 120.0
    """Seconds a desktop's lease lasts without renewal."""
    pool_health_interval_s: float = 2.0
    """Seconds between the pool's health checks."""
    prm: str = ""
    """The PRM actor's endpoint (each step's transition goes there); empty: no PRM."""
    prm_history_images: int = 0
    """`prm.history_images`: earlier screenshots sent with each transition."""
    prm_queue: int = 256
    """`prm.worker_queue`: transitions held for the PRM before the oldest are dropped."""


class EnvWorker(Actor):
    """Plays assigned episodes on its own VMs; see the module docstring."""

    role = "env_worker"
    channel = CoordinatorChannel
    Options = EnvWorkerOptions

    def __init__(self, name: str, options: EnvWorkerOptions, **runtime: Any) -> None:
        super().__init__(name, **runtime)
        o = options
        self.coordinator_ep, self.broker_ep, self.learner_ep = o.coordinator, o.broker, o.learner
        self.run_dir = Path(o.run_dir)
        self.agent = o.agent
        self.env = o.env
        self.cloud = o.cloud  # the `[cloud]` section (its keys stay in this process: never logged or sent on)
        self.prompt_cfg = PromptConfig.from_config(self.agent)
        self.slots = o.vms
        self.prewarm = o.prewarm
        self.setup_timeout_s = o.setup_timeout_s
        self.policy_timeout_s = o.policy_timeout_s
        self.fault_step = o.fault_kill_vm_at_step
        self.lease_ttl_s = o.lease_ttl_s
        self.pool_health_interval_s = o.pool_health_interval_s
        self.pool: VMPool | None = None
        self.provider: Any = None
        self.screen = (self.env.screen_width, self.env.screen_height)
        self._build_prompt, self._parse = self._response_format()
        self.prm_ep = o.prm
        self.prm_history_images = o.prm_history_images
        self.prm_queue = o.prm_queue
        self.outbox: collections.deque[tuple[_Episode, Transition]] = collections.deque()  # for the PRM
        self._outbox_changed = asyncio.Event()
        self._reports: set[asyncio.Task] = set()  # end reports under way (`settle`)
        self._pool_written: tuple[tuple, float] = ((), 0.0)  # (the pool's events, when) last written

    # -- lifecycle -----------------------------------------------------------------------------------

    async def setup(self) -> None:
        self.coord = self.connect("coordinator", self.coordinator_ep, CoordinatorChannel)
        self.broker = self.connect("broker", self.broker_ep, PolicyChannel)
        self.learner = self.connect("learner", self.learner_ep, LearnerChannel) if self.learner_ep else None
        self.prm = self.connect("prm", self.prm_ep, PRMChannel) if self.prm_ep else None
        self.provider = self._make_provider()
        self.pool = VMPool(
            self.provider,
            tag=self.name,
            max_envs=self.slots,
            prewarm=min(self.slots, self.env.prewarm_envs if self.prewarm is None else self.prewarm),
            lease_ttl_s=self.lease_ttl_s,
            health_interval_s=self.pool_health_interval_s,
        )
        await self.pool.start()

    def _make_provider(self) -> Any:
        """Local sandboxed desktops, replayed ones, or a cloud's instances (tagged with the run directory's
        name)."""
        if self.env.provider == "replay":
            from guirl.vmpool.replay import ReplayProvider

            try:
                return ReplayProvider(
                    self.env.replay.run,
                    screen=self.screen,
                    step_latency_s=self.env.replay.step_latency_s,
                    step_jitter=self.env.replay.step_jitter,
                    tolerance_px=self.env.replay.tolerance_px,
                )
            except ProviderError as exc:
                raise ActorError(str(exc)) from exc
        if self.env.provider == "local":
            from guirl.vmpool.local import LocalProvider

            return LocalProvider(
                self.run_dir / "vms" / self.name,
                width=self.env.screen_width,
                height=self.env.screen_height,
                cursor=self.env.screenshot_cursor,
                accessibility=self.env.accessibility,
            )
        from guirl.vmpool.cloud import CloudProvider, run_alive
        from guirl.vmpool.clouds import make_cloud

        cloud = self.cloud or CloudConfig()
        try:
            api = make_cloud(self.env.provider, cloud, self.env.region)
            runs_root = self.run_dir.parent
            return CloudProvider(
                api, run=self.run_dir.name, cloud=cloud, alive=lambda run: run_alive(runs_root, run)
            )
        except (ValueError, ProviderError) as exc:
            raise ActorError(str(exc)) from exc

    async def teardown(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self._write_pool_metrics()
        close = getattr(self.provider, "close", None)
        if close is not None:  # a provider's own process (the replay host)
            await close()

    def _pool_changed(self) -> None:
        """After an acquire: the pool's figures rewritten when a VM was made, failed or replaced since they
        were last written, else at most every POOL_FIGURES_S (a worker with a hundred desktops starts an
        episode every few tens of milliseconds)."""
        assert self.pool is not None
        events = tuple(
            self.pool.counters.get(k, 0) for k in ("created", "failed", "replaced", "delete_failed")
        )
        now = time.monotonic()
        if events != self._pool_written[0] or now - self._pool_written[1] >= POOL_FIGURES_S:
            self._pool_written = (events, now)
            self._write_pool_metrics()

    def _write_pool_metrics(self) -> None:
        """`pools/<worker>.json`: the pool's counts and reset latency, and its provider's own figures (a
        cloud's launches, resets by method, failures by cause, throttled calls, instance-minutes)."""
        assert self.pool is not None
        figures = {"worker": self.name, "provider": self.env.provider, "pool": self.pool.metrics()}
        provider_metrics = getattr(self.provider, "metrics", None)
        if provider_metrics is not None:
            figures["replay" if self.env.provider == "replay" else "cloud"] = provider_metrics()
        try:
            (self.run_dir / "pools").mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.run_dir / "pools" / f"{self.name}.json", figures)
        except OSError as exc:
            log.warning("could not write the pool's figures: %s", exc)

    async def main(self) -> None:
        rt = self.runtime
        await retry_idempotent(
            lambda: self.coord.request(Register(role="env_worker", name=self.name, capacity=self.slots)),
            attempts=20,
            initial=rt.reconnect_backoff_initial_s,
            cap=rt.reconnect_backoff_max_s,
        )
        async with asyncio.TaskGroup() as tg:
            sender = tg.create_task(self._send_transitions(), name="prm-sender") if self.prm else None
            async with asyncio.TaskGroup() as slots:
                for i in range(self.slots):
                    slots.create_task(self._slot(i), name=f"slot{i}")
            if sender is not None:  # no more episodes: what the PRM has not taken is not needed any more
                sender.cancel()

    async def _slot(self, index: int) -> None:
        rt = self.runtime
        while True:
            work = await retry_idempotent(
                lambda: self.coord.request(WorkRequest(worker=self.name)),
                attempts=20,
                initial=rt.reconnect_backoff_initial_s,
                cap=rt.reconnect_backoff_max_s,
            )
            match work:
                case NoWork(reason="done"):
                    return
                case NoWork(retry_after_s=delay):
                    await asyncio.sleep(delay)
                case EpisodeAssignment() as ep:
                    ended, traj = await self.play(ep)
                    # A shutdown that comes while the end is reported must not cut the report short: the
                    # coordinator may have taken the end (the run's last episode ends the run, and the
                    # supervisor stops this worker while the answer is on its way). `settle` waits for it.
                    report = asyncio.create_task(
                        self._report(ep, ended, traj), name=f"report:{ep.episode_id}"
                    )
                    self._reports.add(report)
                    report.add_done_callback(self._reports.discard)
                    await asyncio.shield(report)
                case other:
                    raise ActorError(f"coordinator answered {type(other).__name__} to a work request")

    async def _report(self, ep: EpisodeAssignment, ended: EpisodeEnded, traj: Trajectory | None) -> None:
        rt = self.runtime
        # the coordinator answers a repeated report as it answered the first (safe to retry)
        answer = await retry_idempotent(
            lambda: self.coord.request(ended),
            attempts=20,
            initial=rt.reconnect_backoff_initial_s,
            cap=rt.reconnect_backoff_max_s,
        )
        self._record(ep, ended, answer)
        if isinstance(answer, Ack) and answer.ok and traj is not None:
            await self._hand_over(ep, traj)

    async def settle(self, timeout: float) -> None:
        """The end reports (and hand-overs) under way when the shutdown came run to their end; one that does
        not within `timeout` leaves its episode `unreported` (the run's end settles it from the ledger)."""
        if not self._reports:
            return
        done, pending = await asyncio.wait(set(self._reports), timeout=timeout)
        for task in pending:
            task.cancel()
            self.counters["episodes.report_cut"] += 1
            log.warning("shutdown: %s did not finish within %.1f s", task.get_name(), timeout)
        if pending:
            await asyncio.wait(pending)  # cancelled: let each unwind before the sockets close
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("shutdown: %s failed: %s", task.get_name(), task.exception())

    # -- one episode ---------------------------------------------------------------------------------

    async def play(self, ep: EpisodeAssignment) -> tuple[EpisodeEnded, Trajectory | None]:
        """Run one episode to its end state (never raises for environment faults); a completed training
        episode also gives the trajectory for the learner, to be handed over once the coordinator has
        taken the end (`_hand_over`)."""
        started = time.monotonic()
        episode = _Episode(ep, self.run_dir / "episodes" / ep.task_id / ep.episode_id)
        episode.dir.mkdir(parents=True, exist_ok=True)
        # a resumed run may hand out an episode id again: the PRM's verdicts on the old one are not its own
        (episode.dir / "prm.jsonl").unlink(missing_ok=True)
        env_error = ""
        final = False  # an environment error that playing again cannot help: the task is aborted now
        traj = None
        try:
            await self._run(episode)
            if ep.mode == "train":
                traj = self._trajectory(episode)
        except EnvFault as exc:
            env_error = str(exc)[:500]
        except ReplayDiverged as exc:
            # a replay cannot score what was never recorded; another attempt could only be lucky (sampled
            # to match the recording), which would bias the score: aborted with the reason, never retried
            env_error, final = f"{type(exc).__name__}: {exc}"[:500], True
        except (
            VMError,
            PoolError,
            ProviderError,
            SetupError,
            EvaluationError,
            ActorError,
            OSError,
            TimeoutError,
        ) as exc:
            env_error = f"{type(exc).__name__}: {exc}"[:500]
        except ValueError as exc:  # garbage from the VM (a reply that is not JSON, an absurd screenshot)
            log.warning("episode %s: bad data from the environment", ep.episode_id, exc_info=exc)
            env_error = f"{type(exc).__name__}: {exc}"[:500]
        if env_error:
            log.warning("episode %s (%s): environment error: %s", ep.episode_id, ep.task_id, env_error)
            self.counters["episodes.env_error"] += 1
            episode.outcome, episode.score, traj = "env_error", None, None
        else:
            self.counters[f"episodes.{episode.outcome}"] += 1
        seconds = round(time.monotonic() - started, 3)
        result = {
            "episode_id": ep.episode_id,
            "task_id": ep.task_id,
            "domain": ep.domain,
            "attempt": ep.attempt,
            # until the coordinator has taken the end (`_record`): a worker killed before then leaves an
            # episode that readers (behaviour cloning, metrics) must not take for completed
            "status": "unreported",
            "reported": ("aborted" if final else "retried") if env_error else "completed",
            "outcome": episode.outcome,
            "score": episode.score,
            "steps": episode.steps,
            "env_error": env_error,
            "parse_error": episode.parse_error,
            "policy_versions": sorted(episode.versions),
            "seconds": seconds,
            "ended_at": round(time.time(), 3),  # wall time (the file is rewritten once answered)
            "worker": self.name,
        }
        if episode.reward is not None:
            result.update(reward=episode.reward, reward_parts=episode.reward_parts)
        if episode.evaluation_errors:
            result["evaluation_errors"] = episode.evaluation_errors
        if episode.evaluation and not env_error:
            result["evaluation"] = episode.evaluation
        write_json_atomic(episode.dir / "result.json", result)
        ended = EpisodeEnded(
            episode_id=ep.episode_id,
            status=("aborted" if final else "retried") if env_error else "completed",
            reason=episode.parse_error,
            reward=episode.score,
            steps=episode.steps,
            env_error=env_error,
            task_id=ep.task_id,
            domain=ep.domain,
            attempt=ep.attempt,
            outcome=episode.outcome,
            score=episode.score,
            seconds=seconds,
            worker=self.name,
        )
        return ended, traj

    async def _run(self, episode: _Episode) -> None:
        ep = episode.ep
        try:
            task = parse_task(json.dumps(ep.task), f"assignment {ep.episode_id}")
        except TaskError as exc:
            raise EnvFault(f"the task does not parse: {exc}") from None
        try:
            lease = await self.pool.acquire(timeout=self.setup_timeout_s)
        finally:
            self._pool_changed()
        # The lease must be beaten while the episode holds it, through every long wait (setup, a policy
        # request, the evaluator): an expired lease is taken back, reset and lent to another episode.
        keepalive = asyncio.create_task(self._keep_lease(lease), name=f"lease:{lease.lease_id}")
        replayed = self.env.provider == "replay"
        try:
            if replayed:  # the desktop plays a recording of the task: its screens show the setup done
                await self.provider.bind(lease.vm_id, ep.task_id, ep.sample_index)
            async with VMClient(lease.address, timeout_s=120) as client, contextlib.AsyncExitStack() as stack:
                # a local desktop has no network: its DevTools port comes through its server's tunnel, opened
                # (on this host's loopback) only for a task that drives Chrome
                port = self.env.chromium_port if needs_devtools(task) and not replayed else 0
                devtools = await stack.enter_async_context(devtools_endpoint(client, port))
                ctx = TaskContext(
                    task_id=ep.task_id,
                    cache_dir=episode.dir / "cache",
                    download_cache=self.run_dir / "downloads",
                    width=self.screen[0],
                    height=self.screen[1],
                    devtools_url=devtools,
                    chrome_profile_dir=self.env.chrome_profile_dir,
                    google_drive_settings=self.env.google_drive_settings or None,
                    google_account=self.env.google_account or None,
                )
                ctx.cache_dir.mkdir(exist_ok=True)
                if not replayed:
                    await asyncio.wait_for(run_setup(client, task.config, ctx), self.setup_timeout_s)
                await self._steps(episode, task.instruction, client, ctx, lease)
                if episode.outcome == "parse_error":
                    episode.score = 0.0  # a policy failure: nothing to evaluate
                else:
                    if lease.broken:
                        raise EnvFault(f"VM {lease.vm_id} broke: {lease.broken}")
                    if replayed:  # scored by the recording (or not at all: ReplayDiverged)
                        episode.score, episode.evaluation = self.provider.verdict(lease.vm_id, ctx.actions)
                        return
                    episode.score = float(await evaluate(task, client, ctx))
                    episode.evaluation_errors, episode.evaluation = ctx.evaluation_errors, ctx.evaluation
        finally:
            keepalive.cancel()
            await self.pool.release(lease.lease_id)

    def _trajectory(self, episode: _Episode) -> Trajectory:
        if self.learner is None:
            raise EnvFault("a train-mode episode, but this worker has no learner to send it to")
        ep = episode.ep
        return Trajectory(
            episode_id=ep.episode_id,
            task_id=ep.task_id,
            group_id=ep.group_id,
            sample_index=ep.sample_index,
            status="completed",
            reward=episode.reward if episode.reward is not None else outcome_reward(episode.score),
            steps=episode.samples,
            domain=ep.domain,
            screens=episode.screens,
            score=episode.score,
            outcome=episode.outcome,
            attempt=ep.attempt,
            prm_dropped=episode.prm_dropped,
            reward_parts=episode.reward_parts,
        )

    def _record(self, ep: EpisodeAssignment, ended: EpisodeEnded, answer: Any) -> None:
        """`result.json` takes the coordinator's word: the end state it took, or `refused` when it had
        already ended the episode (this worker was declared dead — a hung process, a partition — and its
        episodes were played again elsewhere). A refused episode's trajectory is never delivered (it would
        be a second, unledgered sample of the task)."""
        taken = isinstance(answer, Ack) and answer.ok
        note = getattr(answer, "note", type(answer).__name__)
        if not taken:
            self.counters["episodes.end_refused"] += 1
            log.warning("episode %s: its end was not taken (%s): not delivered", ep.episode_id, note)
        path = self.run_dir / "episodes" / ep.task_id / ep.episode_id / "result.json"
        try:
            result = json.loads(path.read_text())
            result["status"] = ended.status if taken else "refused"
            if not taken:
                result["refused"] = str(note)[:300]
            write_json_atomic(path, result)
        except (OSError, ValueError) as exc:
            log.warning("could not record %s: %s", path, exc)

    async def _hand_over(self, ep: EpisodeAssignment, traj: Trajectory) -> None:
        """Send a completed episode's samples to the learner, once the coordinator has taken its end (its
        ledger is the one word on an episode: see `_record`). A trajectory the learner cannot be reached
        for is handed back to the coordinator, which hands the same sample out again (the learner ignores
        a repeat, so the delivery itself may be retried)."""
        rt = self.runtime
        try:
            await retry_idempotent(
                lambda: self.learner.request(traj),
                attempts=10,
                initial=rt.reconnect_backoff_initial_s,
                cap=rt.reconnect_backoff_max_s,
                # no more tries once this worker is stopping or the learner has shut down (its updates
                # are made): the trajectory goes back to the coordinator at once
                is_transient=lambda e: (
                    getattr(e, "transient", False) and not (self.stopping or self.learner.left)
                ),
            )
        except CodecError as exc:  # more than the run's codec limits let one message carry: never sendable
            self.counters["trajectories.unsendable"] += 1
            log.error(
                "episode %s: its trajectory cannot be sent to the learner, and is not trained on (%s: %s; "
                "see the codec.* limits)",
                ep.episode_id,
                exc.code,
                exc,
            )
            # settled, not handed out again: another attempt would likely be as large. Its group waits for it
            # up to train.group_timeout_s, then trains on the members it has (two or more) or is dropped.
            tell: Any = EpisodeDelivered(episode_id=ep.episode_id)
        except (ActorError, OSError, TimeoutError) as exc:
            self.counters["trajectories.undelivered"] += 1
            # the learner shut down after its last update (the end of a run) or died (a fault)
            log.log(
                logging.INFO if self.learner.left else logging.WARNING,
                "episode %s: the learner could not be reached (%s): handed back",
                ep.episode_id,
                exc,
            )
            tell = EpisodeRejected(
                episode_id=ep.episode_id,
                group_id=ep.group_id,
                sample_index=ep.sample_index,
                task_id=ep.task_id,
                reason=f"not delivered to the learner: {exc}"[:300],
                undelivered=True,
            )
        else:
            self.counters["trajectories.sent"] += 1
            # the coordinator holds the sample until now: had this worker died before, it would go out again
            tell = EpisodeDelivered(episode_id=ep.episode_id)
        await retry_idempotent(
            lambda: self.coord.request(tell),
            attempts=20,
            initial=rt.reconnect_backoff_initial_s,
            cap=rt.reconnect_backoff_max_s,
        )

    def _response_format(self) -> tuple[Any, Any]:
        """How the policy is asked and read (`agent.response_format`): (prompt builder, response parser)."""
        a, cfg, screen = self.agent, self.prompt_cfg, self.screen
        if a.response_format == "gui_r1":
            return (
                lambda instruction, history, shot: build_gui_r1_prompt(
                    instruction, history, shot, cfg=cfg, actions=a.gui_r1_actions
                ),
                lambda text, size: parse_gui_r1(
                    text, screen=screen, image_size=size, max_calls=a.max_actions_per_step
                ),
            )
        return (
            lambda instruction, history, shot: build_prompt(
                instruction, history, shot, screen=screen, cfg=cfg
            ),
            lambda text, size: parse_response(
                text,
                screen=screen,
                coordinates=a.coordinates,
                image_size=size,
                max_calls=a.max_actions_per_step,
            ),
        )

    def _past_step(self, screenshot: bytes, response: PolicyResponse, action_line: str) -> StepRecord:
        """A played step as the next prompts show it (in GUI-RL's prompt style, as GUI-RL records it)."""
        if self.prompt_cfg.style == "gui-rl":
            return gui_rl_step(screenshot, response.text, response.finish_reason)
        return StepRecord(screenshot, response.text, action_line)

    # -- the PRM's transitions -----------------------------------------------------------------------

    def _transition(
        self, episode: _Episode, instruction: str, step: int, before: bytes, response: str, after: bytes
    ) -> None:
        """Queue one training step for the PRM (never waits: a worker does not slow down for its judge). Past
        the bound the step goes unjudged, and the trajectory says so (the learner does not wait for it)."""
        if self.prm is None or episode.ep.mode != "train":
            return
        ep = episode.ep
        w, h = self.screen
        history = episode.history[-self.prm_history_images :] if self.prm_history_images else []
        t = Transition(
            episode_id=ep.episode_id,
            step=step,
            instruction=instruction,
            previous_actions=[r.action_line for r in episode.history],
            response=response,
            before=Image(data=Blob(before), width=w, height=h),
            after=Image(data=Blob(after), width=w, height=h),
            history=[Image(data=Blob(r.screenshot), width=w, height=h) for r in history],
            task_id=ep.task_id,
            group_id=ep.group_id,
            seed=ep.seed,
        )
        if len(self.outbox) >= self.prm_queue:
            episode.prm_dropped.append(step)
            self.counters["prm.dropped_full"] += 1
            return
        self.outbox.append((episode, t))
        self._outbox_changed.set()

    async def _send_transitions(self) -> None:
        """Hand queued transitions to the PRM in order, one at a time; while it is away or full, keep them
        (the outbox's bound is the only loss) and try again with backoff."""
        delays = None
        while True:
            if not self.outbox:
                self._outbox_changed.clear()
                await self._outbox_changed.wait()
                continue
            episode, t = item = self.outbox[0]
            try:
                await self.prm.request(t, timeout=self.runtime.request_timeout_s)
            except (ActorError, ValueError) as exc:  # ValueError: it does not encode (too many frames...)
                if getattr(exc, "transient", False):
                    self.counters["prm.retries"] += 1
                    if delays is None:
                        delays = backoff_delays(
                            self.runtime.reconnect_backoff_initial_s, self.runtime.reconnect_backoff_max_s
                        )
                    await asyncio.sleep(next(delays))
                    continue
                # refused for good (a schema mismatch, a transition too large): counted, never retried, and
                # the learner is told not to wait for its score (if the trajectory has not left yet)
                self.counters["prm.refused"] += 1
                episode.prm_dropped.append(t.step)
                log.warning("the PRM refused step %d of %s: %s", t.step, t.episode_id, exc)
            else:
                self.counters["prm.sent"] += 1
            delays = None
            if self.outbox and self.outbox[0] is item:
                self.outbox.popleft()

    async def _keep_lease(self, lease: Any) -> None:
        """Heartbeat `lease` well inside its TTL until the episode lets it go (or it breaks)."""
        while not lease.broken:
            try:
                self.pool.heartbeat(lease.lease_id)
            except PoolError:  # taken back (the VM died): the episode sees `lease.broken`
                return
            await asyncio.sleep(self.lease_ttl_s / 4)

    async def _steps(
        self, episode: _Episode, instruction: str, client: VMClient, ctx: TaskContext, lease: Any
    ) -> None:
        ep = episode.ep
        screenshot = await client.screenshot()
        self.pool.heard(lease)
        terminal = None
        with open(episode.dir / "traj.jsonl", "w") as traj:
            for step in range(ep.max_steps):
                if lease.broken:
                    raise EnvFault(f"VM {lease.vm_id} broke: {lease.broken}")
                if step == self.fault_step:
                    self.fault_step = -1  # once per worker
                    log.warning("fault injection: killing VM %s at step %d", lease.vm_id, step)
                    self.provider.kill(lease.vm_id)
                if self.env.step_latency_s:  # a slower VM, simulated (benchmarks)
                    await asyncio.sleep(self.env.step_latency_s)
                t0 = time.monotonic()
                (episode.dir / f"step_{step:03d}.png").write_bytes(screenshot)
                try:  # decoding, resizing and encoding screenshots: on a thread (PIL lets the GIL go)
                    prompt = await asyncio.to_thread(
                        self._build_prompt, instruction, episode.history, screenshot
                    )
                except PromptTooLong as exc:
                    raise EnvFault(f"the prompt does not fit the token budget: {exc}") from None
                tp = time.monotonic()
                response = await self._ask(ep, step, prompt)
                t1 = time.monotonic()
                if lease.broken:  # never act on a VM that was taken back while the policy thought
                    raise EnvFault(f"VM {lease.vm_id} broke: {lease.broken}")
                episode.versions.add(response.policy_version)
                record: dict[str, Any] = {
                    "step": step,
                    "time": round(time.time(), 3),  # when the step was acted (the chaos suite's gaps)
                    "screenshot": f"step_{step:03d}.png",
                    "prompt": _messages_json(prompt.messages),
                    "prompt_images": [list(s) for s in prompt.image_sizes],
                    "response": response.text,
                    "finish_reason": response.finish_reason,
                    "policy_version": response.policy_version,
                    "policy_epoch": response.policy_epoch,
                    "engine": response.engine,
                    "prompt_tokens": response.prompt_ids.shape[0] if response.prompt_ids else None,
                    "response_tokens": response.response_ids.shape[0] if response.response_ids else None,
                }
                episode.steps = step + 1
                parsed = None
                try:
                    parsed = self._parse(response.text, prompt.image_sizes[-1])
                except ParseError as exc:
                    episode.outcome, episode.parse_error = "parse_error", f"{exc.code}: {exc}"
                    record.update(
                        parse_error=episode.parse_error,
                        timing={
                            "prompt_s": round(tp - t0, 4),
                            "infer_s": round(t1 - t0, 4),
                            "engine_s": round(response.latency_s - response.queue_s, 4),
                            "queue_s": round(response.queue_s, 4),
                        },
                    )
                    traj.write(json.dumps(record) + "\n")
                    if ep.mode == "train":  # an unparseable response is the policy's: it is trained on
                        episode.add_sample(step, prompt, response, "")
                    # nothing was executed: the judge sees the same screen after
                    self._transition(episode, instruction, step, screenshot, response.text, screenshot)
                    return
                if ep.mode == "train":
                    episode.add_sample(step, prompt, response, parsed.action_line)
                refused, next_shot, terminal = await self._act(client, parsed.actions, ctx)
                if any(not isinstance(a, TERMINAL) for a in parsed.actions):  # the VM answered this step
                    self.pool.heard(lease)
                t2 = time.monotonic()
                record.update(
                    action_line=parsed.action_line,
                    actions=[msgspec.to_builtins(a) for a in parsed.actions],
                    dropped_calls=parsed.dropped_calls,
                    refused=refused,
                    timing={
                        "prompt_s": round(tp - t0, 4),
                        "infer_s": round(t1 - t0, 4),
                        "engine_s": round(response.latency_s - response.queue_s, 4),
                        "queue_s": round(response.queue_s, 4),
                        "act_s": round(t2 - t1, 4),
                    },
                )
                traj.write(json.dumps(record) + "\n")
                traj.flush()
                before = screenshot
                if terminal is not None:
                    episode.outcome = "fail" if isinstance(terminal, Fail) else "done"
                    break
                screenshot = next_shot or await client.screenshot()
                self._transition(episode, instruction, step, before, response.text, screenshot)
                past = self._past_step(before, response, parsed.action_line)
                if self.prompt_cfg.history_images > 0:  # the screen as this prompt resized it, for the next
                    keep_resized(past, prompt)
                episode.history.append(past)
            else:
                episode.outcome = "truncated"  # evaluated as it stands; no FAIL is sent for it
            final = await client.screenshot()
            (episode.dir / "final.png").write_bytes(final)
            if terminal is not None:  # the last step's screen after is the final one
                self._transition(episode, instruction, step, before, response.text, final)

    async def _act(
        self, client: VMClient, actions: list[AnyAction], ctx: TaskContext
    ) -> tuple[list[str], bytes | None, AnyAction | None]:
        """Execute the parsed actions in order. Returns (refusals, the screen after, a terminal action)."""
        refused: list[str] = []
        shot: bytes | None = None
        for i, action in enumerate(actions):
            ctx.actions.append(action)
            if isinstance(action, TERMINAL):
                return refused, shot, action
            last = i == len(actions) - 1 and not self.agent.sleep_after_action_s
            # guirl's /action, or a composed pyautogui program through OSWorld's /execute
            result = await client.perform(action, action_space=self.env.action_space, screenshot=last)
            if not result.ok:
                refused.append(result.error[:300])
            shot = result.screenshot if last else None
            if refused:
                self.counters["actions.refused"] += 1
        if self.agent.sleep_after_action_s:
            await asyncio.sleep(self.agent.sleep_after_action_s)
        return refused, shot, None

    async def _ask(self, ep: EpisodeAssignment, step: int, prompt: Any) -> PolicyResponse:
        """One policy request; an overloaded or restarting broker is retried with backoff (it is
        idempotent: an answer nobody waits for is dropped), a broker that stays away is an env error."""
        a = self.agent
        # the assignment may set it (periodic evaluation in train mode is greedy)
        temperature = a.temperature if ep.temperature is None else ep.temperature
        request = PolicyRequest(
            episode_id=ep.episode_id,
            step=step,
            messages=prompt.messages,
            images=[
                Image(data=Blob(png), width=w, height=h)
                for png, (w, h) in zip(prompt.images, prompt.image_sizes, strict=True)
            ],
            sampling=SamplingParams(
                temperature=temperature,
                top_p=a.top_p,
                max_new_tokens=a.max_new_tokens,
                seed=ep.seed * 1000 + step if temperature > 0 else None,
            ),
            task_id=ep.task_id,
        )
        delays = backoff_delays(
            self.runtime.reconnect_backoff_initial_s, self.runtime.reconnect_backoff_max_s
        )
        for attempt in range(POLICY_ATTEMPTS):
            try:
                reply = await self.broker.request(request, timeout=self.policy_timeout_s)
            except ActorError as exc:
                if not exc.transient or attempt == POLICY_ATTEMPTS - 1:
                    raise EnvFault(f"policy request failed: {exc}") from None
                self.counters["policy.retries"] += 1
                await asyncio.sleep(next(delays))
                continue
            if not isinstance(reply, PolicyResponse):
                raise EnvFault(f"broker answered {type(reply).__name__} to a policy request")
            if reply.finish_reason == "abort":  # the engine refused the request: not something the policy did
                raise EnvFault(f"the engine aborted the request: {reply.error or 'no reason given'}")
            return reply
        raise AssertionError("unreachable")
