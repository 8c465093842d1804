"""`guirl view RUN_DIR`: a run directory as a static site in `RUN_DIR/view/` (see the package docstring).

Reading never changes the run: the site's pages, thumbnails and `build.json` are the only files written,
all under `view/`. Whatever cannot be read (a line that is not JSON, a result.json cut short, a screenshot
that is not a PNG) is listed on the run page under "Not shown", never silently dropped.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guirl.view import html as H
from guirl.view.html import esc, fmt, href, pct

SITE = "view"
THUMB_WIDTH = 160
_EVAL_ROUND = re.compile(r"^eval@([^/]+)/")

CURVES = (  # metrics.jsonl key, caption, as a share
    ("reward_mean", "reward (mean)", False),
    ("success_rate", "success (training episodes)", True),
    ("clipfrac", "clip fraction", True),
    ("approx_kl", "KL (approx., to the behaviour policy)", False),
    ("kl_ref", "KL to the reference", False),
    ("entropy", "entropy", False),
    ("version_lag_mean", "version lag (mean)", False),
    ("learner_idle_frac", "learner idle", True),
    ("prm.agreement", "PRM agreement with the outcome", True),
    ("prm.score_mean", "PRM score (mean)", False),
    ("grad_norm", "grad norm", False),
    ("update_s", "update time (s)", False),
)


def is_run(path: Path) -> bool:
    return any((path / n).exists() for n in ("summary.json", "episodes", "metrics.jsonl", "config.toml"))


def _read_json(path: Path, problems: list[str], root: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problems.append(f"{_rel(path, root)}: not readable as JSON ({type(exc).__name__})")
        return None


def _read_jsonl(path: Path, problems: list[str], root: Path, *, finished: bool = False) -> list[dict]:
    """The file's JSON objects; lines that are not are counted into `problems` (the last line of a file still
    being written may be cut short: not counted, unless the file is `finished`)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        problems.append(f"{_rel(path, root)}: {exc}")
        return []
    out, bad = [], 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            # the last line of a file still being written may be cut short: not a problem yet
            if i < len(lines) - 1 or text.endswith("\n") or finished:
                bad += 1
            continue
        if isinstance(value, dict):
            out.append(value)
        else:
            bad += 1
    if bad:
        problems.append(f"{_rel(path, root)}: {bad} line(s) not JSON objects, left out")
    return out


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def png_size(path: Path) -> tuple[int, int] | None:
    """The width and height in a PNG's header (None: not a PNG)."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except (OSError, ValueError):  # ValueError: a name with a NUL in it
        return None
    if len(head) < 24 or not head.startswith(b"\x89PNG\r\n\x1a\n") or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


@dataclass
class Episode:
    task_id: str
    episode_id: str
    folder: Path
    result: dict[str, Any]
    assigned: dict[str, Any]

    @property
    def status(self) -> str:
        if not self.result:
            return "in flight" if not (self.folder / "result.json").exists() else "unreadable"
        return str(self.result.get("status") or "")

    @property
    def outcome(self) -> str:
        if self.result.get("env_error"):
            return "env_error"
        return str(self.result.get("outcome") or self.status)

    @property
    def score(self) -> float | None:
        s = self.result.get("score")
        return float(s) if isinstance(s, int | float) and not isinstance(s, bool) else None

    @property
    def eval_round(self) -> str | None:
        m = _EVAL_ROUND.match(str(self.assigned.get("group_id") or ""))
        return m.group(1) if m else None

    @functools.cached_property
    def thumb_source(self) -> Path | None:
        """The screen a list shows for it: the final one, else its last step's (looked up once)."""
        final = self.folder / "final.png"
        if final.exists():
            return final
        shots = sorted(self.folder.glob("step_*.png"))
        return shots[-1] if shots else None

    @property
    def page(self) -> str:
        return href("e", self.task_id, self.episode_id) + ".html"

    @property
    def thumb(self) -> str:
        return href("thumbs", self.task_id, self.episode_id) + ".jpg"


@dataclass
class Run:
    root: Path
    name: str
    problems: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    sft: list[dict] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    advantages: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    config: str = ""
    ledger: list[dict] = field(default_factory=list)
    """episodes.jsonl: every episode handed out and its end (read once: the task data and the curves)."""

    @property
    def mode(self) -> str:
        return str(self.summary.get("mode") or ("train" if self.metrics else "sft" if self.sft else "eval"))

    def by_task(self) -> dict[str, list[Episode]]:
        out: dict[str, list[Episode]] = defaultdict(list)
        for ep in self.episodes:
            out[ep.task_id].append(ep)
        return out


def load_run(root: Path) -> Run:
    """Everything the site shows, read once."""
    run = Run(root=root, name=root.name)
    p = run.problems
    summary = _read_json(root / "summary.json", p, root)
    run.summary = summary if isinstance(summary, dict) else {}
    run.metrics = _read_jsonl(root / "metrics.jsonl", p, root)
    run.evals = _read_jsonl(root / "eval.jsonl", p, root)
    run.sft = _read_jsonl(root / "sft.jsonl", p, root)
    try:
        run.config = (root / "config.toml").read_text(errors="replace")
    except OSError:
        run.config = ""
    assigned: dict[str, dict] = {}
    run.ledger = _read_jsonl(root / "episodes.jsonl", p, root)
    for line in run.ledger:
        if line.get("kind") == "assigned" and isinstance(line.get("episode_id"), str):
            assigned[line["episode_id"]] = line
    for line in _read_jsonl(root / "advantages.jsonl", p, root):
        step = line.get("step")
        if isinstance(line.get("episode_id"), str) and isinstance(step, int):
            run.advantages.setdefault((line["episode_id"], step), []).append(line)
    episodes_dir = root / "episodes"
    try:
        tasks = [e for e in os.scandir(episodes_dir) if e.is_dir()]
    except FileNotFoundError:
        tasks = []
    except OSError as exc:
        p.append(f"episodes/: {exc}")
        tasks = []
    for task in sorted(tasks, key=lambda e: e.name):
        if not _plain_name(task.name):
            p.append(f"episodes/{task.name!r}: a task folder whose name is not UTF-8 text, left out")
            continue
        for ep in sorted((e for e in os.scandir(task.path) if e.is_dir()), key=lambda e: e.name):
            if not _plain_name(ep.name):
                p.append(
                    f"episodes/{task.name}/{ep.name!r}: an episode folder whose name is not UTF-8, left out"
                )
                continue
            folder = Path(ep.path)
            result = _read_json(folder / "result.json", p, root)
            if result is not None and not isinstance(result, dict):
                p.append(f"{_rel(folder / 'result.json', root)}: not a JSON object")
                result = None
            run.episodes.append(Episode(task.name, ep.name, folder, result or {}, assigned.get(ep.name, {})))
    return run


def _plain_name(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes, kept by Python as surrogates
        return False
    return True


def _results(run: Run) -> list[dict]:
    """The summary's per-task results that can be shown (a task id and an episode id as text)."""
    results = run.summary.get("results")
    if not isinstance(results, list):
        return []
    return [
        r
        for r in results
        if isinstance(r, dict)
        and isinstance(r.get("task_id"), str)
        and isinstance(r.get("episode_id"), str | type(None))
    ]


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _strs(v: Any) -> list[str]:
    """A list of things to show as text (anything else: nothing)."""
    return [str(x) for x in v] if isinstance(v, list) else []


VIEW_CODE = hashlib.sha1(
    b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))
).hexdigest()[:12]
"""The viewer's own code, in every kept page's signature: a new guirl writes every page again."""


# -- building ----------------------------------------------------------------------------------------------


@dataclass
class Built:
    site: Path
    pages: int = 0
    pages_reused: int = 0
    thumbs: int = 0
    episodes: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    children: list[Path] = field(default_factory=list)

    def line(self) -> str:
        extra = f", {len(self.problems)} thing(s) not shown (listed on the run page)" if self.problems else ""
        return (
            f"[view] {self.site / 'index.html'}: {self.episodes} episodes, {self.pages} pages written "
            f"({self.pages_reused} unchanged), {self.thumbs} thumbnails, {self.seconds:.1f} s{extra}"
        )


class _Writer:
    """Writes the site's files (each atomically) and remembers, per page, what it was made from (its
    signature), the build that last wrote it (`build.json`'s `written`, which an open page compares with its
    own `data-generation` to reload) and what could not be shown on it (listed again when it is kept)."""

    def __init__(self, site: Path, previous: dict[str, Any]) -> None:
        self.site = site
        self.signatures: dict[str, Any] = {}
        self.problems: dict[str, list[str]] = {}
        old = previous.get("signatures")
        self.old: dict[str, Any] = old if isinstance(old, dict) else {}
        old_problems = previous.get("page_problems")
        self.old_problems: dict[str, Any] = old_problems if isinstance(old_problems, dict) else {}
        old_written = previous.get("written")
        self.written_at: dict[str, int] = old_written if isinstance(old_written, dict) else {}
        # milliseconds: above every stamp an earlier build wrote, even when build.json was lost
        self.generation = max(int(time.time() * 1000), _int(previous.get("generation")) + 1)
        self.touched: set[str] = set()
        self.written = 0
        self.reused = 0

    def keep(self, rel: str, signature: Any) -> bool:
        """The page is there and what it is made of did not change: kept as it is (True)."""
        stamped = rel in self.written_at or not rel.endswith(".html")
        if self.old.get(rel) == signature and stamped and (self.site / rel).exists():
            self.touched.add(rel)
            self.signatures[rel] = signature
            self.problems[rel] = _strs(self.old_problems.get(rel))
            self.reused += 1
            return True
        return False

    def write(self, rel: str, text: str, signature: Any = None, problems: list[str] | None = None) -> None:
        """Write a page unless it is there as it would be written (its inputs' signature, or else a hash of
        its text): an open page reloads only when its own content changed."""
        path = self.site / rel
        if signature is None:
            signature = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
        if self.keep(rel, signature):
            return
        self.touched.add(rel)
        self.signatures[rel] = signature
        self.problems[rel] = list(problems or [])
        if rel.endswith(".html"):
            text = text.replace(
                "<body ", f'<body data-page="{esc(rel)}" data-generation="{self.generation}" ', 1
            )
            self.written_at[rel] = self.generation
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(text.encode("utf-8", "replace"))  # a lone surrogate from a run's JSON: "?"
        os.replace(tmp, path)
        self.written += 1

    def render(self, rel: str, make: Any, signature: Any = None) -> list[str]:
        """Write the page `make(problems)` returns; a page that cannot be made (data no reader foresaw) is
        written as the error, and listed. Returns what could not be shown on it."""
        if signature is not None and self.keep(rel, signature):
            return self.problems[rel]
        problems: list[str] = []
        try:
            text = make(problems)
        except Exception as exc:  # noqa: BLE001  (whatever a run holds, the rest of the site is built)
            problems.append(f"view/{rel}: could not be made: {type(exc).__name__}: {exc}")
            text = H.page(rel, f"<div class='box error'>{esc(problems[-1])}</div>", root="", run_name=rel)
        self.write(rel, text, signature, problems)
        return problems

    def prune(self) -> None:
        """Pages an earlier build wrote that this one did not (a compare page not asked for again, an
        episode folder removed) are removed."""
        for rel in [r for r in self.written_at if r not in self.touched]:
            del self.written_at[rel]
            (self.site / rel).unlink(missing_ok=True)


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _folder_sig(folder: Path) -> list[Any]:
    """Every file of an episode folder (not its cache/), with its size and modification time."""
    out = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    for e in entries:
        try:
            if e.is_file():
                st = e.stat()
                out.append([e.name, st.st_mtime_ns, st.st_size])
        except OSError:
            out.append([e.name, None])
    return out


def build(
    run_dir: str | Path,
    *,
    compare: str | Path | None = None,
    versions: tuple[str, str] | None = None,
) -> Built:
    """Write (or bring up to date) the site of `run_dir`; a folder of runs (`guirl learn`'s) gets a site per
    run and an index of them."""
    started = time.monotonic()
    root = Path(run_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such directory")
    if not is_run(root):
        children = [c for c in sorted(root.iterdir()) if c.is_dir() and c.name != SITE and is_run(c)]
        if not children:
            raise FileNotFoundError(
                f"{run_dir}: not a run directory (no summary.json, episodes/, metrics.jsonl or config.toml) "
                "and no run inside it"
            )
        if compare is not None or versions is not None:
            raise ValueError(f"{run_dir} is a folder of runs: --compare and --versions take one run")
        out = Built(site=root / SITE)
        for child in children:
            sub = build(child)
            out.children.append(child)
            out.pages += sub.pages
            out.pages_reused += sub.pages_reused
            out.thumbs += sub.thumbs
            out.episodes += sub.episodes
            out.problems += [f"{child.name}/{p}" for p in sub.problems]
        previous = _previous(out.site)
        w = _Writer(out.site, previous)
        _assets(w)
        out.problems += w.render("index.html", lambda problems: _group_page(root, children, problems))
        out.pages += w.written
        out.pages_reused += w.reused
        _finish(out, w, started)
        return out
    other_root = Path(compare).resolve() if compare is not None else None
    if other_root is not None and not is_run(other_root):
        raise FileNotFoundError(f"{compare}: not a run directory")
    if other_root == root:
        raise ValueError(f"{compare}: the run itself (--compare takes another run)")
    run = load_run(root)
    rounds = _eval_rounds(run)
    if versions is not None:
        missing = [v for v in versions if v not in rounds]
        if missing:
            raise ValueError(
                f"no evaluation round at version(s) {', '.join(missing)} in {run.name} "
                f"(there are: {', '.join(rounds) or 'none'})"
            )
    elif other_root is None and len(rounds) >= 2:
        keys = list(rounds)
        versions = (keys[0], keys[-1])
    site = root / SITE
    previous = _previous(site)
    w = _Writer(site, previous)
    _assets(w)
    out = Built(site=site, episodes=len(run.episodes))
    out.thumbs = _thumbs(run, site)
    credited = Counter(eid for (eid, _), lines in run.advantages.items() for _ in lines)
    for ep in run.episodes:
        sig = [VIEW_CODE, _folder_sig(ep.folder), credited[ep.episode_id], ep.assigned.get("group_id")]
        rel = f"e/{ep.task_id}/{ep.episode_id}.html"
        run.problems += w.render(rel, lambda problems, ep=ep: _episode_page(run, ep, problems), signature=sig)
    by_task = run.by_task()
    for task_id, eps in by_task.items():
        run.problems += w.render(
            f"t/{task_id}.html", lambda problems, t=task_id, e=eps: _task_page(run, t, e)
        )
    run.problems += w.render("tasks.html", lambda problems: _tasks_page(run, by_task))
    if other_root is not None:
        other_built = build(other_root)
        out.problems += [f"{other_root.name}/{p}" for p in other_built.problems]
        other = load_run(other_root)
        up = Path(os.path.relpath(other_root / SITE, site))
        prefix = href(*up.parts) + "/"
        run.problems += w.render(
            "compare.html",
            lambda problems: _compare_page(
                run, run.name, _final_per_task(run), other.name, _final_per_task(other), b_prefix=prefix
            ),
        )
    elif versions is not None:
        a, b = versions
        run.problems += w.render(
            "compare.html",
            lambda problems: _compare_page(
                run, f"version {a}", _latest(rounds[a]), f"version {b}", _latest(rounds[b])
            ),
        )
    has_compare = "compare.html" in w.touched
    # the run page last: it lists what every other page could not show
    run.problems += w.render("index.html", lambda problems: _run_page(run, has_compare=has_compare))
    w.prune()
    out.pages = w.written
    out.pages_reused = w.reused
    out.problems = run.problems + out.problems
    _finish(out, w, started)
    return out


def _previous(site: Path) -> dict[str, Any]:
    try:
        prev = json.loads((site / "build.json").read_text())
        return prev if isinstance(prev, dict) else {}
    except (OSError, ValueError):
        return {}


def _finish(out: Built, w: _Writer, started: float) -> None:
    out.seconds = time.monotonic() - started
    doc = {
        "generation": w.generation,
        "built_at": round(time.time(), 3),
        "seconds": round(out.seconds, 3),
        "episodes": out.episodes,
        "pages_written": out.pages,
        "pages_unchanged": out.pages_reused,
        "not_shown": out.problems,
        "signatures": w.signatures,
        "page_problems": {rel: found for rel, found in w.problems.items() if found},
        "written": {rel: g for rel, g in w.written_at.items() if (out.site / rel).exists()},
    }
    out.site.mkdir(parents=True, exist_ok=True)
    tmp = out.site / ".build.json.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out.site / "build.json")


def _assets(w: _Writer) -> None:
    w.write("assets/view.css", H.CSS)
    w.write("assets/view.js", H.JS)


def _thumbs(run: Run, site: Path) -> int:
    """A small JPEG per episode (the final screen) for the lists, made only when missing or out of date."""
    jobs = []
    for ep in run.episodes:
        src = ep.thumb_source
        if src is None:
            continue
        dst = site / "thumbs" / ep.task_id / f"{ep.episode_id}.jpg"
        try:
            if dst.exists() and dst.stat().st_mtime_ns >= src.stat().st_mtime_ns:
                continue
        except OSError:
            continue
        jobs.append((ep, src, dst))
    if not jobs:
        return 0

    def one(job: tuple[Episode, Path, Path]) -> str | None:
        from PIL import Image, UnidentifiedImageError

        ep, src, dst = job
        try:
            with Image.open(src) as img:
                img.thumbnail((THUMB_WIDTH, THUMB_WIDTH), Image.Resampling.BILINEAR)
                dst.parent.mkdir(parents=True, exist_ok=True)
                img.convert("RGB").save(dst, "JPEG", quality=70)
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            return f"{_rel(src, run.root)}: no thumbnail ({type(exc).__name__})"
        return None

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        failed = [msg for msg in pool.map(one, jobs) if msg]
    run.problems += failed
    return len(jobs) - len(failed)


# -- the run page ------------------------------------------------------------------------------------------

NAV = (("run", "index.html"), ("tasks", "tasks.html"))


def _nav(has_compare: bool = False) -> tuple[tuple[str, str], ...]:
    return (*NAV, ("compare", "compare.html")) if has_compare else NAV


def _run_page(run: Run, has_compare: bool) -> str:
    s = run.summary
    parts = [f"<h1>{esc(run.name)}</h1>"]
    cards = [("mode", run.mode)]
    for key, label, spec in (
        ("tasks", "tasks", ""),
        ("accuracy", "accuracy", "pct"),
        ("episodes", "episodes", ""),
        ("env_errors", "environment errors", ""),
        ("aborted", "aborted", ""),
        ("updates", "updates", ""),
        ("final_version", "final version", ""),
        ("env_utilisation", "env utilisation", "pct"),
        ("learner_idle_frac", "learner idle", "pct"),
        ("seconds", "seconds", ".0f"),
    ):
        if key in s:
            cards.append((label, pct(s[key]) if spec == "pct" else fmt(s[key], spec)))
    if not s:
        cards.append(
            ("summary", "not written yet" if not (run.root / "summary.json").exists() else "unreadable")
        )
    cards.append(("episodes on disk", str(len(run.episodes))))
    parts.append(
        "<div class=cards>"
        + "".join(f"<div class=card><span class=muted>{esc(k)}</span><b>{esc(v)}</b></div>" for k, v in cards)
        + "</div>"
    )
    parts.append(_plots(run))
    parts.append(_domains(run))
    parts.append(_grounding(s.get("grounding")))
    parts.append(_faults(run))
    scalars = [(k, v) for k, v in s.items() if not isinstance(v, list | dict)]
    if scalars:
        parts.append("<h2>Summary</h2>" + H.kv(scalars))
        shown = {k: v for k, v in s.items() if k != "results"}  # the results are the task table
        parts.append(
            "<details><summary>summary.json (its results: the task table)</summary><pre>"
            + esc(json.dumps(shown, indent=1)[:200_000])
            + "</pre></details>"
        )
    if run.config:
        parts.append(
            f"<h2>Configuration</h2><details><summary>config.toml</summary><pre>{esc(run.config)}</pre>"
        )
        parts.append("</details>")
    if run.problems:
        parts.append(
            "<h2 id=not-shown>Not shown</h2><div class='box error'><ul>"
            + "".join(f"<li>{esc(p)}</li>" for p in run.problems)
            + "</ul></div>"
        )
    return H.page(run.name, "".join(parts), root="", run_name=run.name, nav=_nav(has_compare))


def _env_utilisation(run: Run) -> list[tuple[float, float]]:
    """Per update: the share of slot time spent in episodes between it and the one before, from
    episodes.jsonl's hand-outs and ends (slots: the most episodes ever in flight at once)."""
    spans: dict[str, list[float]] = {}
    for line in run.ledger:
        t, eid = line.get("time"), line.get("episode_id")
        if not isinstance(t, int | float) or not isinstance(eid, str):
            continue
        if line.get("kind") == "assigned":
            spans[eid] = [t, t]
        elif line.get("kind") == "ended" and eid in spans:
            spans[eid][1] = t
    if not spans or not run.metrics:
        return []
    events = sorted([(a, 1) for a, _ in spans.values()] + [(b, -1) for _, b in spans.values()])
    live = slots = 0
    for _, d in events:
        live += d
        slots = max(slots, live)
    if slots == 0:
        return []
    out = []
    prev = min(a for a, _ in spans.values())
    for m in run.metrics:
        t, v = m.get("time"), m.get("version")
        if not isinstance(t, int | float) or not isinstance(v, int | float) or t <= prev:
            continue
        busy = sum(max(0.0, min(b, t) - max(a, prev)) for a, b in spans.values())
        out.append((float(v), min(1.0, busy / (slots * (t - prev)))))
        prev = t
    return out


def _plots(run: Run) -> str:
    plots = []
    if run.evals:
        acc = [(e.get("version"), e.get("accuracy")) for e in run.evals]
        plots.append(
            H.line_plot("eval_accuracy", "held-out success (greedy)", [("success", acc)], percent=True)
        )
    for key, caption, share in CURVES:
        pts = [(m.get("version"), m.get(key)) for m in run.metrics if key in m]
        if pts:
            plots.append(H.line_plot(key, caption, [(caption, pts)], percent=share))
    util = _env_utilisation(run) if run.metrics else []
    if util:
        plots.append(H.line_plot("env_utilisation", "env utilisation", [("env", util)], percent=True))
    if run.sft:
        pts = [(i + 1, line.get("nll")) for i, line in enumerate(run.sft)]
        plots.append(H.line_plot("sft_nll", "behaviour cloning: nll", [("nll", pts)], x_label="step"))
    plots = [p for p in plots if p]
    if not plots:
        return ""
    return "<h2>Training curves</h2><div class=plots>" + "".join(plots) + "</div>"


def _domains(run: Run) -> str:
    domains = run.summary.get("domains")
    out = ""
    if isinstance(domains, dict) and domains:
        rows = []
        for name, d in domains.items():
            if not isinstance(d, dict):
                continue
            rows.append(
                "<tr>"
                + H.td(name)
                + "".join(
                    H.td(fmt(d.get(k)), num=True)
                    for k in ("tasks", "scored", "success", "skipped", "aborted")
                )
                + H.td(pct(d.get("accuracy")), num=True, sort=d.get("accuracy"))
                + "</tr>"
            )
        out += "<h2>Accuracy per domain</h2>" + H.table(
            ("domain", "tasks", "scored", "success", "skipped", "aborted", "accuracy"), rows, sortable=True
        )
    if run.evals:
        names = sorted(
            {str(d) for e in run.evals if isinstance(e.get("domains"), dict) for d in e["domains"]}
        )
        rows = []
        for e in run.evals:
            doms = e.get("domains") if isinstance(e.get("domains"), dict) else {}
            rows.append(
                "<tr>"
                + H.td(fmt(e.get("version")), num=True)
                + H.td(fmt(e.get("scored")), num=True)
                + H.td(pct(e.get("accuracy")), num=True)
                + "".join(H.td(pct(doms.get(n)), num=True) for n in names)
                + "</tr>"
            )
        out += "<h2>Evaluations per policy version</h2>" + H.table(
            ("version", "scored", "success", *names), rows
        )
    return out


def _grounding(g: Any) -> str:
    if not isinstance(g, dict) or not g:
        return ""
    keys = ("rows", "step_success", "type_accuracy", "grounding_accuracy", "text_accuracy", "format_rate")
    rows = []
    for domain, d in g.items():
        if isinstance(d, dict):
            cells = [H.td(fmt(d.get("rows")), num=True)] + [H.td(pct(d.get(k)), num=True) for k in keys[1:]]
            rows.append("<tr>" + H.td(domain) + "".join(cells) + "</tr>")
    return "<h2>Grounding (GUI-R1 rows)</h2>" + H.table(("domain", *keys), rows)


def _faults(run: Run) -> str:
    """Environment errors, aborted tasks and skipped tasks, each apart from the policy's failures."""
    out = []
    errors = [ep for ep in run.episodes if ep.result.get("env_error")]
    rows = [
        "<tr>"
        + H.td(f'<a href="{ep.page}">{esc(ep.episode_id)}</a>', raw=True)
        + H.td(ep.task_id)
        + H.td(fmt(ep.result.get("attempt")), num=True)
        + H.td(ep.status)
        + H.td(ep.result.get("env_error"))
        + "</tr>"
        for ep in errors
    ]
    out.append(
        f"<h2 id=env-errors>Environment errors ({len(errors)})</h2>"
        + (
            "<p class=muted>Faults of the environment, never scored as the policy's: each episode was played "
            "again (a new episode id) up to the retry limit.</p>"
            + H.table(("episode", "task", "attempt", "status", "error"), rows)
            if errors
            else "<p class=muted>none</p>"
        )
    )
    aborted = [r for r in _results(run) if r.get("status") == "aborted"]
    if aborted or "aborted" in run.summary:
        rows = [
            "<tr>"
            + H.td(r.get("task_id"))
            + H.td(fmt(r.get("attempts")), num=True)
            + H.td("; ".join(_strs(r.get("env_errors")))[:600])
            + "</tr>"
            for r in aborted
        ]
        out.append(
            f"<h2 id=aborted>Aborted tasks ({len(aborted)})</h2>"
            + (
                "<p class=muted>Every attempt ended in an environment error: not scored, not counted in the "
                "accuracy.</p>" + H.table(("task", "attempts", "errors"), rows)
                if aborted
                else "<p class=muted>none</p>"
            )
        )
    skipped = run.summary.get("skipped") if isinstance(run.summary.get("skipped"), list) else []
    if skipped or "skipped" in run.summary:
        rows = [
            "<tr>"
            + H.td(r.get("task_id", r) if isinstance(r, dict) else r)
            + H.td(r.get("domain", "") if isinstance(r, dict) else "")
            + H.td(r.get("reason", "") if isinstance(r, dict) else "")
            + "</tr>"
            for r in skipped
        ]
        out.append(
            f"<h2 id=skipped>Skipped tasks ({len(skipped)})</h2>"
            + (H.table(("task", "domain", "reason"), rows) if skipped else "<p class=muted>none</p>")
        )
    return "".join(out)


# -- the task table and task pages -------------------------------------------------------------------------


def _final_per_task(run: Run) -> dict[str, Episode]:
    """Each task's deciding episode: the summary's (an eval's final result), else its latest scored one."""
    by_id = {ep.episode_id: ep for ep in run.episodes}
    out: dict[str, Episode] = {}
    for r in _results(run):
        if r.get("episode_id") in by_id:
            out[r["task_id"]] = by_id[r["episode_id"]]
    for task_id, eps in run.by_task().items():
        if task_id not in out:
            out[task_id] = _latest(eps)[task_id] if eps else None  # type: ignore[assignment]
    return {k: v for k, v in out.items() if v is not None}


def _latest(eps: list[Episode]) -> dict[str, Episode]:
    """Per task, its last scored episode (else its last one)."""
    out: dict[str, Episode] = {}
    for ep in sorted(
        eps, key=lambda e: (e.score is not None, _num(e.result.get("ended_at")) or 0.0, e.episode_id)
    ):
        out[ep.task_id] = ep
    return out


def _eval_rounds(run: Run) -> dict[str, list[Episode]]:
    rounds: dict[str, list[Episode]] = defaultdict(list)
    for ep in run.episodes:
        r = ep.eval_round
        if r is not None:
            rounds[r].append(ep)

    def order(k: str) -> tuple:
        # `V`, or `VeE` for a restarted learner's lineage epoch E: by epoch, then version
        m = re.fullmatch(r"(\d+)(?:e(\d+))?", k)
        return (int(m.group(2) or 0), int(m.group(1)), k) if m else (1 << 30, 0, k)

    return {k: rounds[k] for k in sorted(rounds, key=order)}


def _tasks_page(run: Run, by_task: dict[str, list[Episode]]) -> str:
    finals = _final_per_task(run)
    results = {r["task_id"]: r for r in _results(run)}
    outcomes_all: Counter[str] = Counter()
    rows = []
    for task_id in sorted(set(by_task) | {k for k in results if isinstance(k, str)}):
        eps = by_task.get(task_id, [])
        final = finals.get(task_id)
        scored = [ep.score for ep in eps if ep.score is not None and ep.status != "retried"]
        outcomes = Counter(ep.outcome for ep in eps)
        r = results.get(task_id) or {}
        if r.get("status") == "aborted":
            outcomes["aborted"] += 1
        outcomes_all.update(outcomes)
        steps = [ep.result.get("steps") for ep in eps if isinstance(ep.result.get("steps"), int)]
        attempts = (
            r.get("attempts")
            if isinstance(r.get("attempts"), int)
            else 1
            + max(
                (ep.result.get("attempt") or 0 for ep in eps if isinstance(ep.result.get("attempt"), int)),
                default=0,
            )
        )
        score = r.get("score") if "score" in r else (sum(scored) / len(scored) if scored else None)
        domain = (final.result.get("domain") if final else None) or r.get("domain") or ""
        thumb = (
            f'<a href="{final.page}"><img class=thumb loading=lazy src="{final.thumb}" alt=""></a>'
            if final and final.thumb_source
            else ""
        )
        outcome_text = ", ".join(f"{k} {v}" if len(eps) > 1 else k for k, v in sorted(outcomes.items()))
        rows.append(
            f'<tr data-outcomes="{esc(" ".join(outcomes))}">'
            + H.td(thumb, raw=True)
            + H.td(f'<a href="{href("t", task_id)}.html">{esc(task_id)}</a>', raw=True, sort=task_id)
            + H.td(domain)
            + H.td(len(eps), num=True)
            + H.td(outcome_text or r.get("status", ""))
            + H.td(fmt(score, ".2f") if isinstance(score, int | float) else "–", num=True, sort=score)
            + H.td(fmt(sum(steps) / len(steps), ".1f") if steps else "–", num=True)
            + H.td(fmt(attempts), num=True)
            + H.td(sum(1 for ep in eps if ep.result.get("env_error")), num=True)
            + "</tr>"
        )
    options = "".join(
        f'<option value="{esc(o)}">{esc(o)} ({n})</option>' for o, n in sorted(outcomes_all.items())
    )
    body = (
        "<h1>Tasks</h1><div class=filters>"
        "<input id=filter type=search placeholder='filter: task, domain, outcome'>"
        f"<select id=outcome><option value=''>every outcome</option>{options}</select>"
        f"<span class=muted><span id=shown>{len(rows)}</span> of {len(rows)} tasks · click a heading to sort"
        "</span></div>"
        + H.table(
            ("", "task", "domain", "episodes", "outcome", "score", "steps", "attempts", "env errors"),
            rows,
            cls="filterable",
            sortable=True,
            attrs="id=tasks",
        )
    )
    return H.page(f"{run.name}: tasks", body, root="", run_name=run.name, nav=_nav())


def _task_page(run: Run, task_id: str, eps: list[Episode]) -> str:
    rows = []
    for ep in eps:
        thumb = f'<img class=thumb loading=lazy src="../{ep.thumb}" alt="">' if ep.thumb_source else ""
        versions = ep.result.get("policy_versions") or []
        rows.append(
            f'<tr data-outcomes="{esc(ep.outcome)}">'
            + H.td(f'<a href="../{ep.page}">{thumb}</a>', raw=True)
            + H.td(f'<a href="../{ep.page}">{esc(ep.episode_id)}</a>', raw=True, sort=ep.episode_id)
            + H.td(ep.status)
            + H.td(ep.outcome)
            + H.td(fmt(ep.score, ".2f"), num=True, sort=ep.score)
            + H.td(fmt(ep.result.get("steps")), num=True)
            + H.td(fmt(ep.result.get("attempt")), num=True)
            + H.td("eval @" + ep.eval_round if ep.eval_round else ("eval" if ep.assigned.get("eval") else ""))
            + H.td(", ".join(map(str, versions)) if isinstance(versions, list) else "")
            + H.td(fmt(ep.result.get("seconds"), ".1f"), num=True)
            + "</tr>"
        )
    body = f"<h1>{esc(task_id)}</h1>" + H.table(
        ("", "episode", "status", "outcome", "score", "steps", "attempt", "kind", "versions", "seconds"),
        rows,
        sortable=True,
    )
    return H.page(f"{task_id}", body, root="../", run_name=run.name, nav=_nav())


# -- the episode page --------------------------------------------------------------------------------------


def _episode_page(run: Run, ep: Episode, problems: list[str]) -> str:
    from guirl.view.episode import episode_body

    body = episode_body(run, ep, problems)
    return H.page(f"{ep.episode_id} · {ep.task_id}", body, root="../../", run_name=run.name, nav=_nav())


# -- compare -----------------------------------------------------------------------------------------------


def _compare_page(
    run: Run,
    a_name: str,
    a: dict[str, Episode],
    b_name: str,
    b: dict[str, Episode],
    *,
    b_prefix: str = "",
) -> str:
    both = sorted(set(a) & set(b))
    only = sorted(set(a) ^ set(b))

    def solved(ep: Episode | None) -> bool:
        return ep is not None and ep.score is not None and ep.score >= 1.0

    counts = Counter((solved(a[t]), solved(b[t])) for t in both)
    rows = []
    for t in both:
        ea, eb = a[t], b[t]
        change = "same"
        if ea.score is not None and eb.score is not None and ea.score != eb.score:
            change = "better" if eb.score > ea.score else "worse"
        elif (ea.score is None) != (eb.score is None):
            change = "not comparable"
        cls = {"better": "ok", "worse": "bad"}.get(change, "muted")
        rows.append(
            f'<tr data-outcomes="{esc(change)}">'
            + H.td(t)
            + H.td(
                f'<a href="{ea.page}"><img class=thumb loading=lazy src="{ea.thumb}" alt=""></a>', raw=True
            )
            + H.td(f"{ea.outcome} · {fmt(ea.score, '.2f')} · {fmt(ea.result.get('steps'))} steps")
            + H.td(
                f'<a href="{b_prefix}{eb.page}">'
                f'<img class=thumb loading=lazy src="{b_prefix}{eb.thumb}" alt=""></a>',
                raw=True,
            )
            + H.td(f"{eb.outcome} · {fmt(eb.score, '.2f')} · {fmt(eb.result.get('steps'))} steps")
            + H.td(f"<span class={cls}>{esc(change)}</span>", raw=True, sort=change)
            + "</tr>"
        )

    def acc(eps: dict[str, Episode]) -> str:
        scored = [e.score for t, e in eps.items() if t in both and e.score is not None]
        return pct(sum(scored) / len(scored)) if scored else "–"

    body = (
        f"<h1>Compare: {esc(a_name)} → {esc(b_name)}</h1>"
        f"<div class=cards><div class=card><span class=muted>tasks in both</span><b>{len(both)}</b></div>"
        f"<div class=card><span class=muted>{esc(a_name)}</span><b>{acc(a)}</b></div>"
        f"<div class=card><span class=muted>{esc(b_name)}</span><b>{acc(b)}</b></div>"
        f"<div class=card><span class=muted>solved by both / only first / only second / neither</span>"
        f"<b>{counts[(True, True)]} / {counts[(True, False)]} / {counts[(False, True)]} / "
        f"{counts[(False, False)]}</b></div></div>"
        "<div class=filters><input id=filter type=search placeholder='filter'>"
        "<select id=outcome><option value=''>every change</option>"
        "<option>better</option><option>worse</option><option>same</option></select>"
        "<span class=muted><span id=shown></span></span></div>"
        + H.table(("task", "", a_name, "", b_name, "change"), rows, cls="filterable", sortable=True)
    )
    if only:
        body += f"<h2>In one side only ({len(only)})</h2><p>" + ", ".join(esc(t) for t in only) + "</p>"
    return H.page(f"{run.name}: compare", body, root="", run_name=run.name, nav=_nav(True))


# -- a folder of runs (guirl learn) -------------------------------------------------------------------------


def _group_page(root: Path, children: list[Path], problems: list[str]) -> str:
    learn = _read_json(root / "learn.json", problems, root)
    curve = _read_json(root / "curve.json", problems, root)
    parts = [f"<h1>{esc(root.name)}</h1>"]
    if isinstance(learn, dict):
        figures = [
            (k, v)
            for k, v in learn.items()
            if not isinstance(v, list | dict) and k not in ("run_dir", "plot")
        ]
        parts.append("<h2>Figures (learn.json)</h2>" + H.kv(figures))
        pts = [(c[0], c[2]) for c in learn.get("curve") or [] if isinstance(c, list) and len(c) >= 3]
        if isinstance(learn.get("S0"), int | float):
            pts = [(0, learn["S0"]), *pts]
        series = [("policy", pts)]
        control = [
            (c[0], c[2]) for c in learn.get("control_curve") or [] if isinstance(c, list) and len(c) >= 3
        ]
        if control:
            series.append(("control (shuffled rewards)", control))
        parts.append(H.line_plot("learn_curve", "held-out success by policy version", series, percent=True))
    elif isinstance(curve, dict | list):
        parts.append("<h2>curve.json</h2><pre>" + esc(json.dumps(curve, indent=1)[:20_000]) + "</pre>")
    if (root / "curve.png").exists():
        parts.append('<p><img src="../curve.png" alt="learning curve" style="max-width:720px"></p>')
    rows = []
    for child in children:
        summary = _read_json(child / "summary.json", problems, root) or {}
        summary = summary if isinstance(summary, dict) else {}
        rows.append(
            "<tr>"
            + H.td(f'<a href="../{href(child.name)}/{SITE}/index.html">{esc(child.name)}</a>', raw=True)
            + H.td(summary.get("mode", ""))
            + H.td(fmt(summary.get("episodes")), num=True)
            + H.td(pct(summary.get("accuracy")), num=True)
            + H.td(fmt(summary.get("final_version")), num=True)
            + H.td(fmt(summary.get("seconds"), ".0f"), num=True)
            + "</tr>"
        )
    parts.append(
        "<h2>Runs</h2>" + H.table(("run", "mode", "episodes", "accuracy", "final version", "seconds"), rows)
    )
    if problems:
        parts.append("<h2>Not shown</h2><ul>" + "".join(f"<li>{esc(p)}</li>" for p in problems) + "</ul>")
    return H.page(root.name, "".join(parts), root="", run_name=root.name)
