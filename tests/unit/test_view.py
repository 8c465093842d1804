"""`guirl view`'s site from hand-made run directories: hostile text stays text, what cannot be read is
listed, marks are placed at the recorded coordinates, compare, a folder of runs, incremental rebuilds.
(The same site in a real browser, on real runs: tests/e2e/test_viewer.py.)"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from guirl.view import build
from guirl.view.episode import draw_actions
from guirl.view.html import line_plot
from guirl.view.serve import fingerprint

HOSTILE = '</pre><script>window.pwned=1</script><img src=x onerror="alert(1)">'


def _png(w: int = 320, h: int = 200) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (40, 90, 160)).save(buf, "PNG")
    return buf.getvalue()


def _episode(run: Path, task: str, ep: str, *, result: dict, lines: list, prm: list | None = None) -> Path:
    folder = run / "episodes" / task / ep
    folder.mkdir(parents=True)
    for i in range(len(lines)):
        (folder / f"step_{i:03d}.png").write_bytes(_png())
    (folder / "final.png").write_bytes(_png())
    (folder / "traj.jsonl").write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    )
    (folder / "result.json").write_text(json.dumps({"episode_id": ep, "task_id": task, **result}))
    if prm:
        (folder / "prm.jsonl").write_text("".join(json.dumps(v) + "\n" for v in prm))
    return folder


def _result(**kw) -> dict:
    base = {
        "status": "completed",
        "outcome": "done",
        "score": 1.0,
        "steps": 1,
        "env_error": "",
        "parse_error": "",
    }
    return {**base, **kw}


def _step(step: int, actions: list, **kw) -> dict:
    return {"step": step, "screenshot": f"step_{step:03d}.png", "response": "ok", "actions": actions, **kw}


def _attribute_names(page: str) -> set[str]:
    from html.parser import HTMLParser

    names: set[str] = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            names.update(name for name, _ in attrs)

    Collect().feed(page)
    return names


def _all_html(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): p.read_text() for p in site.rglob("*.html")}


@pytest.fixture
def train_run(tmp_path: Path) -> Path:
    run = tmp_path / "local-rl-20261203-000000-abcd"
    run.mkdir()
    (run / "config.toml").write_text('[run]\nname = "local-rl"\n')
    metrics = [
        {"version": v, "time": 100.0 + 10 * v, "reward_mean": r, "entropy": 0.4, "clipfrac": 0.0}
        for v, r in ((1, -0.5), (2, float("nan")), (3, 0.5))
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run / "eval.jsonl").write_text(
        json.dumps({"version": 1, "accuracy": 0.0, "domains": {"d": 0.0}, "scored": 1})
        + "\n"
        + json.dumps({"version": 3, "accuracy": 1.0, "domains": {"d": 1.0}, "scored": 1})
        + "\n"
    )
    assigned = [
        ("ep1", "t1", "t1@0"),
        ("ep2", "t1", "eval@1/t1"),
        ("ep3", "t1", "eval@3/t1"),
        ("ep4", HOSTILE.replace("/", "|"), "g"),
    ]
    (run / "episodes.jsonl").write_text(
        "".join(
            json.dumps({"time": 100.0 + i + d, "kind": k, "episode_id": e, "task_id": t, "group_id": g})
            + "\n"
            for i, (e, t, g) in enumerate(assigned)
            for k, d in (("assigned", 0), ("ended", 5))
        )
        + "this line is not JSON\n"
    )
    (run / "advantages.jsonl").write_text(
        json.dumps({"version": 1, "episode_id": "ep1", "step": 0, "reward": 1.0, "advantage": 0.70711}) + "\n"
    )
    _episode(
        run,
        "t1",
        "ep1",
        result=_result(steps=2),
        lines=[
            _step(0, [{"type": "click", "x": 100, "y": 50}, {"type": "type", "text": HOSTILE}]),
            _step(1, [{"type": "drag_to", "to_x": 300, "to_y": 150}, {"type": "key", "keys": ["ctrl", "s"]}]),
        ],
        prm=[
            {
                "step": 0,
                "score": 1.0,
                "votes": 3,
                "invalid": 0,
                "vote_scores": [1, 1, 1],
                "answers": [HOSTILE],
            }
        ],
    )
    _episode(
        run, "t1", "ep2", result=_result(score=0.0, outcome="fail"), lines=[_step(0, [{"type": "fail"}])]
    )
    _episode(run, "t1", "ep3", result=_result(), lines=[_step(0, [{"type": "done"}])])
    bad = {
        "step": 0,
        "screenshot": "../../../../etc/passwd",
        "response": HOSTILE,
        "parse_error": "bad: " + HOSTILE,
    }
    _episode(
        run,
        HOSTILE.replace("/", "|"),
        "ep4",
        result=_result(outcome="parse_error", score=0.0, parse_error="bad: " + HOSTILE),
        lines=[bad, "{cut short"],
    )
    (run / "episodes" / "t1" / "ep5").mkdir()
    (run / "episodes" / "t1" / "ep5" / "result.json").write_text("{not json")
    return run


def test_hostile_text_is_shown_as_text_never_run(train_run: Path) -> None:
    built = build(train_run)
    pages = _all_html(built.site)
    assert len(pages) >= 8
    for name, text in pages.items():
        # the only script on any page is the site's own
        assert re.findall(r"<script[^>]*>", text) == [
            re.search(r'<script src="[./]*assets/view\.js">', text)[0]
        ]
        assert "<img src=x" not in text and "<script>window" not in text, name
        assert not {"onerror", "onmouseover"} & _attribute_names(text), name
    ep4 = next(t for n, t in pages.items() if n.endswith("ep4.html"))
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in ep4 and "parse-error" in ep4
    # a recorded screenshot name that is a path is never followed
    assert "etc/passwd" not in re.sub(r"<pre.*?</pre>", "", ep4, flags=re.S).split("result.json")[0]
    assert "step_000.png" in ep4


def test_what_cannot_be_read_is_listed_not_dropped(train_run: Path) -> None:
    built = build(train_run)
    listed = "\n".join(built.problems)
    assert "episodes.jsonl: 1 line(s) not JSON objects" in listed
    assert "episodes/t1/ep5/result.json: not readable as JSON" in listed
    assert "traj.jsonl: 1 line(s) not JSON objects" in listed
    index = (built.site / "index.html").read_text()
    assert "Not shown" in index and "ep5/result.json" in index


def test_curves_leave_out_and_count_points_that_are_not_finite(train_run: Path) -> None:
    index = (build(train_run).site / "index.html").read_text()
    reward = re.search(r'<figure class=plot data-metric="reward_mean">.*?</figure>', index, re.S)[0]
    assert reward.count("<circle class=point") == 2 and "1 point(s) not finite" in reward
    assert 'data-metric="eval_accuracy"' in index and 'data-metric="env_utilisation"' in index
    assert line_plot("x", "x", [("x", [(1, float("inf"))])]) == ""


def test_episode_marks_sit_on_the_recorded_pixels(train_run: Path) -> None:
    page = (build(train_run).site / "e" / "t1" / "ep1.html").read_text()
    assert '<svg viewBox="0 0 320 200"' in page
    assert '<g class="click-marker" data-x="100" data-y="50">' in page
    # drag_to starts where the pointer was left (the click of the step before)
    assert '<g class="drag-path" data-x="100" data-y="50" data-to-x="300" data-to-y="150">' in page
    assert "key ctrl+s" in page and "Credit in training" in page and "+0.7071" in page
    assert "Process reward (the judge)" in page and "1, 1, 1" in page
    marks = draw_actions(
        [{"type": "scroll", "amount": -3}, {"type": "nonsense"}, "x"], (100, 50), [None, None]
    )
    assert 'class="scroll-marker" data-x="50" data-y="25"' in marks.markup()


def test_compare_versions_and_runs(train_run: Path, tmp_path: Path) -> None:
    build(train_run)  # a train run with two evaluation rounds compares its first and last
    page = (train_run / "view" / "compare.html").read_text()
    assert "version 1 → version 3" in page.replace("&gt;", ">").replace("→", "→")
    assert re.search(r'data-outcomes="better".*t1', page, re.S)
    with pytest.raises(ValueError, match="no evaluation round at version"):
        build(train_run, versions=("1", "7"))
    other = tmp_path / "other"
    _episode(
        other, "t1", "epA", result=_result(score=0.0, outcome="fail"), lines=[_step(0, [{"type": "fail"}])]
    )
    build(train_run, compare=other)
    page = (train_run / "view" / "compare.html").read_text()
    assert "../../other/view/e/t1/epA.html" in page and "In one side only" in page


def test_grounding_row_shows_the_box_and_the_predicted_point(tmp_path: Path) -> None:
    run = tmp_path / "gui-r1"
    line = {
        "step": 0,
        "screenshot": "step_000.png",
        "response": "<think>x</think><answer>[{'action': 'click', 'point': [40, 60], "
        "'input_text': 'no input text'}]</answer>",
        "ground_truth": {"action": "click", "bbox": [10, 20, 110, 90], "input_text": ""},
        "reward": 1.0,
        "reward_parts": {"format": 1.0, "type": 1.0, "point": 1.0, "accuracy": 1.0},
    }
    _episode(run, "row-1", "ep1", result=_result(reward=1.0, reward_parts=line["reward_parts"]), lines=[line])
    page = (build(run).site / "e" / "row-1" / "ep1.html").read_text()
    assert 'class="gt-box" data-box="10,20,110,90"' in page
    assert '<g class="pred-point" data-x="40" data-y="60">' in page
    assert "reward-parts" in page and "accuracy" in page


def test_a_folder_of_runs_and_incremental_rebuilds(train_run: Path) -> None:
    root = train_run.parent
    (root / "learn.json").write_text(json.dumps({"S0": 0.5, "S1": 1.0, "curve": [[3, 10.0, 1.0]]}))
    first = build(root)
    index = (root / "view" / "index.html").read_text()
    assert f"../{train_run.name}/view/index.html" in index and 'data-metric="learn_curve"' in index
    again = build(train_run)
    # nothing changed: nothing written again (an open page under --serve does not reload)
    assert again.pages == 0 and again.thumbs == 0 and again.pages_reused >= again.episodes == first.episodes
    before = fingerprint(train_run)
    result = train_run / "episodes" / "t1" / "ep3" / "result.json"
    result.write_text(json.dumps({**json.loads(result.read_text()), "score": 0.0, "outcome": "fail"}))
    assert fingerprint(train_run) != before
    third = build(train_run)
    # the episode's page, its task's page, the task table and the compare page (ep3 is version 3's
    # evaluation) are written again; the rest is kept
    assert third.pages == 4, third
    written = json.loads((train_run / "view" / "build.json").read_text())["written"]
    assert (
        written["e/t1/ep3.html"] == written["tasks.html"] == written["t/t1.html"] > written["e/t1/ep1.html"]
    )
    assert written["index.html"] < written["tasks.html"]


def test_not_a_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        build(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        build(tmp_path / "missing")


def test_odd_data_is_listed_and_the_rest_is_built(tmp_path: Path) -> None:
    """Wrong types where a reader expects others: nothing crashes the build; what cannot be shown is said."""
    run = tmp_path / "odd"
    line = {
        "step": 0,
        "screenshot": "step_000.png",
        "response": 5,
        "actions": 3,
        "refused": 7,
        "prompt": 9,
        "timing": [],
    }
    folder = _episode(
        run,
        "t",
        "e1",
        result=_result(policy_versions=4, ended_at="x", evaluation={"metrics": 3, "not_run": 1}),
        lines=[
            line,
            {"step": 1, "screenshot": "step_001.png\x00", "actions": [{"type": "drag_to", "to_x": 5}]},
        ],
        prm=[{"step": 0, "errors": 1, "invalid_reasons": 2, "vote_scores": "x", "answers": 3}],
    )
    (folder / "step_000.png").write_bytes(b"not a png")
    (folder / "traj.jsonl").write_text((folder / "traj.jsonl").read_text() + '{"step": 2, "cut')
    _episode(run, "t", "e2", result=_result(ended_at=5), lines=[_step(0, [])])
    (run / "eval.jsonl").write_text(json.dumps({"version": 1, "accuracy": "high", "domains": 3}) + "\n")
    summary = {
        "results": [{"task_id": ["t"], "episode_id": {}}, {"task_id": "t", "env_errors": 3}],
        "domains": 1,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "episodes" / "bad\udcff").mkdir(parents=True)
    # a lone surrogate is legal JSON: shown as a replacement character, never the end of the build
    (run / "episodes" / "t" / "e2" / "result.json").write_text(
        '{"worker": "w\\udc80", "status": "completed"}'
    )
    built = build(run)
    listed = "\n".join(built.problems)
    assert "step 0's screenshot step_000.png is missing or not a PNG" in listed
    assert "e1/traj.jsonl: 1 line(s) not JSON objects" in listed  # the finished episode's cut-short line
    assert "not UTF-8" in listed
    for page in ("index.html", "tasks.html", "e/t/e1.html", "e/t/e2.html", "t/t.html"):
        assert "could not be made" not in (built.site / page).read_text(), page


def test_a_compared_run_with_a_hostile_name_is_linked_safely(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / 'x" onmouseover="alert(1) #1'
    for run in (a, b):
        _episode(run, "t", "e", result=_result(), lines=[_step(0, [])])
    page = (build(a, compare=b).site / "compare.html").read_text()
    assert "onmouseover" not in _attribute_names(page)  # in the text, escaped; never an attribute
    assert 'href="../../x%22%20onmouseover%3D%22alert%281%29%20%231/view/e/t/e.html"' in page
    # a later build without --compare removes the stale compare page, and the run page stops linking it
    build(a)
    assert (
        not (a / "view" / "compare.html").exists()
        and "compare.html" not in (a / "view" / "index.html").read_text()
    )
    with pytest.raises(ValueError, match="the run itself"):
        build(a, compare=a)


def test_evaluation_rounds_are_ordered_by_epoch_then_version(tmp_path: Path) -> None:
    from guirl.view.site import _eval_rounds, load_run

    run = tmp_path / "r"
    names = ["12", "4", "8e1", "4e1"]
    lines = [
        {"kind": "assigned", "episode_id": f"e{i}", "group_id": f"eval@{n}/t"} for i, n in enumerate(names)
    ]
    for i, _ in enumerate(names):
        _episode(run, "t", f"e{i}", result=_result(), lines=[_step(0, [])])
    (run / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert list(_eval_rounds(load_run(run))) == ["4", "12", "4e1", "8e1"]


def test_an_unchanged_episode_is_not_made_again(train_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import guirl.view.site as site

    build(train_run)
    made: list[str] = []
    real = site._episode_page
    monkeypatch.setattr(
        site, "_episode_page", lambda run, ep, problems: made.append(ep.episode_id) or real(run, ep, problems)
    )
    again = build(train_run)
    assert made == [] and any("ep4" in p for p in again.problems)  # a kept page's problems still listed
    # a new line of advantages for an episode makes its page again
    with open(train_run / "advantages.jsonl", "a") as f:
        f.write(json.dumps({"version": 2, "episode_id": "ep2", "step": 0, "advantage": -1.0}) + "\n")
    build(train_run)
    assert made == ["ep2"]


def test_serve_answers_only_the_site_on_its_own_address(train_run: Path) -> None:
    import threading
    import urllib.error
    import urllib.request

    from guirl.view.serve import Server

    server = Server(train_run, port=0, interval_s=0.05)
    server.rebuild_if_changed()
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        base = server.url.rsplit("/view/", 1)[0]
        with urllib.request.urlopen(server.url, timeout=10) as r:
            assert r.status == 200 and b"assets/view.js" in r.read()
        with urllib.request.urlopen(base + "/episodes/t1/ep1/step_000.png", timeout=10) as r:
            assert r.read().startswith(b"\x89PNG")
        port = base.rsplit(":", 1)[1]
        upper = urllib.request.Request(server.url, headers={"Host": f"LOCALHOST:{port}"})
        with urllib.request.urlopen(upper, timeout=10) as r:
            assert r.status == 200
        for path, host, code in (
            ("/config.toml", None, 404),
            ("/metrics.jsonl", None, 404),
            ("/episodes/", None, 404),
            ("/view/index.html", "attacker.example", 403),
            # what the base class would open, after unquoting and `..`: still only the site and episodes
            ("/view/../config.toml", None, 404),
            ("/view/%2e%2e/config.toml", None, 404),
            ("/episodes/%2e%2e/metrics.jsonl", None, 404),
        ):
            request = urllib.request.Request(base + path, headers={"Host": host} if host else {})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == code, path
    finally:
        server.stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_evaluators_record_previews_any_value_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from guirl.vmpool.tasks.evaluate import PREVIEW_CHARS, _preview
    from guirl.vmpool.tasks.setup import TaskContext

    ctx = TaskContext(task_id="t", cache_dir=tmp_path / "cache", download_cache=tmp_path / "downloads")
    ctx.cache_dir.mkdir()
    (ctx.cache_dir / "out.xlsx").write_bytes(b"x" * 10)

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    loop: list = []
    loop.append(loop)
    assert _preview(str(ctx.cache_dir / "out.xlsx"), ctx) == "file out.xlsx (10 bytes)"
    assert _preview("README.md", ctx) == "README.md"  # a name outside the caches is a value, not a file
    monkeypatch.chdir(tmp_path)  # the default run.root_dir is relative: so are the getters' paths
    assert _preview("cache/out.xlsx", ctx) == "file out.xlsx (10 bytes)"
    assert _preview(str(Path(__file__)), ctx) == str(Path(__file__))  # nor is a file outside the caches
    assert _preview(Broken(), ctx) == "(could not be previewed: RuntimeError)"
    assert _preview(10**5000, ctx).startswith("(could not be previewed")
    assert len(_preview("y" * 5000, ctx)) < PREVIEW_CHARS + 40
    assert json.dumps(_preview({"nan": float("nan"), "loop": loop, "raw": b"\x00", "set": {1}}, ctx))
