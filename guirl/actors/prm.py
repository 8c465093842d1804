"""The PRM actor: scores every step of every training episode with a judge VLM, as the steps stream.

Env workers send each step as a `Transition` (instruction, previous actions, the agent's response, the
screen before and after, optionally earlier screens) and go on playing: the PRM acknowledges as soon as the
transition is queued. `max_concurrency` judging loops take transitions in arrival order, ask the judge
(`prm.votes` votes, distinct seeds, through the broker under the judge's model name), read and combine the
votes (guirl/prm/judge.py), send the `StepScore` to the learner — which holds the episode's trajectory until
its scores are in, or until `prm.score_timeout_s` — and append the verdict, with the judge's answers, to
`episodes/<task>/<episode>/prm.jsonl`.

The queue is bounded (`prm.max_queue` transitions, and `runtime.inbox_max_bytes`): past it a transition is
refused as `overloaded` (retryable) and the worker keeps it until there is room; a PRM that is killed
loses its queue (those steps' scores go missing — marked, never invented) and, restarted, judges what the
workers send from then on.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import msgspec

from guirl.config.schema import PRMConfig
from guirl.messages import LearnerChannel, PolicyChannel, PRMChannel
from guirl.messages.types import Ack, ErrorReply, Message, PolicyRequest, PolicyResponse, Transition
from guirl.prm.judge import Judge, JudgeUnavailable, Verdict
from guirl.runtime.base import Actor, Request
from guirl.runtime.errors import ActorError, RequestTimeout
from guirl.runtime.retry import retry_idempotent

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
"""Task and episode ids that may name a directory (anything else is not written to disk)."""
SEEN_MAX = 200_000
"""Transitions remembered to recognise a redelivery (oldest forgotten first)."""
JUDGE_ATTEMPTS = 6
"""Tries of one judge request against an overloaded or restarting broker before the vote is an error."""


class PRMOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    broker: str
    """The broker serving the judge (under `prm.model_name`)."""
    run_dir: str
    """The run directory: verdicts go to each episode's `prm.jsonl`."""
    learner: str = ""
    """Where step scores go when the learner trains on them (`step_wise`); empty: recorded only."""
    prm: PRMConfig = msgspec.field(default_factory=PRMConfig)
    """The judge's settings (`[prm]`)."""


class PRMActor(Actor):
    """See the module docstring."""

    role = "prm"
    channel = PRMChannel
    Options = PRMOptions

    def __init__(self, name: str, options: PRMOptions, **runtime: Any) -> None:
        super().__init__(name, **runtime)
        self.cfg = options.prm
        self.broker_ep, self.learner_ep = options.broker, options.learner
        self.run_dir = Path(options.run_dir)
        self.queue: collections.deque[tuple[Transition, float, int]] = collections.deque()
        self.queued_bytes = 0
        self.changed = asyncio.Event()
        self.seen: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        self.judging = 0

    async def setup(self) -> None:
        self.broker = self.connect("broker", self.broker_ep, PolicyChannel)
        self.learner = self.connect("learner", self.learner_ep, LearnerChannel) if self.learner_ep else None
        self.judge = Judge(self.cfg, self._ask)
        log.info(
            "PRM ready: judge %r, %d vote(s), template %s",
            self.cfg.model_name,
            self.cfg.votes,
            self.judge.template.version,
        )

    def stats(self) -> Any:
        """The counters, and gauges: `queue.depth` (transitions waiting for the judge) and `judging` (with
        the judge now)."""
        reply = super().stats()
        reply.counters["queue.depth"] = len(self.queue)
        reply.counters["judging"] = self.judging
        return reply

    # -- transitions in ------------------------------------------------------------------------------

    async def handle(self, req: Request) -> Message | None:
        match req.msg:
            case Transition() as t:
                return self._enqueue(t, req.nbytes)
        return await super().handle(req)

    def _enqueue(self, t: Transition, nbytes: int) -> Message:
        key = (t.episode_id, t.step)
        if key in self.seen:  # a redelivery (the worker's ack was lost): judged once
            self.counters["transitions.duplicate"] += 1
            return Ack(note="already have it")
        if len(self.queue) >= self.cfg.max_queue or self.queued_bytes + nbytes > self.runtime.inbox_max_bytes:
            self.counters["transitions.refused_full"] += 1
            return ErrorReply(
                code="overloaded", message=f"{len(self.queue)} transitions queued", retryable=True
            )
        self.seen[key] = None
        if len(self.seen) > SEEN_MAX:
            self.seen.popitem(last=False)
        self.queue.append((t, time.monotonic(), nbytes))
        self.queued_bytes += nbytes
        self.counters["transitions.received"] += 1
        self.counters["queue.max_depth"] = max(self.counters["queue.max_depth"], len(self.queue))
        self.changed.set()
        return Ack(note="queued")

    # -- judging -------------------------------------------------------------------------------------

    async def main(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg  # scores are delivered on tasks of their own: a learner away never stalls judging
            for i in range(self.cfg.max_concurrency):
                tg.create_task(self._judging_loop(), name=f"judge{i}")

    async def _judging_loop(self) -> None:
        while True:
            if not self.queue:
                self.changed.clear()
                await self.changed.wait()
                continue
            t, enqueued, nbytes = self.queue.popleft()
            self.queued_bytes -= nbytes
            waited = time.monotonic() - enqueued
            if waited > self.cfg.score_timeout_s:
                # the learner stopped waiting for it long ago: judging it would only make a late score,
                # and the judge's time goes to steps that can still count
                self.counters["transitions.expired"] += 1
                continue
            self.judging += 1
            try:
                verdict = await self.judge.judge(t, queue_s=waited, queue_depth=len(self.queue))
            except ValueError as exc:  # images that do not decode: the sender's fault, answered at once
                self.counters["transitions.bad"] += 1
                log.warning("transition %s step %d cannot be judged: %s", t.episode_id, t.step, exc)
                verdict = self.judge.failed(t, f"bad input: {exc}"[:300])
            finally:
                self.judging -= 1
            self._count(verdict)
            self._record(t, verdict)
            self._tg.create_task(self._deliver(verdict), name=f"deliver:{t.episode_id}:{t.step}")

    async def _ask(self, request: PolicyRequest) -> PolicyResponse:
        """One judge request; an overloaded or restarting broker is retried, one that stays away is an
        error of this vote (JudgeUnavailable)."""
        rt = self.runtime
        try:
            reply = await retry_idempotent(
                lambda: self.broker.request(request, timeout=self.cfg.request_timeout_s),
                attempts=JUDGE_ATTEMPTS,
                initial=rt.reconnect_backoff_initial_s,
                cap=rt.reconnect_backoff_max_s,
                # a vote that timed out is not asked again: the engine is slow, not gone, and a second
                # generation would only load it more
                is_transient=lambda e: getattr(e, "transient", False) and not isinstance(e, RequestTimeout),
            )
        except ActorError as exc:
            self.counters["votes.error"] += 1
            raise JudgeUnavailable(f"judge request failed: {exc}") from None
        if not isinstance(reply, PolicyResponse):
            raise JudgeUnavailable(f"broker answered {type(reply).__name__} to a judge request")
        return reply

    def _count(self, v: Verdict) -> None:
        s = v.score
        c = self.counters
        c["steps.judged"] += 1
        c["votes.valid"] += s.votes - s.invalid
        c["votes.invalid"] += s.invalid
        if s.score is None:
            c["steps.error" if s.error else "steps.invalid"] += 1
        else:
            c["steps.positive" if s.score > 0 else "steps.negative" if s.score < 0 else "steps.zero"] += 1
        c["latency_ms.total"] += int(s.latency_s * 1000)

    def _record(self, t: Transition, v: Verdict) -> None:
        """Append the verdict beside the episode (the env worker made its directory)."""
        if (
            not (_NAME.fullmatch(t.task_id) and _NAME.fullmatch(t.episode_id))
            or ".." in t.task_id + t.episode_id
        ):
            self.counters["records.unnamed"] += 1
            return
        folder = self.run_dir / "episodes" / t.task_id / t.episode_id
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "prm.jsonl", "a") as f:
                f.write(json.dumps(v.record) + "\n")
        except OSError as exc:  # a full disk must not stop judging; the score still reaches the learner
            self.counters["records.failed"] += 1
            log.warning("could not record the PRM verdict of %s step %d: %s", t.episode_id, t.step, exc)

    async def _deliver(self, v: Verdict) -> None:
        if self.learner is None:
            return
        rt = self.runtime
        try:
            await retry_idempotent(
                lambda: self.learner.request(v.score),
                attempts=10,
                initial=rt.reconnect_backoff_initial_s,
                cap=rt.reconnect_backoff_max_s,
            )
            self.counters["scores.sent"] += 1
        except ActorError as exc:  # the learner marks the step missing after its timeout
            self.counters["scores.undelivered"] += 1
            log.warning("score of %s step %d not delivered: %s", v.score.episode_id, v.score.step, exc)
