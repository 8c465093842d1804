"""`guirl view` on a real train run, checked in headless Chromium: called by tests/e2e/test_train.py on its
`--sync` run (so that the suite makes that run once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.browser import chromium

ROOT = Path(__file__).resolve().parents[1]


def check_train_site(run_dir: Path, updates: int) -> None:
    """The curves with a point per update, a policy failure's parse error and the step's advantage."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "guirl"), "view", str(run_dir)], capture_output=True, text=True
    )
    assert out.returncode == 0 and "[view]" in out.stdout, out.stderr[-2000:]
    site = run_dir / "view"
    results = {p.parent.name: json.loads(p.read_text()) for p in run_dir.glob("episodes/*/*/result.json")}
    credits = [json.loads(x) for x in (run_dir / "advantages.jsonl").read_text().splitlines()]
    failed = [c for c in credits if results[c["episode_id"]]["outcome"] == "parse_error"]
    assert failed, "no trained step of a policy failure (the tiny model's text parsed every time?)"
    credit = failed[0]
    ep = results[credit["episode_id"]]
    with chromium() as browser:
        with browser.page((site / "index.html").as_uri()) as page:
            for metric in (
                "reward_mean",
                "success_rate",
                "clipfrac",
                "approx_kl",
                "entropy",
                "version_lag_mean",
            ):
                plot = page.locator(f"figure.plot[data-metric='{metric}']")
                assert plot.is_visible(), metric
                assert plot.locator("circle.point").count() == updates, metric  # one per update
            assert page.locator("figure.plot[data-metric='env_utilisation'] circle.point").count() == updates
            browser.screenshot(page, "train-run-page", full_page=True)
        url = (site / "e" / ep["task_id"] / f"{ep['episode_id']}.html").as_uri()
        with browser.page(url) as page:
            shown = page.locator(".parse-error").first
            assert shown.is_visible() and "Policy failure" in shown.inner_text()
            assert ep["parse_error"][:60] in shown.inner_text()
            traj = run_dir / "episodes" / ep["task_id"] / ep["episode_id"] / "traj.jsonl"
            last = json.loads(traj.read_text().splitlines()[-1])
            said = page.locator(f"section#step-{last['step']} pre.response").inner_text()
            assert last["response"][:40] in said
            # the step's credit, as the learner logged it
            shown = page.locator(f"section#step-{credit['step']} .advantage").inner_text()
            assert f"{credit['advantage']:+.4f}" in shown and f"{credit['version']}" in shown
            browser.screenshot(page, "train-episode-parse-error", full_page=True)
    assert not browser.refused and not browser.errors, (browser.refused, browser.errors)
