"""The process a remote launcher runs on a host: one actor, driven over stdio.

    PYTHON -m guirl.cluster.agent --cluster NAME --host HOST --actor NAME   (spec and config on stdin)

stdin's first line is the actor's spec and the run's config (`guirl.cluster.launch.agent_payload`); the
rest of stdin is the lifeline: EOF stops the actor gracefully (SIGTERM to itself), and if it has not
exited `grace` seconds later the process exits anyway. stdout carries two JSON lines — `{"ready": NAME,
"pid": ..., "endpoints": [...]}` and, on a clean exit, `{"exit": "completed"|"shutdown", "reason": ...}`;
logs go to stderr. `--cluster` and `--host` are not used by the agent: they label its command line so
that `bin/launch_cluster --down` can find it. Only guirl's own actor classes are run.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import signal
import sys
import threading

import msgspec

MAX_PAYLOAD = 64 << 20


def read_payload(stream) -> tuple[bytes, bytes]:
    """The spec and config bytes from the first line; ValueError saying what is wrong otherwise."""
    line = stream.readline(MAX_PAYLOAD + 1)
    if not line:
        raise ValueError("no spec on stdin (it was closed before the first line)")
    if len(line) > MAX_PAYLOAD:
        raise ValueError(f"the spec line is over {MAX_PAYLOAD} bytes")
    try:
        raw = base64.b64decode(line.strip(), validate=True)
        parts = msgspec.msgpack.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise ValueError(f"the spec line is not base64 msgpack: {exc}") from None
    if not (isinstance(parts, list) and len(parts) == 2 and all(isinstance(p, bytes) for p in parts)):
        raise ValueError("the spec line must hold [spec bytes, config bytes]")
    return parts[0], parts[1]


def wait_for_eof(fd: int) -> None:
    """Block until `fd` (a lifeline: stdin from the launcher's ssh or srun) ends. On the raw fd: a thread
    blocked in the buffered reader would hold its lock while the interpreter shuts down."""
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except InterruptedError:
            continue
        except OSError:
            return


def _lifeline(fd: int, grace: float) -> None:
    """Block until stdin ends, then stop the actor; exit regardless after `grace` seconds."""
    wait_for_eof(fd)
    os.kill(os.getpid(), signal.SIGTERM)
    timer = threading.Timer(grace, lambda: os._exit(1))
    timer.daemon = True
    timer.start()


def _report_load(every: float) -> None:
    """The host's load average on stdout every `every` seconds (the launcher's live status shows it)."""
    stop = threading.Event()
    while not stop.wait(every):
        _report({"load": round(os.getloadavg()[0], 2)})


_report_lock = threading.Lock()


def _report(obj: dict) -> None:
    data = (json.dumps(obj) + "\n").encode()
    try:  # on the raw fd: a daemon thread in the buffered stdout could block the interpreter's shutdown
        with _report_lock:
            while data:
                data = data[os.write(1, data) :]
    except OSError:  # the launcher is gone; the lifeline stops us
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="guirl.cluster.agent", description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--actor", required=True)
    args = parser.parse_args(argv)

    from guirl.config import GuirlConfig
    from guirl.runtime.process import ActorSpec, build_actor, run_actor

    stdin = sys.stdin.buffer
    try:
        spec_bytes, cfg_bytes = read_payload(stdin)
        spec = msgspec.msgpack.decode(spec_bytes, type=ActorSpec)
        cfg = msgspec.msgpack.decode(cfg_bytes, type=GuirlConfig)
    except (ValueError, msgspec.DecodeError) as exc:
        print(f"guirl.cluster.agent ({args.actor} on {args.host}): {exc}", file=sys.stderr)
        return 2
    if spec.name != args.actor:
        print(f"guirl.cluster.agent: the spec is for {spec.name!r}, not {args.actor!r}", file=sys.stderr)
        return 2
    if not spec.target.startswith("guirl."):
        print(f"guirl.cluster.agent: {spec.target!r} is not one of guirl's actors", file=sys.stderr)
        return 2
    os.environ.update(spec.env)  # before torch (and CUDA) is imported
    if spec.cpus:
        os.sched_setaffinity(0, spec.cpus)
    if spec.run_dir:
        os.makedirs(spec.run_dir, exist_ok=True)
    from guirl.log import setup_logging

    setup_logging(spec.name, level=cfg.logging.level, fmt=cfg.logging.format)
    grace = cfg.supervisor.stop_timeout_s + 5.0
    threading.Thread(target=_lifeline, args=(stdin.fileno(), grace), name="lifeline", daemon=True).start()
    threading.Thread(target=_report_load, args=(5.0,), name="load", daemon=True).start()
    actor = build_actor(spec, cfg)

    def ready(endpoints: list[str]) -> None:
        _report({"ready": spec.name, "pid": os.getpid(), "host": args.host, "endpoints": endpoints})

    run_actor(actor, ready)
    _report({"exit": "completed" if actor.completed else "shutdown", "reason": actor.stop_reason})
    sys.stderr.flush()
    os._exit(0)  # not a normal interpreter shutdown: the lifeline and load threads are still running


if __name__ == "__main__":
    sys.exit(main())
