"""`guirl status RUN_DIR`: what a local run is doing now, the first thing to look at when it seems stuck.

The driver of a run (`guirl train`, `guirl eval`) writes `status.json` into the run directory every few
seconds: its actors (up or down, pid, restarts, how long since each was heard), the episodes in flight
and how long each has been running, the learner's version and lineage epoch against what each engine
serves, and the weight updates under way. `guirl status` reads it, says whether the driver is still
alive and how old the picture is, and prints it (or `--json`). It never talks to the run: a stuck run
cannot make it hang, and a dead one still shows its last picture.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from guirl.fileio import write_json_atomic
from guirl.proc import pid_alive

STATUS_FILE = "status.json"
FORMAT = 1


class StatusWriter:
    """Writes the run's `status.json` from the driver (at most every `interval_s`)."""

    def __init__(self, run_dir: Path, coord: Any, *, mode: str, interval_s: float = 2.0) -> None:
        self.path = Path(run_dir) / STATUS_FILE
        self.run_dir = Path(run_dir)
        self.coord, self.mode, self.interval_s = coord, mode, interval_s
        self.started = time.time()
        self._last = 0.0
        self._broker: Any = None  # a connection of the coordinator's to the broker, once it is known
        self._asking: asyncio.Task | None = None
        self._engines: dict[str, Any] = {}
        self._prm_conn: Any = None  # ... and to the PRM, in a PRM+RL run
        self._prm: dict[str, Any] = {}
        self._asking_prm: asyncio.Task | None = None
        self._actors: dict[str, Any] = {}

    def watch_broker(self, endpoint: str) -> None:
        from guirl.messages import PolicyChannel

        self._broker = self.coord.connect("status-broker", endpoint, PolicyChannel)

    def watch_prm(self, endpoint: str) -> None:
        from guirl.messages import PRMChannel

        self._prm_conn = self.coord.connect("status-prm", endpoint, PRMChannel)

    async def _ask_prm(self) -> None:
        from guirl.messages.types import StatsRequest
        from guirl.runtime.errors import ActorError

        try:
            reply = await self._prm_conn.request(StatsRequest(), timeout=5.0)
        except ActorError as exc:
            self._prm = {"prm_error": f"the PRM did not answer: {exc}"[:200]}
            return
        c = reply.counters
        self._prm = {
            "prm_queued": c.get("queue.depth", 0),
            "prm_judging": c.get("judging", 0),
            "prm_scores_sent": c.get("scores.sent", 0),
        }

    async def _ask_broker(self) -> None:
        from guirl.messages.types import StatsRequest
        from guirl.runtime.errors import ActorError

        try:
            reply = await self._broker.request(StatsRequest(), timeout=5.0)
        except ActorError as exc:
            self._engines = {"error": f"the broker did not answer: {exc}"[:200]}
            return
        counters = reply.counters
        engines: dict[str, Any] = {}
        for key, value in counters.items():
            if key.startswith("engine.") and key.count(".") >= 2:
                name, field = key[len("engine.") :].rsplit(".", 1)
                engines.setdefault(name, {})[field] = value
        self._engines = {
            "engines": engines,
            "pending_weight_updates": counters.get("weights.pending", 0),
            "weight_updates": counters.get("weights.updates", 0),
            "weight_updates_abandoned": counters.get("weights.abandoned", 0),
            "requests_queued": counters.get("requests.queued", 0),
            "requests_inflight": counters.get("requests.inflight", 0),
        }

    def maybe(self, sup: Any, *, force: bool = False) -> None:
        """Write the status if `interval_s` has passed (and start asking the broker for the next one;
        `force`: now, the run's last picture, asking nobody)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        if force:
            for asking in (self._asking, self._asking_prm):
                if asking is not None:
                    asking.cancel()
        else:
            if self._broker is not None and (self._asking is None or self._asking.done()):
                self._asking = asyncio.create_task(self._ask_broker(), name="status-broker")
            if self._prm_conn is not None and (self._asking_prm is None or self._asking_prm.done()):
                self._asking_prm = asyncio.create_task(self._ask_prm(), name="status-prm")
        write_json_atomic(self.path, self.snapshot(sup), indent=1)

    def snapshot(self, sup: Any) -> dict[str, Any]:
        from guirl.learner.lineage import Lineage

        coord = self.coord
        heard = coord.heard_ages()
        if self._broker is not None and self._broker.state == "alive":  # it talks to nobody in the driver
            heard["broker"] = asyncio.get_running_loop().time() - self._broker.last_heard
        actors = {
            name: {
                "up": bool(h.alive),
                "pid": h.pid,
                "host": h.spec.host or "",
                "restarts": h.restarts,
                "heard_s_ago": round(heard[name], 1) if name in heard else None,
            }
            for name, h in sorted(sup.actors.items())
        }
        if not actors:  # stopped: the last ones known, down
            actors = {n: {**a, "up": False, "heard_s_ago": None} for n, a in self._actors.items()}
        self._actors = actors
        mono = time.monotonic()
        episodes = sorted(
            (
                {
                    "episode_id": eid,
                    "task_id": run.todo.task.task_id,
                    "worker": run.worker,
                    "attempt": run.todo.attempt,
                    "running_s": round(mono - run.assigned_at, 1),
                }
                for eid, run in coord.running.items()
            ),
            key=lambda e: -e["running_s"],
        )
        epoch = None
        with contextlib.suppress(ValueError):  # a damaged record: the learner says so in its own log
            lineage = Lineage.load(self.run_dir)
            epoch = lineage.epoch if lineage is not None else None
        counters = coord.counters.snapshot()
        return {
            "format": FORMAT,
            "mode": self.mode,
            "driver_pid": os.getpid(),
            "written_at": round(time.time(), 3),
            "started_at": round(self.started, 3),
            "actors": actors,
            "learner": {"version": coord.learner_version, "epoch": epoch},
            **self._engines,
            **self._prm,
            "episodes_running": episodes,
            "episodes": {
                k.removeprefix("episodes."): v for k, v in counters.items() if k.startswith("episodes.")
            },
            "groups_reissued": counters.get("groups.reissued", 0),
        }


# -- reading it ---------------------------------------------------------------------------------------


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """The run's last status; ValueError with what is wrong (no such run, no status yet, damaged)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ValueError(f"{run}: no such run directory")
    path = run / STATUS_FILE
    if not path.is_file():
        raise ValueError(
            f"{path}: no status yet (the run has not started its actors, or predates `guirl status`)"
        )
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a status this guirl writes (format {FORMAT})")
    return doc


def render(doc: dict[str, Any], now: float | None = None) -> str:
    """The status as a few tables."""
    now = time.time() if now is None else now
    age = now - float(doc.get("written_at") or 0)
    alive = pid_alive(doc.get("driver_pid"))
    head = (
        f"{doc.get('mode', '?')} run, driver pid {doc.get('driver_pid')} "
        f"{'running' if alive else 'NOT RUNNING (the picture below is its last)'}; "
        f"status written {age:.0f} s ago"
    )
    lines = [head]
    if alive and age > 30:
        lines.append(f"  the driver has not written a status for {age:.0f} s: its event loop may be stuck")
    lines.append("")
    lines.append(
        "{:<14} {:<6} {:>8} {:>9} {:>10}  {}".format("actor", "state", "pid", "restarts", "heard", "host")
    )
    for name, a in (doc.get("actors") or {}).items():
        heard = a.get("heard_s_ago")
        lines.append(
            f"{name:<14} {'up' if a.get('up') else 'DOWN':<6} {a.get('pid', 0):>8} {a.get('restarts', 0):>9} "
            f"{f'{heard:.1f} s ago' if heard is not None else '-':>10}  {a.get('host') or 'local'}"
        )
    learner = doc.get("learner") or {}
    lines.append("")
    lines.append(f"learner: version {learner.get('version')} (lineage epoch {learner.get('epoch')})")
    if "error" in doc:
        lines.append(f"engines: {doc['error']}")
    for name, e in (doc.get("engines") or {}).items():
        behind = ""
        engine_at = (e.get("epoch"), max(0, e.get("version") or 0))  # -1: the starting weights, version 0
        learner_at = (learner.get("epoch"), learner.get("version"))
        if learner.get("epoch") is not None and engine_at != learner_at:
            behind = "  <- not the learner's weights"
            if doc.get("pending_weight_updates"):
                behind += " (an update is under way)"
        lines.append(
            f"engine {name}: version {e.get('version')} (epoch {e.get('epoch')}), "
            f"{'healthy' if e.get('healthy') else 'UNHEALTHY'}"
            f"{'' if e.get('weights_intact', 1) else ', HALF-UPDATED (serves nothing until an update lands)'}"
            f"{behind}"
        )
    if "prm_queued" in doc or "prm_error" in doc:
        lines.append(
            f"prm: {doc['prm_error']}"
            if "prm_error" in doc
            else f"prm: {doc['prm_queued']} transitions queued, {doc['prm_judging']} with the judge, "
            f"{doc.get('prm_scores_sent', 0)} scores sent"
        )
    if "pending_weight_updates" in doc:
        lines.append(
            f"weight updates: {doc['pending_weight_updates']} under way, "
            f"{doc.get('weight_updates', 0)} done, "
            f"{doc.get('weight_updates_abandoned', 0)} abandoned (sender gone); requests "
            f"{doc.get('requests_queued', 0)} queued, {doc.get('requests_inflight', 0)} in flight"
        )
    running = doc.get("episodes_running") or []
    lines.append("")
    lines.append(f"episodes in flight: {len(running)}")
    for e in running[:20]:
        lines.append(
            f"  {e['episode_id']:<12} {e['task_id'][:40]:<40} {e['worker']:<10} attempt {e['attempt']} "
            f"running {e['running_s']:.0f} s"
        )
    if len(running) > 20:
        lines.append(f"  ... and {len(running) - 20} more (--json lists them all)")
    counts = doc.get("episodes") or {}
    if counts:
        lines.append("episodes ended: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines) + "\n"
