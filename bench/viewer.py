"""How long `guirl view` takes on a large run, and how fast its pages open in a real browser.

The run: a real short eval (the scripted backend playing the shipped terminal tasks on local desktops, one
VM killed: an environment error among the episodes), its episode folders then repeated (hard links: no
copy of the screenshots) into a run of `--episodes` episodes over `--tasks` tasks, with its episodes.jsonl
and summary.json to match. Or `--run RUN_DIR`: an existing run as it is (a copy's site is built, the run
itself is not written to).

Measured, side by side in one run: the first build (every page, every thumbnail), a rebuild with nothing
changed, a rebuild after 1 % of the episodes changed, the `--serve` loop's look for changes (the
fingerprint), the sizes of the largest pages, and (when Debian's Chromium is there) the time until the task
table and an episode page have loaded in headless Chromium. Prints one line of JSON.

    python bench/viewer.py [--episodes 1200] [--tasks 300] [--run RUN_DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from guirl.view import build  # noqa: E402
from guirl.view.serve import fingerprint  # noqa: E402

TARGETS = {"first_build_s": 60.0, "rebuild_unchanged_s": 5.0, "task_table_load_s": 3.0}
"""For a run of 1,000+ episodes on 2 cores: the first build within a minute, a look with nothing to do
within a few seconds (what `--serve` does every interval), the task table open within 3 s."""


def real_eval(work: Path) -> Path:
    root = work / "source"
    cmd = [
        sys.executable,
        str(ROOT / "bin" / "guirl"),
        *("eval", "--config", str(ROOT / "configs" / "local_eval.toml"), "--backend", "scripted"),
        *("--domain", "terminal", "--max-steps", "15", "--set", "faults.kill_vm_at_step=1"),
        *("--set", f"run.root_dir={root}", "--set", "logging.level=WARNING"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"the source eval failed:\n{out.stderr[-3000:]}")
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


def _link_png(src: str, dst: str) -> None:
    """Screenshots as hard links (no copy); every other file copied, so that writing it never writes the
    source run's."""
    if src.endswith(".png"):
        os.link(src, dst)
    else:
        shutil.copy2(src, dst)


def repeat(source: Path, dest: Path, episodes: int, tasks: int) -> Path:
    """A run of `episodes` episodes over `tasks` tasks, each a hard-linked copy of one of the source's."""
    folders = sorted(p.parent for p in source.glob("episodes/*/*/result.json"))
    dest.mkdir(parents=True)
    for name in ("config.toml",):
        if (source / name).exists():
            shutil.copy(source / name, dest / name)
    lines, results = [], []
    t0 = time.time()
    for i in range(episodes):
        src = folders[i % len(folders)]
        task_id, episode_id = f"{src.parent.name}-{i % tasks:04d}", f"ep{i:06d}"
        target = dest / "episodes" / task_id / episode_id
        shutil.copytree(src, target, copy_function=_link_png, ignore=shutil.ignore_patterns("cache"))
        result = json.loads((src / "result.json").read_text())
        result.update(episode_id=episode_id, task_id=task_id, status=result.get("status") or "completed")
        (target / "result.json").write_text(json.dumps(result))
        lines.append({"time": t0 + i, "kind": "assigned", "episode_id": episode_id, "task_id": task_id})
        lines.append(
            {"time": t0 + i + 5, "kind": "ended", "episode_id": episode_id, "status": result["status"]}
        )
        if not result.get("env_error"):
            results.append(
                {
                    "task_id": task_id,
                    "domain": result.get("domain"),
                    "status": "completed",
                    "score": result.get("score"),
                    "outcome": result.get("outcome"),
                    "episode_id": episode_id,
                    "attempts": 1,
                    "steps": result.get("steps"),
                    "env_errors": [],
                }
            )
    (dest / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = json.loads((source / "summary.json").read_text())
    summary.update(results=results, episodes=episodes, tasks=len({r["task_id"] for r in results}))
    (dest / "summary.json").write_text(json.dumps(summary))
    return dest


def touch_some(run: Path, share: float) -> int:
    results = sorted(run.glob("episodes/*/*/result.json"))
    changed = results[:: max(1, round(1 / share))]
    for path in changed:
        doc = json.loads(path.read_text())
        doc["seconds"] = (doc.get("seconds") or 0) + 1
        path.write_text(json.dumps(doc))
    return len(changed)


def browser_load(site: Path) -> dict[str, float] | None:
    chromium = shutil.which("chromium")
    if chromium is None:
        return None
    from playwright.sync_api import sync_playwright

    episode = next(site.glob("e/*/*.html"))
    out = {}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        for name, path in (("task_table_load_s", site / "tasks.html"), ("episode_page_load_s", episode)):
            t = time.perf_counter()
            page.goto(path.as_uri(), wait_until="load")
            out[name] = round(time.perf_counter() - t, 3)
        rows = page.goto((site / "tasks.html").as_uri()) and page.locator("#tasks tbody tr").count()
        t = time.perf_counter()
        page.locator("#tasks th", has_text="score").first.click()
        page.wait_for_function("() => document.querySelector('#tasks th[data-dir]') !== null")
        out["task_table_sort_s"] = round(time.perf_counter() - t, 3)
        out["task_table_rows"] = rows
        b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1200)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--run", type=Path, help="an existing run (its copy's site is built)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="guirl-bench-view-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        if args.run:
            run = work / args.run.name
            shutil.copytree(
                args.run, run, copy_function=os.link, ignore=shutil.ignore_patterns("view", "vms")
            )
            source = "given run"
        else:
            run = repeat(real_eval(work), work / "large-eval", args.episodes, args.tasks)
            source = "a real scripted eval of the terminal tasks, its episodes repeated"
        prepare_s = time.perf_counter() - t
        first = build(run)
        unchanged = build(run)
        touched = touch_some(run, 0.01)
        incremental = build(run)
        t = time.perf_counter()
        fingerprint(run)
        fingerprint_s = time.perf_counter() - t
        site = first.site
        sizes = {p.name: p.stat().st_size for p in (site / "index.html", site / "tasks.html")}
        biggest_episode = max((p.stat().st_size for p in site.glob("e/*/*.html")), default=0)
        thumbs = sorted(p.stat().st_size for p in site.glob("thumbs/*/*.jpg"))
        loads = browser_load(site)
    figures = {
        "bench": "viewer",
        "source": source,
        "episodes": first.episodes,
        "prepare_s": round(prepare_s, 1),
        "first_build_s": round(first.seconds, 2),
        "first_build_pages": first.pages,
        "thumbnails": first.thumbs,
        "rebuild_unchanged_s": round(unchanged.seconds, 2),
        "rebuild_unchanged_pages_reused": unchanged.pages_reused,
        "episodes_changed": touched,
        "rebuild_changed_s": round(incremental.seconds, 2),
        "rebuild_changed_pages_written": incremental.pages,
        "serve_fingerprint_s": round(fingerprint_s, 3),
        "index_html_kb": round(sizes["index.html"] / 1024, 1),
        "tasks_html_kb": round(sizes["tasks.html"] / 1024, 1),
        "largest_episode_html_kb": round(biggest_episode / 1024, 1),
        "thumbnail_kb_median": round(thumbs[len(thumbs) // 2] / 1024, 1) if thumbs else None,
        "not_shown": len(first.problems),
        "cpus": os.cpu_count(),
    }
    if loads:
        figures.update(loads)
    figures["targets"] = TARGETS
    figures["met"] = all(figures.get(k) is None or figures[k] <= v for k, v in TARGETS.items())
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
