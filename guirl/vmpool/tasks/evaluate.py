"""Scoring a task after an episode: postconfig, then the evaluator's getters and metrics.

OSWorld's semantics (docs/osworld-compat.md §4): `func` alone or a list joined by `conj` (`and`: any 0
gives 0, else the mean; `or`: any 1 gives 1, else the max); an `infeasible` task scores 1 only when the
agent's last action was FAIL, and any other task scores 0 when it was.

Faults, as OSWorld's runner records them: a metric or getter that raises on what the episode left behind
scores 0 (the reason is kept in `ctx.evaluation_errors`), as does a getter whose request the VM answered
with an error. Only a VM that does not answer, or answers that it cannot provide what is asked (501: no
AT-SPI on this desktop), is an environment fault (`EvaluationError`: the episode is played again, never
scored). A task whose getter or metric guirl lacks never gets here: suites are checked
before a run (`guirl.vmpool.tasks.suite.check_supported`); reaching one anyway is an `EvaluationError`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from guirl.agent.actions import Fail
from guirl.vmpool.client import VMClient, VMError
from guirl.vmpool.tasks.getters import UnsupportedGetter, get
from guirl.vmpool.tasks.metrics import UnsupportedMetric, get_metric
from guirl.vmpool.tasks.model import Task
from guirl.vmpool.tasks.setup import SetupError, TaskContext, run_setup

log = logging.getLogger(__name__)


class EvaluationError(RuntimeError):
    """The evaluator itself failed (a getter, a metric, the postconfig): the task cannot be scored."""


def _failed(actions: list[Any]) -> bool:
    last = actions[-1] if actions else None
    return isinstance(last, Fail) or last == "FAIL"


def _at(value: Any, i: int, n: int) -> Any:
    if isinstance(value, list):
        return value[i]
    return value if n == 1 else None


def _unreachable(exc: BaseException) -> bool:
    """The VM did not answer at all (down, unreachable, timed out), or answered that it cannot do what was
    asked (501: e.g. no AT-SPI on this desktop): an environment fault, not what the policy left behind."""
    return isinstance(exc, VMError) and exc.status in (0, 501)


async def evaluate(task: Task, client: VMClient, ctx: TaskContext) -> float:
    """The task's score in [0, 1] for the episode whose actions are `ctx.actions`."""
    ev = task.evaluator
    try:
        await run_setup(client, ev.postconfig, ctx, where="evaluator.postconfig")
    except SetupError as exc:
        # OSWorld's setup controller logs a failed step and goes on to score; a VM that is gone cannot be
        if _unreachable(exc.__cause__ or exc):
            raise EvaluationError(f"{task.id}: postconfig: the VM did not answer: {exc}") from exc
        _note(ctx, task, f"postconfig: {exc}")
    if task.infeasible:
        return 1.0 if _failed(ctx.actions) else 0.0
    if _failed(ctx.actions):
        return 0.0
    funcs = task.funcs
    n = len(funcs)
    scores: list[float] = []
    for i, name in enumerate(funcs):
        try:
            metric = get_metric(name)
            try:
                result = await get(_at(ev.result, i, n), client, ctx)
            except FileNotFoundError:
                score = 0.0
            else:
                options = _at(ev.options, i, n) or {}
                expected_cfg = _at(ev.expected, i, n)
                # metrics read files (spreadsheets, documents): off the event loop
                if expected_cfg:
                    expected = await get(expected_cfg, client, ctx)
                    score = float(await asyncio.to_thread(metric, result, expected, **options))
                else:
                    score = float(await asyncio.to_thread(metric, result, **options))
        except (UnsupportedMetric, UnsupportedGetter) as exc:
            raise EvaluationError(f"{task.id}: {exc}") from exc
        except Exception as exc:
            if _unreachable(exc):
                raise EvaluationError(f"{task.id}: evaluator {name}: the VM did not answer: {exc}") from exc
            _note(ctx, task, f"evaluator {name} failed: {type(exc).__name__}: {exc}")
            score = 0.0
        if not 0.0 <= score <= 1.0:  # NaN included: a metric's bug must not become a reward
            _note(ctx, task, f"evaluator {name} gave {score!r}, outside [0, 1]: scored 0")
            score = 0.0
        if ev.conj == "and" and score == 0.0:
            return 0.0
        if ev.conj == "or" and score == 1.0:
            return 1.0
        scores.append(score)
    if not scores:
        return 0.0
    return sum(scores) / len(scores) if ev.conj == "and" else max(scores)


def _note(ctx: TaskContext, task: Task, what: str) -> None:
    log.warning("task %s: %s (scored as OSWorld scores it)", task.id, what)
    ctx.evaluation_errors.append(what[:500])
