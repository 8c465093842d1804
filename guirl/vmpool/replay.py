"""The `replay` provider: desktops that replay a recorded run's episodes, at almost no cost.

A replayed desktop is a VM server (`replay_host.py`, one process hosting every desktop of a provider, each
on its own socket) that answers guirl's protocol — `/screenshot`, `/action`, `/screen_size`, `/health` —
from a recorded run directory (`episodes/<task>/<episode>/`: `step_NNN.png`, `final.png`, `traj.jsonl`,
`result.json`): the screen is the recorded one, and each step the policy acts (an `/action` that asks for
the screen after) moves it on to the next recorded screen, after `step_latency_s` (a real VM's time to
act and settle). So one process can host hundreds of desktops — for measuring guirl's control plane
(`bench/control_plane.py`) — and a recorded run can be played again against another policy cheaply.

A replayed desktop runs no program and keeps no files: task setup is not run (the recorded screens show
it done), and an episode is scored by the recording, not by the task's evaluator: an episode whose actions
are the recorded ones (same types, same keys and text, each point within `tolerance_px`) gets the recorded
score; one that left the recording cannot be scored here and ends as an environment error that says where
it left (`ReplayDiverged`) — never a policy failure. Which recorded episode a desktop plays is chosen when
an episode takes it (`bind`): the recorded episodes of its task, in turn by sample index. Tasks with no
recording are skipped before the run starts (`recorded_tasks`), and recorded episodes that cannot be
replayed (an environment error, a missing screen, a wrong screen size) are listed in `skipped`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import sys
import tempfile
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from PIL import Image as PILImage

from guirl.agent.actions import TERMINAL, AnyAction
from guirl.vmpool.provider import ProviderError

log = logging.getLogger(__name__)

POINT_FIELDS = ("x", "y", "to_x", "to_y")
"""An action's fields that are screen points, compared within a tolerance."""


class ReplayDiverged(ProviderError):
    """The episode's actions left the recorded ones: a replayed desktop cannot score it."""


@dataclass
class Recorded:
    """One recorded episode that can be replayed."""

    key: str  # "<task_id>/<episode_id>"
    task_id: str
    score: float
    outcome: str
    screens: list[Path]  # step_000.png .. step_{n-1}.png, then final.png
    actions: list[dict]  # every action the episode took, in order (terminal ones included)


@dataclass
class Recording:
    """A run directory's replayable episodes, by task, and the ones that cannot be replayed (and why)."""

    root: Path
    episodes: dict[str, list[Recorded]] = field(default_factory=dict)  # by task, sorted by episode id
    by_key: dict[str, Recorded] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # "<task>/<episode>" -> why
    size: tuple[int, int] | None = None  # the screens' (width, height)

    def tasks(self) -> set[str]:
        return set(self.episodes)

    def choose(self, task_id: str, sample: int) -> Recorded:
        """The recorded episode a desktop plays for (task, sample): the task's recordings in turn."""
        found = self.episodes.get(task_id)
        if not found:
            raise ProviderError(f"no replayable recording of task {task_id!r} in {self.root}")
        return found[sample % len(found)]


def load_recording(run_dir: str | Path, screen: tuple[int, int] | None = None) -> Recording:
    """The replayable episodes of `run_dir` (a run directory with `episodes/`). Only completed episodes
    with a score, a readable `traj.jsonl` and every recorded screen are kept, at the run's screen size
    (`screen`, else the first episode's); every other one is listed in `skipped` with its reason."""
    root = Path(run_dir)
    episodes_dir = root / "episodes"
    if not episodes_dir.is_dir():
        raise ProviderError(f"{root} is not a run directory (no episodes/): nothing to replay")
    rec = Recording(root=root, size=screen)
    for result_path in sorted(episodes_dir.glob("*/*/result.json")):
        folder = result_path.parent
        key = f"{folder.parent.name}/{folder.name}"
        try:
            recorded = _load_episode(folder, key, rec)
        except _Unusable as exc:
            rec.skipped[key] = str(exc)
            continue
        rec.episodes.setdefault(recorded.task_id, []).append(recorded)
        rec.by_key[key] = recorded
    if not rec.by_key:
        raise ProviderError(
            f"no replayable episode in {root} ({len(rec.skipped)} skipped: {_some(rec.skipped)})"
        )
    return rec


class _Unusable(Exception):
    pass


def _some(skipped: dict[str, str]) -> str:
    items = list(skipped.items())[:3]
    return "; ".join(f"{k}: {v}" for k, v in items) or "none found"


def _load_episode(folder: Path, key: str, rec: Recording) -> Recorded:
    try:
        result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _Unusable(f"result.json unreadable: {exc}") from None
    if not isinstance(result, dict):
        raise _Unusable("result.json is not an object")
    if result.get("status") != "completed" or result.get("env_error"):
        raise _Unusable(f"not a completed episode (status {result.get('status')!r})")
    score = result.get("score")
    if not isinstance(score, int | float) or isinstance(score, bool):
        raise _Unusable("no score")
    task_id = result.get("task_id")
    if task_id != folder.parent.name:
        raise _Unusable(f"its task_id {task_id!r} is not its folder's")
    steps: list[dict] = []
    try:
        for n, line in enumerate((folder / "traj.jsonl").read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict) or row.get("step") != len(steps):
                    raise _Unusable(f"traj.jsonl line {n} is not step {len(steps)}")
                steps.append(row)
    except (OSError, ValueError) as exc:
        raise _Unusable(f"traj.jsonl unreadable: {exc}") from None
    if not steps:
        raise _Unusable("no steps")
    actions: list[dict] = []
    screens: list[Path] = []
    for row in steps:
        acts = row.get("actions", [])
        if not isinstance(acts, list):
            raise _Unusable(f"step {row['step']}: actions is not a list")
        try:  # every recorded action must be a typed action (the verdict compares against them)
            typed = [msgspec.convert(a, AnyAction) for a in acts]
        except (msgspec.ValidationError, TypeError) as exc:
            raise _Unusable(f"step {row['step']}: not a typed action: {exc}") from None
        for action in typed:  # what the episode played: nothing after its terminal action
            actions.append(msgspec.to_builtins(action))
            if isinstance(action, TERMINAL):
                break
        screens.append(folder / f"step_{row['step']:03d}.png")
        if actions and actions[-1]["type"] in ("done", "fail"):
            break
    screens.append(folder / "final.png")
    for path in screens:  # every screen the desktop will show: there, an image, at the run's size
        if not path.is_file():
            raise _Unusable(f"{path.name} is missing")
        try:
            with PILImage.open(path) as img:  # the header only
                size = img.size
        except (PILImage.DecompressionBombError, OSError, ValueError, SyntaxError) as exc:
            raise _Unusable(f"{path.name} is not an image: {exc}") from None
        if rec.size is None:
            rec.size = size
        elif size != rec.size:
            raise _Unusable(
                f"{path.name} is {size[0]}x{size[1]}, the run's screens {rec.size[0]}x{rec.size[1]}"
            )
    return Recorded(
        key=key,
        task_id=task_id,
        score=float(score),
        outcome=str(result.get("outcome", "")),
        screens=screens,
        actions=actions,
    )


def same_action(played: dict, recorded: dict, tolerance_px: int) -> bool:
    """`played` is `recorded`: same type and fields, its points within `tolerance_px` of the recorded ones."""
    if played.keys() != recorded.keys():
        return False
    for key, value in recorded.items():
        other = played[key]
        if key in POINT_FIELDS and isinstance(value, int) and isinstance(other, int):
            if abs(value - other) > tolerance_px:
                return False
        elif other != value:
            return False
    return True


def verdict(recorded: Recorded, actions: list[Any], tolerance_px: int) -> float:
    """The recorded score of an episode that took the recorded actions, else `ReplayDiverged`."""
    played = [a if isinstance(a, dict) else msgspec.to_builtins(a) for a in actions]
    for i, (mine, theirs) in enumerate(zip(played, recorded.actions, strict=False)):
        if not same_action(mine, theirs, tolerance_px):
            raise ReplayDiverged(
                f"the policy left recording {recorded.key} at action {i}: "
                f"{_brief(mine)} where it recorded {_brief(theirs)}; a replayed desktop cannot score it"
            )
    if len(played) != len(recorded.actions):
        raise ReplayDiverged(
            f"the policy took {len(played)} actions where recording {recorded.key} took "
            f"{len(recorded.actions)}; a replayed desktop cannot score it"
        )
    return recorded.score


def _brief(action: dict) -> str:
    return json.dumps(action, separators=(",", ":"))[:120]


class ReplayProvider:
    """Desktops replaying `run_dir`'s episodes, hosted by one `replay_host` process this provider starts (on
    first use) and stops when closed. `step_latency_s`: seconds each step takes to act (give or take
    `step_jitter` of it)."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        screen: tuple[int, int] | None = None,
        step_latency_s: float = 0.0,
        step_jitter: float = 0.0,
        tolerance_px: int = 8,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.recording = load_recording(run_dir, screen)
        if self.recording.skipped:
            log.warning(
                "replay: %d recorded episode(s) of %s cannot be replayed (listed in pools/*.json): %s",
                len(self.recording.skipped),
                run_dir,
                _some(self.recording.skipped),
            )
        self.step_latency_s = step_latency_s
        self.step_jitter = step_jitter
        self.tolerance_px = tolerance_px
        self.start_timeout_s = start_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._dir: Path | None = None
        self._session: aiohttp.ClientSession | None = None
        self._start_lock = asyncio.Lock()
        self._bound: dict[str, Recorded] = {}  # vm id -> the recording it plays
        self._tasks: set[asyncio.Task] = set()
        self.counters = {"binds": 0, "scored": 0, "diverged": 0}

    # -- the host process ---------------------------------------------------------------------------

    async def _host(self) -> aiohttp.ClientSession:
        async with self._start_lock:
            if self._proc is not None and self._proc.returncode is None and self._session is not None:
                return self._session
            if self._proc is not None:
                raise ProviderError(f"the replay host exited ({self._proc.returncode})")
            # short (a unix socket's path has at most 107 bytes) and private (0700)
            self._dir = Path(tempfile.mkdtemp(prefix="guirl-replay-"))
            command = [
                sys.executable,
                "-m",
                "guirl.vmpool.replay_host",
                "--recording",
                str(self.recording.root),
                "--dir",
                str(self._dir),
                "--step-latency",
                str(self.step_latency_s),
                "--step-jitter",
                str(self.step_jitter),
            ]
            width, height = self.recording.size  # set: a recording has at least one replayable episode
            command += ["--width", str(width), "--height", str(height)]
            # stdin stays open while this process lives: the host ends when it closes (this process died)
            self._proc = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
            try:
                line = await asyncio.wait_for(self._proc.stdout.readline(), self.start_timeout_s)
                ready = json.loads(line) if line else {}
            except (TimeoutError, ValueError):
                ready = {}
            except BaseException:  # cancelled: no half-started host left behind
                await self._stop_host()
                raise
            if not isinstance(ready, dict) or not ready.get("ready"):
                code = self._proc.returncode
                await self._stop_host()
                why = f"exited with status {code}" if code is not None else "did not start"
                raise ProviderError(f"the replay host {why} within {self.start_timeout_s:.0f} s")
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(self._dir / "admin.sock")),
                timeout=aiohttp.ClientTimeout(total=30),
            )
            return self._session

    async def _admin(self, method: str, path: str, body: dict | None = None) -> Any:
        session = await self._host()
        try:
            async with session.request(method, "http://replay" + path, json=body) as resp:
                data = await resp.json(content_type=None)
                if resp.status >= 400:
                    raise ProviderError(
                        f"replay host: {method} {path}: {resp.status} {data.get('message', '')}"
                    )
                return data
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ProviderError(f"replay host: {method} {path}: {type(exc).__name__}: {exc}") from None

    async def _stop_host(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- the provider interface ---------------------------------------------------------------------

    async def create(self, tag: str) -> str:
        vm_id = f"replay-{uuid.uuid4().hex[:10]}"
        # until an episode binds it, a desktop shows the recording's first episode
        first = next(iter(self.recording.by_key.values()))
        await self._admin("POST", "/desktops", {"id": vm_id, "tag": tag, "screens": self._names(first)})
        return vm_id

    def _names(self, recorded: Recorded) -> list[str]:
        """`recorded`'s screens as the host takes them: paths relative to the recording."""
        return [str(p.relative_to(self.recording.root)) for p in recorded.screens]

    def address(self, vm_id: str) -> str:
        if self._dir is None:
            raise ProviderError("the replay host is not running")
        return f"unix://{self._dir / 'd' / (vm_id + '.sock')}"

    async def reset(self, vm_id: str) -> None:
        self._bound.pop(vm_id, None)
        await self._admin("POST", f"/desktops/{vm_id}/reset")

    async def delete(self, vm_id: str) -> None:
        self._bound.pop(vm_id, None)
        if self._proc is None or self._proc.returncode is not None:
            return  # the host (and every desktop) is gone
        with contextlib.suppress(ProviderError):
            await self._admin("DELETE", f"/desktops/{vm_id}")

    async def list(self, tag: str) -> list[str]:
        if self._proc is None:
            return []
        return list((await self._admin("GET", "/desktops?" + urllib.parse.urlencode({"tag": tag})))["ids"])

    async def close(self) -> None:
        """Stop the host (and with it every desktop)."""
        await self._stop_host()

    def alive(self, vm_id: str) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def kill(self, vm_id: str) -> None:
        """Fault injection: the desktop stops answering (its socket is closed), as a dead VM."""
        if self._proc is not None and self._proc.returncode is None:
            task = asyncio.get_running_loop().create_task(self._admin("POST", f"/desktops/{vm_id}/kill"))
            self._tasks.add(task)
            task.add_done_callback(self._killed)

    def _killed(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("replay: killing a desktop failed: %s", task.exception())

    # -- what a replayed desktop adds ---------------------------------------------------------------

    async def bind(self, vm_id: str, task_id: str, sample: int) -> str:
        """Have `vm_id` play a recorded episode of `task_id` from its first screen; returns the recording's
        key. A task with no recording is a `ProviderError`."""
        recorded = self.recording.choose(task_id, sample)
        await self._admin("POST", f"/desktops/{vm_id}/bind", {"screens": self._names(recorded)})
        self._bound[vm_id] = recorded
        self.counters["binds"] += 1
        return recorded.key

    def verdict(self, vm_id: str, actions: list[Any]) -> tuple[float, dict]:
        """The score of the episode `vm_id` just played (its actions, terminal ones included), and the record
        of how it was found; `ReplayDiverged` when it left the recording."""
        recorded = self._bound.get(vm_id)
        if recorded is None:
            raise ProviderError(f"desktop {vm_id} plays no recording (bind it first)")
        try:
            score = verdict(recorded, actions, self.tolerance_px)
        except ReplayDiverged:
            self.counters["diverged"] += 1
            raise
        self.counters["scored"] += 1
        return score, {"replayed": recorded.key, "actions": len(recorded.actions), "score": score}

    def metrics(self) -> dict[str, Any]:
        return {
            **self.counters,
            "recorded_episodes": len(self.recording.by_key),
            "recorded_tasks": len(self.recording.episodes),
            "skipped": dict(self.recording.skipped),
        }
