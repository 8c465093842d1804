"""`guirl data`: single-step grounding data.

guirl data synth OUT --n N --seed S [--split train|test] [--format jsonl|parquet] [--workers W]
                               synthetic rows: OUT/rows.jsonl (+ OUT/images/) or OUT/rows.parquet
guirl data check PATH [--limit N] [--image-root DIR] [--skip-bad]
                               load a .jsonl/.parquet file, every row checked; a summary of its rows
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from guirl.data.rows import GroundingRow, RowError, load_rows, write_rows_jsonl, write_rows_parquet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `data` command's subcommands, on the parser `guirl.cli` made for it."""
    from guirl.data.synth import SPLITS

    sub = parser.add_subparsers(dest="data_cmd", required=True, metavar="{synth,check}")
    synth = sub.add_parser("synth", help="write synthetic GUI grounding rows (screens drawn with PIL)")
    synth.add_argument("out", metavar="OUT", help="output directory (created if missing)")
    synth.add_argument("--n", type=int, required=True, help="rows to write")
    synth.add_argument("--seed", type=int, default=0, help="same seed, split and n: same bytes")
    synth.add_argument(
        "--split", choices=SPLITS, default="train", help="test: held-out labels and layouts (default train)"
    )
    synth.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl", help="default jsonl")
    synth.add_argument("--workers", type=int, default=1, help="processes drawing screens (same output)")
    check = sub.add_parser("check", help="load a dataset file, every row checked; summarise its rows")
    check.add_argument("path", metavar="PATH", help="a .jsonl or .parquet file")
    check.add_argument("--limit", type=int, default=0, help="only the first N rows (0 = all)")
    check.add_argument("--image-root", help="directory image paths are relative to (default: the file's)")
    check.add_argument(
        "--skip-bad", action="store_true", help="report every broken row instead of stopping at the first"
    )


def main(args: argparse.Namespace) -> int:
    """Run `guirl data <subcommand>`; a bad input file is exit status 2 with the row named."""
    try:
        if args.data_cmd == "synth":
            return _synth(args)
        return _check(args)
    except RowError as exc:
        print(f"guirl data: {exc}", file=sys.stderr)
        return 2


def _synth(args: argparse.Namespace) -> int:
    from guirl.data.synth import synthesize

    if args.n < 0 or args.workers < 1:
        print("guirl data synth: --n must be >= 0 and --workers >= 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    counts: dict[str, Counter[str]] = {"action": Counter(), "size": Counter(), "task_type": Counter()}
    rows = _counted(synthesize(args.n, seed=args.seed, split=args.split, workers=args.workers), counts)
    path = out / f"rows.{args.format}"
    if args.format == "jsonl":
        write_rows_jsonl(rows, path)
    else:
        write_rows_parquet(rows, path)
    seconds = time.monotonic() - started
    rate = f"{args.n / seconds:.0f} rows/s" if seconds > 0 else "-"
    print(f"wrote {args.n} {args.split} rows (seed {args.seed}) to {path} in {seconds:.2f} s ({rate})")
    for name, counter in counts.items():
        print(f"  by {name}: {_counts(counter)}")
    return 0


def _counted(rows: Iterable[GroundingRow], counts: dict[str, Counter[str]]) -> Iterator[GroundingRow]:
    for row in rows:
        counts["action"][row.gt_action] += 1
        counts["size"][f"{row.width}x{row.height}"] += 1
        counts["task_type"][row.task_type] += 1
        if "domain" in counts:
            counts["domain"][row.domain or "-"] += 1
        yield row


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{key} {n}" for key, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def _check(args: argparse.Namespace) -> int:
    errors: list[RowError] = []
    root = Path(args.image_root) if args.image_root else None
    rows = load_rows(args.path, limit=args.limit, image_root=root, skip_bad=args.skip_bad, errors=errors)
    counts: dict[str, Counter[str]] = {k: Counter() for k in ("action", "domain", "task_type", "size")}
    for _ in _counted(rows, counts):
        pass
    print(f"{args.path}: {len(rows)} rows" + (f", {len(errors)} broken" if errors else ""))
    for name, counter in counts.items():
        shown = Counter(dict(counter.most_common(12)))
        more = f" (+{len(counter) - len(shown)} more)" if len(counter) > len(shown) else ""
        print(f"  by {name}: {_counts(shown)}{more}")
    for exc in errors:
        print(f"  broken: {exc}")
    return 1 if errors else 0
