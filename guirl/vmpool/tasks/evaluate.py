"""Scoring a task after an episode: postconfig, then the evaluator's getters and metrics.

OSWorld's semantics (docs/osworld-compat.md §4): `func` alone or a list joined by `conj` (`and`: any 0
gives 0, else the mean; `or`: any 1 gives 1, else the max); an `infeasible` task scores 1 only when the
agent's last action was FAIL, and any other task scores 0 when it was.

Faults, as OSWorld's runner records them: a metric or getter that raises on what the episode left behind
scores 0 (the reason is kept in `ctx.evaluation_errors`), as does a getter whose request the VM answered
with an error. The gold side is never the policy's: an expected value that cannot be fetched, a gold file
the metric fails on, or a library this host lacks is an `EvaluationError`, as is a VM that does not answer
or answers that it cannot provide what is asked (501: no AT-SPI on this desktop): the episode is played
again, never scored. A task whose getter or metric guirl lacks never gets here: suites are checked before
a run (`guirl.vmpool.tasks.suite.check_supported`); reaching one anyway is an `EvaluationError`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from typing import Any

from guirl.agent.actions import Fail
from guirl.vmpool.client import UNAVAILABLE, VMClient, VMError
from guirl.vmpool.sandbox import SandboxError
from guirl.vmpool.tasks.files import FetchError
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
    """The VM did not answer at all (down, unreachable, timed out), or answered that it cannot give what was
    asked (`UNAVAILABLE`: no AT-SPI on this desktop, a tree that could not be read in time): an environment
    fault, not what the policy left behind."""
    return isinstance(exc, VMError) and exc.status in (0, *UNAVAILABLE)


async def evaluate(task: Task, client: VMClient, ctx: TaskContext) -> float:
    """The task's score in [0, 1] for the episode whose actions are `ctx.actions`; how it was reached is
    left in `ctx.evaluation` (`result.json`'s `evaluation`, shown by `guirl view`)."""
    ctx.evaluation = {"conj": task.evaluator.conj, "metrics": []}
    score = await _evaluate(task, client, ctx)
    ctx.evaluation["score"] = score
    return score


async def _evaluate(task: Task, client: VMClient, ctx: TaskContext) -> float:
    ev = task.evaluator
    try:
        await run_setup(client, ev.postconfig, ctx, where="evaluator.postconfig")
    except SetupError as exc:
        # OSWorld's setup controller logs a failed step and goes on to score; a VM that is gone cannot be,
        # nor a gold file or checker the step downloads on the host
        if _unreachable(exc.__cause__ or exc) or isinstance(exc.__cause__, FetchError):
            raise EvaluationError(f"{task.id}: postconfig: {exc}") from exc
        _note(ctx, task, f"postconfig: {exc}")
    if task.infeasible:
        ctx.evaluation.update(infeasible=True, agent_said_fail=_failed(ctx.actions))
        return 1.0 if _failed(ctx.actions) else 0.0
    if _failed(ctx.actions):
        ctx.evaluation["agent_said_fail"] = True
        return 0.0
    funcs = task.funcs
    n = len(funcs)
    scores: list[float] = []
    for i, name in enumerate(funcs):
        try:
            metric = get_metric(name)
        except UnsupportedMetric as exc:
            raise EvaluationError(f"{task.id}: {exc}") from exc
        options = _at(ev.options, i, n) or {}
        expected_cfg = _at(ev.expected, i, n)
        entry: dict[str, Any] = {"metric": name, "options": _preview(options, ctx)}
        ctx.evaluation["metrics"].append(entry)
        score = await _score(
            task, name, metric, _at(ev.result, i, n), expected_cfg, options, client, ctx, entry
        )
        if not 0.0 <= score <= 1.0:  # NaN included: a metric's bug must not become a reward
            _note(ctx, task, f"evaluator {name} gave {score!r}, outside [0, 1]: scored 0")
            score = 0.0
        entry["score"] = score
        if (ev.conj == "and" and score == 0.0) or (ev.conj == "or" and score == 1.0):
            if i + 1 < n:
                ctx.evaluation["not_run"] = list(funcs[i + 1 :])
            return score
        scores.append(score)
    if not scores:
        return 0.0
    return sum(scores) / len(scores) if ev.conj == "and" else max(scores)


async def _score(
    task: Task,
    name: str,
    metric: Any,
    result_cfg: Any,
    expected_cfg: Any,
    options: dict[str, Any],
    client: VMClient,
    ctx: TaskContext,
    entry: dict[str, Any],
) -> float:
    """One metric's score (what the getters returned is previewed into `entry`). What the episode left
    behind (the result) can fail to be read or scored: that scores 0. The gold side cannot: an expected
    value that cannot be fetched, a gold file the metric fails on (its error names the file, or the metric
    fails on the gold file against itself), a library missing on this host, are the task's or the host's
    faults."""
    entry["result_getter"] = _getter_type(result_cfg)
    try:
        result = await get(result_cfg, client, ctx)
    except FileNotFoundError:
        entry["result"] = "(no such file on the VM)"
        return 0.0
    except UnsupportedGetter as exc:
        raise EvaluationError(f"{task.id}: {exc}") from exc
    except Exception as exc:
        if _unreachable(exc):
            raise EvaluationError(f"{task.id}: evaluator {name}: the VM did not answer: {exc}") from exc
        _note(ctx, task, f"evaluator {name}: the result could not be read: {type(exc).__name__}: {exc}")
        return 0.0
    entry["result"] = _preview(result, ctx)
    expected = None
    # only what the host holds is gold; an `expected` read from the VM (the original on the Desktop, the
    # agent's own output) may be what the policy spoiled
    gold = bool(expected_cfg) and isinstance(expected_cfg, dict) and expected_cfg.get("type") in GOLD_GETTERS
    if expected_cfg:
        entry["expected_getter"] = _getter_type(expected_cfg)
        try:
            expected = await get(expected_cfg, client, ctx)
        except UnsupportedGetter as exc:
            raise EvaluationError(f"{task.id}: {exc}") from exc
        except Exception as exc:
            if gold or _unreachable(exc):
                raise EvaluationError(
                    f"{task.id}: evaluator {name}: the expected value could not be obtained: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            _note(ctx, task, f"evaluator {name}: the expected value could not be read: {type(exc).__name__}")
            return 0.0
        entry["expected"] = _preview(expected, ctx)
    args = (result, expected) if expected_cfg else (result,)
    try:
        # metrics read files (spreadsheets, documents): off the event loop
        return float(await asyncio.to_thread(metric, *args, **options))
    except (UnsupportedMetric, ImportError, SandboxError) as exc:  # what guirl or this host lacks
        raise EvaluationError(f"{task.id}: evaluator {name}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        if (
            gold
            and _gold_files(expected)
            and (_names_gold(exc, expected) or await _fails_on_itself(metric, expected, options))
        ):
            raise EvaluationError(
                f"{task.id}: evaluator {name} cannot score the gold file against itself "
                f"({type(exc).__name__}: {exc}): the task or this host is broken"
            ) from exc
        _note(ctx, task, f"evaluator {name} failed: {type(exc).__name__}: {exc}")
        return 0.0


PREVIEW_CHARS = 400
"""How much of a getter's value `result.json` keeps (a file is kept as its name and size)."""


def _getter_type(cfg: Any) -> str:
    if isinstance(cfg, dict):
        return str(cfg.get("type", ""))
    if isinstance(cfg, list):
        return ", ".join(_getter_type(c) for c in cfg)
    return ""


def _preview(value: Any, ctx: TaskContext) -> Any:
    """A getter's value as the run's viewer shows it: JSON-safe and short. A file a getter brought to this
    host (under the episode's cache or the run's downloads) is its name and size (the file itself stays
    there); anything else its repr, cut. Never raises: the record must not cost the episode its score."""
    try:
        roots = tuple(os.path.join(os.path.abspath(d), "") for d in (ctx.cache_dir, ctx.download_cache))
        return _shown(value, roots, depth=0)
    except Exception as exc:  # noqa: BLE001  (an odd value's repr, a file gone meanwhile: say so)
        return f"(could not be previewed: {type(exc).__name__})"


def _shown(value: Any, roots: tuple[str, ...], depth: int) -> Any:
    if depth < 3 and isinstance(value, list | tuple) and len(value) <= 8:
        return [_shown(v, roots, depth + 1) for v in value]
    if depth < 3 and isinstance(value, dict) and len(value) <= 16:
        return {str(k): _shown(v, roots, depth + 1) for k, v in value.items()}
    # (getters give paths under the caches, relative when run.root_dir is: the default `runs`)
    if isinstance(value, str) and len(value) < 4096 and "\x00" not in value:
        path = os.path.abspath(value)
        if path.startswith(roots) and os.path.isfile(path):
            return f"file {os.path.basename(path)} ({os.path.getsize(path)} bytes)"
    if value is None or isinstance(value, bool) or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, int) and abs(value) < 10**15:
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + f"… ({len(text)} characters)"


GOLD_GETTERS = frozenset({"cloud_file", "cache_file", "rule", "rule_relativeTime"})
"""Expected-value getters that read nothing of the VM: what they give is the gold, never the policy's."""


def _names_gold(exc: BaseException, expected: Any) -> bool:
    """The error is about a gold file: it names its path (a file that cannot be opened says which)."""
    paths = expected if isinstance(expected, list) else [expected]
    return any(str(p) in str(exc) for p in paths)


def _gold_files(expected: Any) -> bool:
    """`expected` is one or more files a getter brought here (a gold file the metric reads)."""
    paths = expected if isinstance(expected, list) else [expected]
    return bool(paths) and all(isinstance(p, str) and os.path.isfile(p) for p in paths)


async def _fails_on_itself(metric: Any, expected: Any, options: dict[str, Any]) -> bool:
    try:
        await asyncio.to_thread(metric, expected, expected, **options)
    except Exception:  # noqa: BLE001  (any failure on gold vs gold is the gold's or the host's)
        return True
    return False


def _note(ctx: TaskContext, task: Task, what: str) -> None:
    log.warning("task %s: %s (scored as OSWorld scores it)", task.id, what)
    ctx.evaluation_errors.append(what[:500])
