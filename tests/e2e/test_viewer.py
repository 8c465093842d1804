"""`guirl view` in a real browser (headless Chromium), on the run directory of a real short eval (the
scripted backend on local desktops, one VM killed): what a person would see. A real short train run's site
is checked the same way by tests/e2e/test_train.py (its `--sync` run: `tests/viewer_checks.py`), a GUI-R1
eval's by tests/e2e/test_gui_r1.py. Screenshots of the pages are saved as test artifacts
(tests/browser.py)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from guirl.config.schema import ENV_VARS
from tests.browser import box, centre, chromium, on_image

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]
FAST = [
    *("--set", "runtime.heartbeat_interval_s=0.25", "--set", "runtime.heartbeat_liveness=20"),
    *("--set", "logging.level=WARNING"),
]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ENV_VARS}


def _run(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [*GUIRL, *args], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def _only_run(root: Path) -> Path:
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory) -> Path:
    """The shipped terminal tasks played by their reference solutions (clicks, typing, keys, FAIL on the
    infeasible one), the first episode's VM killed at its second step (an environment error, retried)."""
    root = tmp_path_factory.mktemp("eval")
    _run(
        *("eval", "--config", str(ROOT / "configs" / "local_eval.toml"), "--backend", "scripted"),
        *("--domain", "terminal", "--max-steps", "15", "--set", "faults.kill_vm_at_step=1"),
        *("--set", f"run.root_dir={root}", *FAST),
    )
    return _only_run(root)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b
    # nothing any page asked for left this machine, and no script failed
    assert b.requests and not b.refused, b.refused
    assert not b.errors, b.errors


def _episodes(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("episodes/*/*/result.json"))]


def _page(run_dir: Path, *parts: str) -> str:
    return (run_dir / "view").joinpath(*parts).as_uri()


def test_eval_run_page_and_task_table(eval_run, browser):
    out = _run("view", str(eval_run))
    assert "[view]" in out.stdout and "4 episodes" in out.stdout, out.stdout
    with browser.page(_page(eval_run, "index.html")) as page:
        # the environment error apart from the policy's results, with its episode linked
        env = page.locator("#env-errors")
        assert env.inner_text() == "Environment errors (1)"
        broken = next(e for e in _episodes(eval_run) if e["env_error"])
        row = page.locator("table", has=page.locator(f"text={broken['episode_id']}")).first
        assert "VM" in row.inner_text()
        domains = page.locator("table", has_text="accuracy").first.inner_text()
        assert "terminal" in domains and "100.0%" in domains
        browser.screenshot(page, "eval-run-page", full_page=True)
    with browser.page(_page(eval_run, "tasks.html")) as page:
        rows = page.locator("#tasks tbody tr")
        assert rows.count() == 3
        # sorting by task name descending, then filtering by text and by outcome
        heading = page.locator("#tasks th", has_text="task").nth(0)
        heading.click()
        heading.click()
        names = [r.inner_text().split("\t")[1].strip() for r in rows.all()]
        assert names == sorted(names, reverse=True), names
        page.fill("#filter", "rename")
        visible = [r for r in rows.all() if r.is_visible()]
        assert len(visible) == 1 and "terminal-rename" in visible[0].inner_text()
        assert page.locator("#shown").inner_text() == "1"
        page.fill("#filter", "")
        page.select_option("#outcome", "fail")
        visible = [r for r in rows.all() if r.is_visible()]
        assert len(visible) == 1 and "infeasible" in visible[0].inner_text()
        page.select_option("#outcome", "")
        # every task's thumbnail loaded
        assert page.locator("#tasks img.thumb").count() == 3
        assert all(i.evaluate("i => i.naturalWidth") > 0 for i in page.locator("#tasks img.thumb").all())
        browser.screenshot(page, "eval-task-table")


def test_episode_page_draws_each_action_where_it_was_recorded(eval_run, browser):
    done = next(
        e for e in _episodes(eval_run) if e["task_id"] == "terminal-echo-hello" and e["status"] == "completed"
    )
    folder = eval_run / "episodes" / done["task_id"] / done["episode_id"]
    lines = [json.loads(x) for x in (folder / "traj.jsonl").read_text().splitlines()]
    clicks = [(line["step"], a) for line in lines for a in line["actions"] if a["type"] == "click"]
    typed = [(line["step"], a) for line in lines for a in line["actions"] if a["type"] == "type"]
    assert clicks and typed
    with browser.page(_page(eval_run, "e", done["task_id"], f"{done['episode_id']}.html")) as page:
        assert page.locator("section.step").count() == len(lines)
        for step, click in clicks:
            section = f"section#step-{step}"
            want = on_image(page, f"{section} .shot img", click["x"], click["y"])
            got = centre(box(page, f"{section} .click-marker"))
            assert abs(got[0] - want[0]) < 1.5 and abs(got[1] - want[1]) < 1.5, (got, want)
        step, text = typed[0]
        assert text["text"].strip() in page.locator(f"section#step-{step} .typed").text_content()
        # what the evaluator did: the task's metric, what its getter returned, the score
        task = json.loads(
            (ROOT / "tasks" / "local" / "examples" / "terminal" / "terminal-echo-hello.json").read_text()
        )
        metrics = page.locator(".evaluation table.metrics").inner_text()
        assert task["evaluator"]["func"] in metrics and "1.0" in metrics
        assert page.locator(".shot img[alt='the final screen']").count() == 1
        browser.screenshot(page, "eval-episode-page", full_page=True)


def test_the_site_works_offline(eval_run, browser):
    """Every kind of page, opened from file://: every request it makes is for a file of the run (the
    fixture refuses any other, and none is made), and no script fails."""
    done = next(e for e in _episodes(eval_run) if e["status"] == "completed")
    before = len(browser.requests)
    for parts in (
        ("index.html",),
        ("tasks.html",),
        ("t", f"{done['task_id']}.html"),
        ("e", done["task_id"], f"{done['episode_id']}.html"),
    ):
        with browser.page(_page(eval_run, *parts)):
            pass
    made = browser.requests[before:]
    assert any(u.endswith(".png") for u in made) and any(u.endswith("view.js") for u in made), made
    assert all(u.startswith("file://") for u in made) and browser.refused == [] and browser.errors == []


def test_serve_rebuilds_while_the_run_writes(eval_run, browser, tmp_path):
    run = tmp_path / eval_run.name
    shutil.copytree(eval_run, run, ignore=shutil.ignore_patterns("view", "vms"))
    proc = subprocess.Popen(
        [*GUIRL, "view", str(run), "--serve", "--port", "0", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    said: queue.Queue[str] = queue.Queue()
    # its output read on a thread: a wait for a line has a timeout, and the pipe never fills
    threading.Thread(target=lambda: [said.put(line) for line in proc.stdout], daemon=True).start()
    try:
        url = ""
        while not url:  # the first build, then the address
            line = said.get(timeout=120)
            if line.startswith("[view] serving "):
                url = line.split()[2]
        assert url.startswith("http://127.0.0.1:"), url
        base = url.rsplit("/view/", 1)[0]
        # only the site and the episodes are served, to this address only
        for path, host, code in (
            ("/config.toml", None, 404),
            ("/episodes/", None, 404),
            ("/view/index.html", "evil.example:80", 403),
        ):
            request = urllib.request.Request(base + path, headers={"Host": host} if host else {})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == code, path
        browser.allowed_prefixes = ("file://", base + "/")
        with browser.page(url.replace("index.html", "tasks.html")) as page:
            assert page.locator("#tasks tbody tr").count() == 3
            # the run goes on: a new task's episode appears on disk, and the open page shows it
            src = next((run / "episodes" / "terminal-rename").iterdir())
            shutil.copytree(src, run / "episodes" / "terminal-new-task" / "ep09999")
            page.wait_for_selector("#tasks tbody tr >> text=terminal-new-task", timeout=30_000)
            assert page.locator("#tasks tbody tr").count() == 4
    finally:
        browser.allowed_prefixes = ("file://",)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        err = proc.stderr.read()
    assert rc == 0, err[-2000:]


def test_bad_arguments_are_clear_errors(tmp_path, eval_run):
    for args, said in (
        ((str(tmp_path / "nope"),), "no such directory"),
        ((str(tmp_path),), "not a run directory"),
        ((str(eval_run), "--versions", "1", "2"), "no evaluation round"),
        ((str(eval_run), "--compare", str(tmp_path / "nope")), "no such directory"),
    ):
        out = subprocess.run([*GUIRL, "view", *args], capture_output=True, text=True, env=_env(), cwd=ROOT)
        assert out.returncode == 2 and said in out.stderr, (args, out.stderr)
