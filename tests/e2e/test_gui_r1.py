"""GUI-R1 mode end to end, on synthetic grounding rows and the tiny model: SFT, GRPO through the real actors
(dataset workers, broker, learner, weight broadcast) with the rule reward's components logged, and the
grounding evaluation."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
GUIRL = [sys.executable, str(ROOT / "bin" / "guirl")]
CONFIG = str(ROOT / "configs" / "gui_r1.toml")


def _guirl(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run([*GUIRL, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory, tiny_ckpt):
    root = tmp_path_factory.mktemp("sft")
    _guirl(
        "sft",
        "--config",
        CONFIG,
        "--ckpt",
        tiny_ckpt,
        "--data",
        "synth:train:12:0",
        "--epochs",
        "1",
        "--set",
        f"run.root_dir={root}",
        "--set",
        "sft.batch_size=6",
    )
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir


def test_sft_trains_on_ground_truth_answers_and_writes_a_checkpoint(sft_model):
    lines = [json.loads(x) for x in (sft_model / "sft.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and all(x["samples"] == 6 for x in lines)
    assert all(math.isfinite(x["nll"]) and x["nll"] > 0 and x["grad_norm"] > 0 for x in lines)
    model = sft_model / "final" / "model"
    assert (model / "config.json").is_file() and (model / "tokenizer_config.json").is_file()
    summary = json.loads((sft_model / "summary.json").read_text())
    assert summary["rows"] == 12 and summary["steps"] == 2 and summary["model"] == str(model)


def test_grpo_on_rows_logs_each_reward_component(tmp_path, sft_model):
    _guirl(
        "train",
        "--config",
        CONFIG,
        "--ckpt",
        str(sft_model / "final" / "model"),
        "--updates",
        "2",
        "--set",
        f"run.root_dir={tmp_path}",
        "--set",
        "data.train=synth:train:6:0",
        "--set",
        "rollout.batch_size=2",
        "--set",
        "rollout.n_samples_per_prompt=2",
        "--set",
        "env.vms_per_worker=4",
        "--set",
        "agent.max_new_tokens=24",
    )
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["trajectories"] == 4 and m["samples"] == 4
        for part in ("format", "type", "accuracy"):
            assert 0.0 <= m[f"reward.{part}"] <= 1.0
    results = [json.loads(p.read_text()) for p in run_dir.glob("episodes/*/*/result.json")]
    assert results and all(r["steps"] == 1 and set(r["reward_parts"]) >= {"format", "type"} for r in results)
    for r in results:  # the reward is GUI-R1's weighted total of its parts
        p = r["reward_parts"]
        assert r["reward"] == pytest.approx(0.2 * p["format"] + 0.8 * p["accuracy"])
        assert r["score"] == p["accuracy"]
    traj = [json.loads(p.read_text()) for p in run_dir.glob("episodes/*/*/traj.jsonl")]
    assert all(t["ground_truth"]["action"] and t["prompt_images"] for t in traj)


def test_eval_on_held_out_rows_reports_grounding_metrics(tmp_path, sft_model):
    out = _guirl(
        "eval",
        "--config",
        CONFIG,
        "--ckpt",
        str(sft_model / "final" / "model"),
        "--set",
        f"run.root_dir={tmp_path}",
        "--set",
        "data.eval=synth:test:6:1",
        "--set",
        "agent.temperature=0",
        "--set",
        "agent.max_new_tokens=24",
    )
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    g = summary["grounding"]["all"]
    assert g["rows"] == 6 == summary["tasks"]
    assert all(0.0 <= g[k] <= 1.0 for k in ("step_success", "type_accuracy", "format_rate"))
    assert summary["accuracy"] == g["step_success"]
    assert "step success" in out.stdout and "grounding" in out.stdout
    _rows_in_the_browser(run_dir)


def _rows_in_the_browser(run_dir: Path) -> None:
    """`guirl view`: each row's image with its ground-truth box and the predicted point where they are,
    and the reward's parts, as a person sees them in Chromium."""
    from guirl.agent.unified import parse_answer
    from guirl.view import build
    from tests.browser import box, centre, chromium, on_image

    build(run_dir)
    with chromium() as browser:
        for i, result in enumerate(sorted(run_dir.glob("episodes/*/*/result.json"))):
            folder = result.parent
            line = json.loads((folder / "traj.jsonl").read_text())
            with browser.page(
                (run_dir / "view" / "e" / folder.parent.name / f"{folder.name}.html").as_uri()
            ) as page:
                img = "section#step-0 .shot img"
                x1, y1, x2, y2 = line["ground_truth"]["bbox"]
                shown = box(page, "section#step-0 .gt-box")
                if (x1, y1) == (x2, y2):
                    want = on_image(page, img, x1, y1)
                    assert all(abs(a - b) < 1.5 for a, b in zip(centre(shown), want, strict=True))
                else:
                    (left, top), (right, bottom) = on_image(page, img, x1, y1), on_image(page, img, x2, y2)
                    got = (shown["x"], shown["y"], shown["x"] + shown["width"], shown["y"] + shown["height"])
                    # (the box as drawn: its outline's half width, 1.5 image pixels, outside the box's edges)
                    assert all(abs(a - b) < 3 for a, b in zip(got, (left, top, right, bottom), strict=True))
                parsed = parse_answer(line["response"])
                point = parsed.actions[0].point if parsed.actions else None
                if point:
                    want = on_image(page, img, *point)
                    got = centre(box(page, "section#step-0 .pred-point"))
                    assert all(abs(a - b) < 1.5 for a, b in zip(got, want, strict=True)), (got, want)
                else:
                    assert page.locator(".pred-point").count() == 0
                parts = page.locator("table.reward-parts").inner_text()
                assert all(k in parts for k in line["reward_parts"])
                if i == 0:
                    browser.screenshot(page, "gui-r1-row", full_page=True)
    assert not browser.refused and not browser.errors, (browser.refused, browser.errors)


def test_a_broken_rows_file_is_a_clear_error(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "r1", "instruction": "click", "gt_action": "click", "gt_bbox": [0.1, 0.1]}\n')
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run(
        [
            *GUIRL,
            "eval",
            "--config",
            CONFIG,
            "--set",
            f"data.eval={rows}",
            "--set",
            f"run.root_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "r1" in out.stderr and "image" in out.stderr
