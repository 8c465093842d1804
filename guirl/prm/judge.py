"""Judging one step: the judge prompt, m votes through the broker, the votes read and combined.

Used by the PRM actor (steps as they stream from env workers) and by `guirl prm score` (the episodes of a
finished run). The judge is a model behind the broker under its own name; `ask` sends it one
`PolicyRequest` and returns its `PolicyResponse`. A vote the judge answers without a readable score is
*invalid* (counted); a vote that could not be asked at all (broker gone, engine refused) is an *error*:
neither is ever turned into a score, and neither is the policy's doing.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from guirl.messages import Blob
from guirl.messages.types import Image, PolicyRequest, PolicyResponse, SamplingParams, StepScore, Transition
from guirl.prm.prompt import JudgePrompt, JudgeTemplate, build_judge_prompt, load_template
from guirl.prm.votes import Vote, combine, parse_vote

Ask = Callable[[PolicyRequest], Awaitable[PolicyResponse]]
MAX_TEXT_KEPT = 4000
"""Characters of each judge answer kept in `prm.jsonl` (its end: the verdict)."""


class JudgeUnavailable(Exception):
    """The judge could not be asked (the broker is unreachable, the engine refused the request)."""


def vote_seed(seed: int, episode_id: str, step: int, vote: int) -> int:
    """A sampling seed per (run seed, episode, step, vote): votes on one step differ, and a re-judged step
    draws the same votes."""
    digest = hashlib.sha256(f"{seed}:{episode_id}:{step}:{vote}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass
class Verdict:
    """A judged step: the score for the learner, and what to record beside the episode."""

    score: StepScore
    record: dict[str, Any]


class Judge:
    """Scores transitions with a judge model; see the module docstring. `prm` is a `PRMConfig`."""

    def __init__(self, prm: Any, ask: Ask) -> None:
        self.cfg = prm
        self.ask = ask
        self.template: JudgeTemplate = load_template(prm.template)

    def prompt(self, t: Transition) -> JudgePrompt:
        """The judge prompt of a transition (CPU work: images are resized; run it off the event loop)."""
        history = list(t.history)[-self.cfg.history_images :] if self.cfg.history_images else []
        actions = list(t.previous_actions)
        if len(history) > len(actions):  # each earlier screen goes with the action taken on it
            raise ValueError(f"{len(history)} history images for {len(actions)} previous actions")
        shown = actions[len(actions) - len(history) :] if history else []
        return build_judge_prompt(
            self.template,
            instruction=t.instruction,
            previous_actions=actions,
            response=t.response,
            before=bytes(t.before.data),
            after=bytes(t.after.data),
            history=[(bytes(img.data), a) for img, a in zip(history, shown, strict=False)],
            max_pixels=self.cfg.max_pixels,
        )

    def failed(self, t: Transition, error: str) -> Verdict:
        """The verdict on a step that could not be judged at all (no vote; `error` says why)."""
        score = StepScore(
            episode_id=t.episode_id, step=t.step, score=None, error=error, template=self.template.version
        )
        record = {
            "step": t.step,
            "score": None,
            "votes": 0,
            "invalid": 0,
            "errors": [error],
            "template": self.template.version,
        }
        return Verdict(score, record)

    async def judge(self, t: Transition, *, queue_s: float = 0.0, queue_depth: int = 0) -> Verdict:
        """m votes on `t`, combined (never raises for a judge that cannot be asked: that is the score's
        `error`). ValueError for a transition whose images do not decode (the sender's fault)."""
        prompt = await asyncio.to_thread(self.prompt, t)
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(self._vote(t, prompt, i) for i in range(self.cfg.votes)), return_exceptions=True
        )
        latency = time.monotonic() - started
        votes: list[Vote] = []
        texts: list[str] = []
        errors: list[str] = []
        for out in outcomes:
            if isinstance(out, JudgeUnavailable):
                errors.append(str(out)[:300])
            elif isinstance(out, BaseException):
                raise out
            else:
                vote, text = out
                votes.append(vote)
                texts.append(text[-MAX_TEXT_KEPT:])
        combined = combine(votes)
        error = "" if votes else "; ".join(errors) or "no vote"
        score = StepScore(
            episode_id=t.episode_id,
            step=t.step,
            score=combined.score,
            votes=combined.votes,
            invalid=combined.invalid,
            latency_s=round(latency, 4),
            error=error,
            queue_s=round(queue_s, 4),
            queue_depth=queue_depth,
            template=self.template.version,
        )
        record = {
            "step": t.step,
            "score": combined.score,
            "votes": combined.votes,
            "invalid": combined.invalid,
            "vote_scores": [v.score for v in votes],
            "invalid_reasons": [v.reason for v in votes if not v.valid],
            "errors": errors,
            "latency_s": score.latency_s,
            "queue_s": score.queue_s,
            "template": self.template.version,
            "answers": texts,
        }
        return Verdict(score, record)

    async def _vote(self, t: Transition, prompt: JudgePrompt, index: int) -> tuple[Vote, str]:
        cfg = self.cfg
        request = PolicyRequest(
            episode_id=t.episode_id,
            step=t.step,
            model=cfg.model_name,
            messages=prompt.messages,
            images=[
                Image(data=Blob(png), width=w, height=h)
                for png, (w, h) in zip(prompt.images, prompt.image_sizes, strict=True)
            ],
            sampling=SamplingParams(
                temperature=cfg.temperature,
                max_new_tokens=cfg.max_new_tokens,
                seed=vote_seed(t.seed, t.episode_id, t.step, index) if cfg.temperature > 0 else None,
            ),
            return_logprobs=False,
            task_id=t.task_id,
        )
        reply = await self.ask(request)
        if reply.finish_reason == "abort":
            raise JudgeUnavailable(f"the judge's engine refused the request: {reply.error or 'no reason'}")
        return parse_vote(reply.text), reply.text
