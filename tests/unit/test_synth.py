"""Synthetic grounding rows: deterministic, held-out test split, ground truth consistent with the screen; the
`guirl data` command's `synth` and `check`."""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from guirl.data.cli import add_arguments, main
from guirl.data.rows import load_rows, write_rows_jsonl
from guirl.data.synth import DEFAULT_SIZES, VOCAB, synthesize, synthesize_samples

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def train():
    return list(synthesize_samples(48, seed=11, split="train"))


@pytest.fixture(scope="module")
def test_split():
    return list(synthesize_samples(48, seed=11, split="test"))


def labels(split: str) -> set[str]:
    return {label for kind, words in VOCAB[split].items() if kind != "text" for label in words}


def test_same_seed_same_bytes_and_rows_independent_of_n():
    a = list(synthesize(6, seed=3))
    assert a == list(synthesize(6, seed=3))
    assert list(synthesize(3, seed=3)) == a[:3]
    assert list(synthesize(0, seed=3)) == [] and len(a) == 6


def test_different_seeds_and_splits_differ():
    a, b, t = (list(synthesize(4, seed=s, split=sp)) for s, sp in ((1, "train"), (2, "train"), (1, "test")))
    assert all(x.image != y.image for x, y in zip(a, b))
    assert all(x.image != y.image for x, y in zip(a, t))
    assert len({r.instruction for r in a + b}) > 4


def test_train_and_test_vocabularies_are_disjoint(train, test_split):
    assert not labels("train") & labels("test")
    assert not set(VOCAB["train"]["text"]) & set(VOCAB["test"]["text"])
    for samples, split in ((train, "train"), (test_split, "test")):
        for s in samples:
            assert {e.label for e in s.elements} <= labels(split), s.row.id


def test_boxes_inside_the_image_and_match_the_target(train, test_split):
    for s in train + test_split:
        row, (x1, y1, x2, y2) = s.row, s.target.box
        with Image.open(io.BytesIO(row.image)) as img:
            assert img.size == (row.width, row.height) and img.format == "PNG"
            crop = img.convert("L").crop(s.target.box)
        assert 0 <= x1 < x2 <= row.width and 0 <= y1 < y2 <= row.height
        assert len(row.gt_bbox) == 4 and all(0.0 <= v <= 1.0 for v in row.gt_bbox)
        assert row.gt_bbox == pytest.approx(
            (x1 / row.width, y1 / row.height, x2 / row.width, y2 / row.height)
        )
        low, high = crop.getextrema()
        assert high - low > 40, f"{row.id}: nothing drawn in the target's box"


def test_target_is_named_and_unambiguous(train, test_split):
    for s in train + test_split:
        row, target = s.row, s.target
        assert target.label in row.instruction, (row.instruction, target)
        assert [e.label for e in s.elements].count(target.label) == 1
        others = [e for e in s.elements if e is not target and {e.kind, target.kind} != {"list", "list_item"}]
        assert not any(_overlap(e.box, target.box) for e in others), row.id
        assert len(s.elements) >= 5  # distractors stay on screen
        if row.gt_action == "type":
            assert target.kind == "field" and f"'{row.gt_input_text}'" in row.instruction
        if row.gt_action == "scroll":
            assert target.kind == "list" and row.gt_input_text in ("up", "down")
            assert row.gt_input_text in row.instruction
            assert (target.state, row.gt_input_text) not in (("top", "up"), ("bottom", "down"))


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_mix_of_actions_sizes_and_task_types(train, test_split):
    for samples in (train, test_split):
        rows = [s.row for s in samples]
        assert {(r.width, r.height) for r in rows} == set(DEFAULT_SIZES)
        actions = {r.gt_action for r in rows}
        assert {"click", "type"} <= actions <= {"click", "type", "scroll"}
        assert all(r.task_type == "high" for r in rows if r.gt_action != "click")
        assert {r.task_type for r in rows if r.gt_action == "click"} == {"low", "high"}
        assert len({s.target.kind for s in samples}) >= 5
        assert all(r.domain == "synth-" + s.target.kind.replace("_", "-") for r, s in zip(rows, samples))


def test_response_is_gui_r1_answer_in_image_pixels(train):
    for s in train:
        row = s.row
        match = re.fullmatch(r"<think> (.+) </think> <answer>(\[.*\])</answer>", row.response)
        assert match, row.response
        (answer,) = ast.literal_eval(match.group(2))
        assert answer["action"] == row.gt_action
        if row.gt_action == "click":
            x, y = answer["point"]
            x1, y1, x2, y2 = s.target.box
            assert x1 <= x < x2 and y1 <= y < y2 and answer["input_text"] == "no input text"
        else:
            assert answer["point"] == [-100, -100] and answer["input_text"] == row.gt_input_text


def test_rows_load_back(tmp_path, train):
    rows = [s.row for s in train[:8]]
    write_rows_jsonl(rows, tmp_path / "rows.jsonl")
    assert load_rows(tmp_path / "rows.jsonl") == rows


def test_workers_give_the_same_rows():
    assert list(synthesize(5, seed=4, split="test", workers=2)) == list(synthesize(5, seed=4, split="test"))


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        synthesize(1, seed=0, split="validation")
    with pytest.raises(ValueError, match="n must be"):
        synthesize(-1, seed=0)
    with pytest.raises(ValueError, match="sizes"):
        synthesize(1, seed=0, sizes=((100, 100),))


# --- `guirl data` ----------------------------------------------------------------------------------
# guirl/cli/main.py does not register `data` yet (pending): main() is driven with its own parser here, and the
# subprocess test runs once the command is registered.


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="guirl data")
    add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_synth_jsonl_and_check(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(parse("synth", str(out), "--n", "6", "--seed", "2", "--split", "test")) == 0
    text = capsys.readouterr().out
    assert "wrote 6 test rows (seed 2)" in text and "by action: click" in text and "640x400 2" in text
    rows = load_rows(out / "rows.jsonl")
    assert rows == list(synthesize(6, seed=2, split="test"))
    assert main(parse("check", str(out / "rows.jsonl"))) == 0
    assert f"{out / 'rows.jsonl'}: 6 rows" in capsys.readouterr().out


def test_cli_synth_parquet(tmp_path, capsys):
    assert main(parse("synth", str(tmp_path), "--n", "4", "--seed", "1", "--format", "parquet")) == 0
    assert load_rows(tmp_path / "rows.parquet") == list(synthesize(4, seed=1))
    assert not (tmp_path / "rows.jsonl").exists()


def test_cli_check_broken_file(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"instruction": "x"}\n')
    assert main(parse("check", str(path))) == 2
    assert "bad.jsonl row 0 (line 1, id 'bad:0'): missing or empty gt_action" in capsys.readouterr().err
    assert main(parse("check", str(path), "--skip-bad")) == 1
    assert "0 rows, 1 broken" in capsys.readouterr().out


def _registered() -> bool:
    from guirl.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return "data" in sub.choices


@pytest.mark.skipif(not _registered(), reason="`guirl data` is not registered in guirl/cli/main.py yet")
def test_guirl_data_synth_command(tmp_path):
    cmd = [sys.executable, "-m", "guirl", "data", "synth", str(tmp_path), "--n", "3", "--seed", "5"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "wrote 3 train rows" in out.stdout
    assert load_rows(tmp_path / "rows.jsonl") == list(synthesize(3, seed=5))
