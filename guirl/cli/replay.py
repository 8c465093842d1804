"""`guirl replay` / `bin/replay`: list, filter, print, export and re-send recorded messages.

    replay [list] LOG...  [filters]            one line per message
    replay show LOG... INDEX                   one message as JSON
    replay export LOG... --out DIR [filters]   the screenshots (PNG/JPEG blobs) of the selected messages
    replay send LOG... --to ENDPOINT [--speed X] [--keys DIR] [filters]
                                               re-send the selected messages to a live actor

LOG is a segment file or a directory of them. Filters: --type, --episode, --actor, --dir, --since,
--until (epoch seconds, ISO 8601, or +S seconds after the first message).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from guirl.msglog.format import MsgLogError
from guirl.msglog.query import RecordFilter, export_screenshots, record_to_json
from guirl.msglog.reader import LogReader, Record

COMMANDS = ("list", "show", "export", "send")


def _time_arg(text: str | None, first_t: float | None) -> float | None:
    if text is None:
        return None
    try:
        if text.startswith("+"):
            if first_t is None:
                return None
            return first_t + float(text[1:])
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"replay: bad time {text!r}: use epoch seconds, ISO 8601 or +SECONDS") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="replay_cmd", metavar="{list,show,export,send}")
    for name, helptext in (
        ("list", "one line per message"),
        ("show", "one message as JSON"),
        ("export", "write the selected messages' screenshots"),
        ("send", "re-send the selected messages to a live actor"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("logs", nargs="+", metavar="LOG", help="segment file(s) or directories")
        if name == "show":
            p.add_argument("--index", "-n", type=int, required=True, help="the message's index (see list)")
            continue
        p.add_argument("--type", action="append", help="message type tag (repeatable), e.g. policy_request")
        p.add_argument("--episode", help="episode id")
        p.add_argument("--actor", help="recording actor or sender")
        p.add_argument("--dir", choices=("in", "out"), help="direction as recorded")
        p.add_argument("--since", help="start time (epoch s, ISO 8601, or +S after the first message)")
        p.add_argument("--until", help="end time, exclusive (same forms)")
        if name == "list":
            p.add_argument("--json", action="store_true", help="one JSON object per line")
        if name == "export":
            p.add_argument("--out", required=True, help="output directory")
        if name == "send":
            p.add_argument("--to", required=True, metavar="ENDPOINT", help="e.g. tcp://127.0.0.1:5555")
            p.add_argument(
                "--speed",
                type=float,
                default=1.0,
                help="timing: 1 = as recorded, 10 = ten times faster, 0 = as fast as possible",
            )
            p.add_argument("--wait", type=float, default=5.0, help="seconds to wait for replies at the end")
            p.add_argument(
                "--keys",
                default="",
                metavar="DIR",
                help="the cluster's CURVE key directory, for an actor that admits only its keys",
            )


def _select(reader: LogReader, args: argparse.Namespace) -> list[Record]:
    # several actors' logs interleave by time; `index` stays the read order, for `show -n`
    records = sorted(reader, key=lambda r: r.t)
    first_t = records[0].t if records else None
    flt = RecordFilter(
        types=set(args.type) if args.type else None,
        episode=args.episode,
        actor=args.actor,
        direction=args.dir,
        since=_time_arg(args.since, first_t),
        until=_time_arg(args.until, first_t),
    )
    return [r for r in records if flt.match(r)]


def _line(r: Record) -> str:
    when = dt.datetime.fromtimestamp(r.t, dt.UTC).strftime("%H:%M:%S.%f")[:-3]
    ep = r.body.get("episode_id", "")
    extra = f" episode={ep}" if ep else ""
    return (
        f"{r.index:>6} {when} {r.actor:<12} {r.direction:<3} {r.sock:<12} {r.type or '?':<20} "
        f"from={r.header.get('sender', '?')} blobs={len(r.blobs)}{extra}"
    )


def run(args: argparse.Namespace) -> int:
    cmd = args.replay_cmd or "list"
    reader = LogReader([Path(p) for p in args.logs])
    try:
        if cmd == "show":
            for r in reader:
                if r.index == args.index:
                    print(json.dumps(record_to_json(r), indent=2))
                    return 0
            print(f"replay: no message with index {args.index}", file=sys.stderr)
            return 1
        selected = _select(reader, args)
        if cmd == "list":
            for r in selected:
                print(json.dumps(record_to_json(r)) if args.json else _line(r))
            print(f"{len(selected)} messages", file=sys.stderr)
        elif cmd == "export":
            paths = export_screenshots(reader, selected, args.out)
            print(f"wrote {len(paths)} screenshots to {args.out}")
        elif cmd == "send":
            from guirl.runtime.replay import replay_to

            report = replay_to(
                reader, selected, args.to, speed=args.speed, wait_s=args.wait, keys_dir=args.keys
            )
            print(json.dumps(report.as_dict()))
            if report.unsent:
                print(
                    f"replay: {report.unsent} messages not sent: {args.to} did not take them", file=sys.stderr
                )
                return 1
    except MsgLogError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    finally:
        for w in reader.warnings:
            print(f"replay: warning: {w}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`bin/replay`: the subcommand may be omitted (`replay LOG...` lists)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv.insert(0, "list")
    parser = argparse.ArgumentParser(prog="replay", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
