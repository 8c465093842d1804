"""Chaos: seeded fault schedules injected into a running train or eval run, and the invariants a run must
keep.

A schedule (`Schedule.generate`) is a list of faults drawn from a seed (`chaos.seed`): at a time after the
run's first update (an eval run: its first episode), or at a moment (`broadcast`: while the broker holds a
weight update; `checkpoint`: while the learner writes a checkpoint; `setup`: within a second of the
target's restart; `eval`: while evaluation episodes run; `judging`: while the PRM holds transitions), an
actor (broker, learner, an env worker, the PRM; never the coordinator, which is the driver) or a VM is
SIGKILLed (the supervisor, or the pool, restarts it) or SIGSTOPped for a while and then SIGCONTed (a hung
process). The driver's follow loop calls `ChaosMonkey.tick` and every fault it injects is appended to
`chaos.jsonl` in the run directory; `Schedule.describe` is what a failing seed prints to reproduce itself.

`check_run` reads a finished run directory and lists every broken invariant:

- the run made its updates (`summary.json`);
- every episode id handed out has exactly one end state (`episodes.jsonl`, the coordinator's ledger);
- no episode was trained twice, and every trained step was played by weights of the learner's lineage no
  newer than the update that trained it (`trained.jsonl`, `lineage.json`);
- no episode that ended in an environment fault was trained or scored (an eval run: `bench/chaos.py` also
  checks that the scripted reference solutions still score 100 %);
- no gap between consecutive env steps (`traj.jsonl` times) longer than the bound given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from guirl.config.validate import check_chaos
from guirl.proc import cmdline

log = logging.getLogger(__name__)

CHAOS_LOG = "chaos.jsonl"
KINDS = ("kill", "stop")
BUSY_TARGETS = ("learner", "broker", "prm")
"""The actors a `busy` fault (a `HoldGil` to its mailbox) can strike."""
MOMENTS = ("any", "broadcast", "checkpoint", "setup", "eval", "judging")
MOMENT_TARGETS = ("learner", "broker", "prm")
"""The targets a fault may wait for a moment to strike (the others strike at any time)."""


@dataclass(frozen=True)
class Fault:
    at_s: float
    """Seconds after the run's first update (the earliest it may strike; a moment waits for its moment)."""
    target: str
    """An actor name, or `vm` (one of the run's local desktops)."""
    kind: str
    """`kill` (SIGKILL), `stop` (SIGSTOP, then SIGCONT after `hold_s`) or `busy` (the actor holds the GIL for
    `hold_s`)."""
    moment: str = "any"
    hold_s: float = 0.0


@dataclass
class Schedule:
    seed: int
    faults: list[Fault] = field(default_factory=list)
    garbage: bool = True
    """A hostile peer sends malformed messages to every actor's endpoint throughout."""

    @classmethod
    def generate(
        cls,
        seed: int,
        *,
        targets: list[str],
        n_faults: int,
        span_s: float,
        max_hold_s: float = 4.0,
        moments: tuple[str, ...] = MOMENTS,
        n_busy: int = 0,
        busy_hold_s: tuple[float, float] = (6.0, 12.0),
    ) -> Schedule:
        """`n_faults` faults spread over `span_s` seconds, each on one of `targets` (actor names and `vm`);
        and `n_busy` busy faults on the targets that have a mailbox, drawn from a stream of their own (a
        seed's other faults stay as they were)."""
        if not targets or n_faults < 0 or span_s <= 0:
            raise ValueError("a schedule needs targets, n_faults >= 0 and span_s > 0")
        rng = random.Random(seed)
        faults = []
        for i in range(n_faults):
            target = rng.choice(targets)
            kind = "kill" if target == "vm" else rng.choice(KINDS)
            moment = rng.choice(moments) if target in MOMENT_TARGETS else "any"
            if (moment, target != "learner") in (("checkpoint", True), ("judging", False)):
                moment = "any"  # only the learner checkpoints; it judges nothing
            at = round(span_s * (i + rng.random()) / max(1, n_faults), 2)
            hold = round(rng.uniform(0.5, max_hold_s), 2) if kind == "stop" else 0.0
            faults.append(Fault(at_s=at, target=target, kind=kind, moment=moment, hold_s=hold))
        busy_targets = [t for t in targets if t in BUSY_TARGETS]
        if n_busy and not busy_targets:
            raise ValueError(f"busy faults need one of {BUSY_TARGETS} among the targets")
        rng = random.Random(f"{seed}/busy")
        for i in range(n_busy):
            at = round(span_s * (i + rng.random()) / n_busy, 2)
            hold = round(rng.uniform(*busy_hold_s), 2)
            faults.append(Fault(at_s=at, target=rng.choice(busy_targets), kind="busy", hold_s=hold))
        return cls(seed, sorted(faults, key=lambda f: f.at_s) if n_busy else faults)

    def describe(self) -> str:
        """The schedule, as a failing run prints it (seed first: it regenerates the whole schedule)."""
        lines = [f"chaos seed {self.seed}: {len(self.faults)} faults"]
        lines += [
            f"  +{f.at_s:6.2f} s  {f.kind:<4} {f.target:<10} at {f.moment}"
            + (f" for {f.hold_s:.2f} s" if f.kind in ("stop", "busy") else "")
            for f in self.faults
        ]
        return "\n".join(lines)


class ChaosMonkey:
    """Injects a schedule's faults into a run (see the module docstring): `start` runs it on the driver's
    loop, looking `TICK_S` apart (asking the broker and the PRM what they are doing when a fault waits for
    a moment of theirs); `release` stops it."""

    MOMENT_WAIT_S = 15.0
    """How long a fault waits for its moment before striking anyway (so every fault is injected)."""
    TICK_S = 0.1
    """How often it looks: a tiny model's weight broadcast lasts well under a second."""

    def __init__(self, schedule: Schedule, run_dir: Path, sup: Any, coord: Any, writer: Any = None) -> None:
        self.schedule, self.run_dir, self.sup, self.coord = schedule, Path(run_dir), sup, coord
        self.writer = writer  # the run's StatusWriter: what the broker said last (weight updates under way)
        self.pending = list(schedule.faults)
        self.started: float | None = None  # the first update's time: faults count from there
        self.injected: list[dict[str, Any]] = []
        self._stopped: dict[int, Any] = {}  # pid -> the timer that will SIGCONT it
        self._junk: Any = None
        self._junk_connected: set[str] = set()
        self.garbage_sent = 0
        self._next_junk = 0.0
        self._rng = random.Random(schedule.seed)
        self._task: asyncio.Task | None = None
        self._busy = {"broadcast": False, "judging": False}  # what the broker and the PRM said just now
        self.failures = 0  # ticks that raised (logged): a broken injector must not pass for a quiet run
        self._holds: set[asyncio.Task] = set()  # busy faults under way (`HoldGil` requests)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="chaos")

    async def _run(self) -> None:
        while self.pending or self.schedule.garbage:
            await self._ask()
            try:
                self.tick()
            except Exception:  # a fault injector that breaks must say so (and counts), not take the run down
                self.failures += 1
                log.exception("chaos: injecting a fault failed")
            await asyncio.sleep(self.TICK_S)  # a sampling period, not a wait for anything

    async def _ask(self) -> None:
        """Ask the broker (a weight update under way) and the PRM (transitions held) directly, when a due
        fault waits for that moment: the status file's picture is seconds old."""
        from guirl.messages.types import StatsReply, StatsRequest
        from guirl.runtime.errors import ActorError

        now = time.monotonic()
        due = {f.moment for f in self.pending if self.started is not None and now >= self.started + f.at_s}
        for moment, conn, gauges in (
            ("broadcast", getattr(self.writer, "_broker", None), ("weights.pending",)),
            ("judging", getattr(self.writer, "_prm_conn", None), ("queue.depth", "judging")),
        ):
            if moment not in due or conn is None or conn.state != "alive":
                self._busy[moment] = False
                continue
            try:  # briefly: a SIGSTOPped peer looks alive until its heartbeats are missed
                reply = await conn.request(StatsRequest(), timeout=0.3)
            except ActorError:
                reply = None
            counters = reply.counters if isinstance(reply, StatsReply) else {}
            self._busy[moment] = any(counters.get(g, 0) for g in gauges)

    def tick(self) -> None:
        now = time.monotonic()
        if self.schedule.garbage and now >= self._next_junk:
            self._next_junk = now + 0.5
            endpoints = [ep for h in self.sup.actors.values() if h.alive for ep in h.endpoints]
            endpoints += list(getattr(self.coord, "endpoints", []) or [])
            self.garbage([ep for ep in endpoints if ep.startswith(("tcp://", "ipc://"))], self._rng)
        if self.started is None:
            # a train run's faults count from its first update (a run that never trained proves nothing),
            # an eval run's from its first episode
            begun = self.coord.learner_version >= 1 if self.coord.mode == "train" else self.coord.running
            if not begun:
                return
            self.started = now
        for fault in list(self.pending):  # each on its own: one waiting for its moment holds no other up
            due = self.started + fault.at_s
            if now < due:
                continue
            on_moment = self._moment(fault)
            if not on_moment and now < due + self.MOMENT_WAIT_S:
                continue
            self.pending.remove(fault)
            self._inject(fault, on_moment=on_moment)

    def _moment(self, fault: Fault) -> bool:
        if fault.moment in self._busy:  # broadcast, judging
            return self._busy[fault.moment]
        if fault.moment == "checkpoint":
            return any((self.run_dir / "checkpoints").glob(".v*.tmp"))
        if fault.moment == "setup":
            recent = [e for e in self.sup.history if e.kind == "restarted" and e.name == fault.target]
            return bool(recent) and time.time() - recent[-1].at < 1.0
        if fault.moment == "eval":
            return any(run.todo.eval_version >= 0 for run in self.coord.running.values())
        return True

    def _inject(self, fault: Fault, *, on_moment: bool) -> None:
        pid = 0
        done = ""
        try:
            if fault.target == "vm":
                pid = _kill_a_desktop(self.run_dir)
                done = "killed a desktop" if pid else "no desktop to kill"
            elif fault.target not in self.sup.actors or not self.sup.actors[fault.target].alive:
                done = "not running"
            elif fault.kind == "kill":
                pid = self.sup.kill(fault.target)
                done = "killed"
            elif fault.kind == "busy":
                handle = self.sup.actors[fault.target]
                pid = handle.pid
                hold = asyncio.create_task(
                    self._hold(fault, handle.endpoints[0]), name=f"busy:{fault.target}"
                )
                self._holds.add(hold)
                hold.add_done_callback(self._holds.discard)
                done = f"holding the GIL for {fault.hold_s:.2f} s"
            else:
                pid = self.sup.kill(fault.target, signal.SIGSTOP)
                loop = asyncio.get_running_loop()
                self._stopped[pid] = loop.call_later(fault.hold_s, self._cont, pid)
                done = f"stopped for {fault.hold_s:.2f} s"
        except (ProcessLookupError, KeyError, OSError) as exc:
            done = f"could not: {exc}"
        line = {
            "time": round(time.time(), 3),
            **asdict(fault),
            "pid": pid,
            "on_moment": on_moment,
            "done": done,
        }
        self.injected.append(line)
        with open(self.run_dir / CHAOS_LOG, "a") as f:
            f.write(json.dumps(line) + "\n")

    async def _hold(self, fault: Fault, endpoint: str) -> None:
        """Ask `fault.target` to hold the GIL (a connection of the coordinator's, one per target); its answer
        (or why there was none) goes to `chaos.jsonl`."""
        from guirl.messages import DiagChannel
        from guirl.messages.types import HoldGil
        from guirl.runtime.errors import ActorError

        name = f"chaos-{fault.target}"
        conn = self.coord.connections.get(name) or self.coord.connect(name, endpoint, DiagChannel)
        asked = time.monotonic()
        try:
            await conn.request(HoldGil(seconds=fault.hold_s), timeout=fault.hold_s + 30)
            done = f"held the GIL for {fault.hold_s:.2f} s; answered after {time.monotonic() - asked:.2f} s"
        except ActorError as exc:
            done = f"no answer: {exc}"[:300]
        with open(self.run_dir / CHAOS_LOG, "a") as f:
            f.write(json.dumps({"time": round(time.time(), 3), "target": fault.target, "busy": done}) + "\n")

    # -- a hostile peer ---------------------------------------------------------------------------------

    def garbage(self, endpoints: list[str], rng: random.Random) -> None:
        """Send each of `endpoints` one malformed message (as a stranger on the network would): random bytes,
        an empty frame, too many frames, a truncated or oversized body, a valid header around junk. The
        actors must drop it, count it, and go on."""
        import zmq

        if self._junk is None:
            self._junk = zmq.Context.instance().socket(zmq.DEALER)
            self._junk.setsockopt(zmq.LINGER, 0)
            self._junk.setsockopt(zmq.SNDHWM, 100)
            self._junk.setsockopt(zmq.IMMEDIATE, 1)
        for ep in endpoints:
            if ep not in self._junk_connected:
                self._junk.connect(ep)
                self._junk_connected.add(ep)
        choices = [
            [b"", rng.randbytes(rng.randint(1, 64))],
            [b""],
            [b"", b"\x82\xa4type\xa9heartbeat"],
            [b"", *[b"x"] * 40],
            [b"", b"\xdf\xff\xff\xff\xff" + rng.randbytes(16)],
            [b"", b"\x00" * (1 << 20)],
            [rng.randbytes(8)],
        ]
        for _ in endpoints:  # DEALER round-robins its peers: one message each
            with contextlib.suppress(zmq.Again):
                self._junk.send_multipart(rng.choice(choices), flags=zmq.NOBLOCK)
                self.garbage_sent += 1

    def _cont(self, pid: int) -> None:
        self._stopped.pop(pid, None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    def release(self) -> None:
        """SIGCONT every process still stopped (before the run stops its actors); close the junk socket;
        list in `chaos.jsonl` the faults the run ended before (nothing of a schedule is left out silently)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for hold in list(self._holds):
            hold.cancel()
        for fault in self.pending:
            line = {"time": round(time.time(), 3), **asdict(fault), "pid": 0, "on_moment": False}
            with open(self.run_dir / CHAOS_LOG, "a") as f:
                f.write(json.dumps({**line, "done": "not injected: the run ended first"}) + "\n")
        self.pending = []
        for pid, timer in list(self._stopped.items()):
            timer.cancel()
            self._cont(pid)
        if self._junk is not None:
            self._junk.close(0)
            self._junk = None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in self.injected:
            key = f"{line['kind']}.{line['target']}"
            out[key] = out.get(key, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        """What the run's summary says of its chaos."""
        return {
            "seed": self.schedule.seed,
            "faults": self.counts(),
            "injected": len(self.injected),
            "on_moment": sum(1 for x in self.injected if x["on_moment"] and x["moment"] != "any"),
            "garbage_sent": self.garbage_sent,
            "injector_failures": self.failures,
        }


def start_monkey(cfg: Any, mode: str, run_dir: Path, sup: Any, coord: Any, writer: Any, out: Any) -> Any:
    """The run's chaos monkey (`chaos.seed`), or None: its schedule drawn over the run's actors (the
    coordinator aside) and desktops, and only the moments the run has (a fault waits for its moment, up to
    `ChaosMonkey.MOMENT_WAIT_S`); the schedule is printed."""
    c = cfg.chaos
    if not c.seed:
        return None
    targets = [n for n in sup.actors if n != "coordinator"] + ["vm"]
    moments: tuple[str, ...] = ("any", "setup")
    if mode == "train":
        moments = ("any", "broadcast", "setup")
        moments += ("checkpoint",) if cfg.train.checkpoint_every else ()
        moments += ("eval",) if cfg.train.eval_every else ()
        moments += ("judging",) if "prm" in sup.actors else ()
    check_chaos(cfg)  # also checked when the config was loaded; a monkey never starts without it
    deadline = cfg.runtime.heartbeat_interval_s * cfg.runtime.heartbeat_liveness
    schedule = Schedule.generate(
        c.seed,
        targets=targets,
        n_faults=c.faults,
        span_s=c.span_s,
        moments=moments,
        n_busy=c.busy,
        busy_hold_s=(2 * deadline, 4 * deadline),
    )
    out.write(f"[{mode}] {schedule.describe()}\n")
    monkey = ChaosMonkey(schedule, run_dir, sup, coord, writer)
    monkey.start()
    return monkey


def _kill_a_desktop(run_dir: Path) -> int:
    """SIGKILL the session (bwrap) of one local desktop of the run: its pool sees it dead and replaces it."""
    for state in sorted((run_dir / "vms").glob("*/vm-*/vm.json")):
        try:
            pid = int(json.loads(state.read_text()).get("session") or 0)
        except (OSError, ValueError):
            continue
        if pid > 0 and str(state.parent) in cmdline(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                return pid
    return 0


# -- the invariants ---------------------------------------------------------------------------------------


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_run(run_dir: str | Path, *, updates: int | None = None, max_gap_s: float | None = None) -> dict:
    """The invariants of a finished train run (see the module docstring): `violations` (must be empty) and
    the figures they were checked on."""
    from guirl.learner.lineage import Lineage

    run = Path(run_dir)
    violations: list[str] = []
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    if not summary:
        violations.append("no summary.json: the run did not finish")
    elif updates is not None and summary.get("final_version") != updates:
        violations.append(f"the run ended at version {summary.get('final_version')}, not {updates}")
    failed = (summary.get("chaos") or {}).get("injector_failures")
    if failed:
        violations.append(f"the fault injector failed {failed} time(s): see the run's log")

    ledger = _jsonl(run / "episodes.jsonl")
    assigned = [x["episode_id"] for x in ledger if x["kind"] == "assigned"]
    ends: dict[str, list[dict]] = {}
    for x in ledger:
        if x["kind"] == "ended":
            ends.setdefault(x["episode_id"], []).append(x)
    if len(set(assigned)) != len(assigned):
        violations.append("an episode id was handed out twice")
    for eid in assigned:
        n = len(ends.get(eid, []))
        if n != 1:
            violations.append(f"episode {eid} has {n} end states")
    for eid in set(ends) - set(assigned):
        violations.append(f"episode {eid} ended without being handed out")
    faulted = {
        e for e, xs in ends.items() if any(x["status"] != "completed" or x.get("env_error") for x in xs)
    }
    for eid, xs in ends.items():
        if any(x.get("env_error") and (x["status"] == "completed" or x.get("score") is not None) for x in xs):
            violations.append(f"episode {eid} ended in an environment fault but was scored")

    recorded = Lineage.load(run)
    forks = recorded.forks if recorded is not None else []
    trained_at: dict[str, list[tuple[int, int]]] = {}  # episode -> the (epoch, version) updates that had it
    samples = 0

    def inherited(at: tuple[int, int], epoch: int) -> bool:
        """Update `at` is in the history of lineage `epoch` (not undone by a restart from an older
        checkpoint in between: then training the episode again is no second training)."""
        return at[0] == epoch or at[1] <= min(forks[at[0] + 1 : epoch + 1], default=at[1])

    for line in _jsonl(run / "trained.jsonl"):
        epoch, version = line["epoch"], line["version"]
        lineage = Lineage(forks[: epoch + 1]) if forks else None
        for eid, steps in line["episodes"].items():
            if any(inherited(at, epoch) for at in trained_at.get(eid, [])):
                violations.append(f"episode {eid} trained twice (again at version {version}, epoch {epoch})")
            trained_at.setdefault(eid, []).append((epoch, version))
            if eid in faulted:
                violations.append(f"episode {eid} ended in a fault but was trained at version {version}")
            for step_epoch, step_version in steps:
                samples += 1
                if lineage is not None and not lineage.holds(step_epoch, step_version, version - 1):
                    violations.append(
                        f"episode {eid}: a step of version {step_version} (epoch {step_epoch}) trained by "
                        f"update {version} of epoch {epoch}, outside the lineage {forks[: epoch + 1]}"
                    )

    times = sorted(
        float(rec["time"])
        for traj in run.glob("episodes/*/*/traj.jsonl")
        for rec in _jsonl(traj)
        if isinstance(rec.get("time"), (int, float))
    )
    gaps = [b - a for a, b in zip(times, times[1:])]
    max_gap = max(gaps, default=0.0)
    if max_gap_s is not None and max_gap > max_gap_s:
        violations.append(f"{max_gap:.1f} s without an env step (bound {max_gap_s:.1f} s)")
    gaps.sort()
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else 0.0
    return {
        "violations": violations,
        "episodes": len(assigned),
        "episodes_faulted": len(faulted),
        "episodes_trained": len(trained_at),
        "samples_trained": samples,
        "env_steps": len(times),
        "max_gap_s": round(max_gap, 2),
        "p99_gap_s": round(p99, 2),
        "learner_epochs": len(forks),
    }
