"""Per-step transport cost of a 1920×1080 screenshot: guirl's actor runtime vs raw pyzmq vs Flask+base64.

A fourth path, a bare zmq.asyncio DEALER/ROUTER echo with no guirl code at all, shows what pyzmq's own
asyncio layer costs by itself (guirl drives its sockets from their file descriptors instead).

One step = the screenshot one way (as an env worker's PolicyRequest carries it; the env pool of
OpenClaw-RL's GUI-RL carries it in its /step reply — the same bytes and the same encode/decode work) and a
small reply back.
All three servers run in their own spawned process; the three clients take turns in short interleaved
blocks within one run, so machine noise hits them alike. Prints medians, ratios, and one JSON line.

    python bench/transport.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import zmq  # noqa: E402
import zmq.asyncio  # noqa: E402

from bench.screens import photo_desktop, plain_desktop  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- servers (each in its own spawned process) -----------------------------------------------------


def raw_rep_server(port: int) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.bind(f"tcp://127.0.0.1:{port}")
    while True:
        frame = sock.recv(copy=False)
        if frame.bytes == b"stop":
            sock.send(b"bye")
            break
        sock.send(len(frame.buffer).to_bytes(8, "little"))
    sock.close(linger=0)
    ctx.term()


def zmq_asyncio_server(port: int) -> None:
    """A bare zmq.asyncio ROUTER echo, no guirl: what pyzmq's own asyncio layer costs by itself."""
    import uvloop
    import zmq.asyncio

    async def serve() -> None:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.bind(f"tcp://127.0.0.1:{port}")
        while True:
            frames = await sock.recv_multipart(copy=False)
            if frames[-1].bytes == b"stop":
                break
            await sock.send_multipart([frames[0], b"", len(frames[-1].buffer).to_bytes(8, "little")])
        sock.close(linger=0)
        ctx.term()

    uvloop.run(serve())


def flask_server(port: int) -> None:
    import logging

    from flask import Flask, jsonify, request

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = Flask("envpool")

    @app.post("/step")
    def step():  # GUI-RL's shape: JSON in, JSON out, screenshots base64-encoded
        payload = request.get_json()
        png = base64.b64decode(payload["observation"]["screenshot"])
        return jsonify({"ok": True, "size": len(png), "done": False, "reward": 0.0})

    app.run(host="127.0.0.1", port=port, threaded=True)


# --- clients ------------------------------------------------------------------------------------------


def time_raw(sock: zmq.Socket, png: bytes, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        sock.send(png, copy=len(png) < 65536)
        sock.recv()
        out.append(time.perf_counter() - t)
    return out


def time_flask(session, url: str, png: bytes, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        body = {
            "action": "pyautogui.click(100, 200)",
            "observation": {"screenshot": base64.b64encode(png).decode()},
        }
        reply = session.post(url, json=body, timeout=30).json()
        assert reply["size"] == len(png)
        out.append(time.perf_counter() - t)
    return out


async def time_zmq_asyncio(sock, png: bytes, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await sock.send_multipart([b"", png], copy=len(png) < 65536)
        await sock.recv_multipart()
        out.append(time.perf_counter() - t)
    return out


async def time_guirl(conn, png: bytes, n: int) -> list[float]:
    from guirl.messages import Blob
    from guirl.messages.types import Echo

    out = []
    for _ in range(n):
        t = time.perf_counter()
        reply = await conn.request(Echo(text="step", blobs=[Blob(png)], return_blobs=False))
        out.append(time.perf_counter() - t)
    assert reply.sizes == [len(png)]
    return out


async def run(quick: bool) -> dict:
    import requests

    from guirl.config import load_config
    from guirl.messages import DiagChannel
    from guirl.runtime.base import Actor
    from guirl.runtime.process import ActorSpec
    from guirl.runtime.supervisor import Supervisor

    screens = {"desktop": plain_desktop(), "photo": photo_desktop()}
    # (interleaved rounds, zmq reps per block, flask reps per block)
    plan = {
        "desktop": (6 if quick else 10, 100 if quick else 300, 20 if quick else 60),
        "photo": (6 if quick else 10, 15 if quick else 40, 3 if quick else 8),
    }
    spawn = mp.get_context("spawn")
    raw_port, flask_port, aio_port = _free_port(), _free_port(), _free_port()
    procs = [
        spawn.Process(target=raw_rep_server, args=(raw_port,), daemon=True),
        spawn.Process(target=flask_server, args=(flask_port,), daemon=True),
        spawn.Process(target=zmq_asyncio_server, args=(aio_port,), daemon=True),
    ]
    for p in procs:
        p.start()
    cfg = load_config(overrides=["logging.level=WARNING"])
    zctx = zmq.Context()
    raw = zctx.socket(zmq.REQ)
    raw.connect(f"tcp://127.0.0.1:{raw_port}")
    actx = zmq.asyncio.Context()
    aio = actx.socket(zmq.DEALER)
    aio.connect(f"tcp://127.0.0.1:{aio_port}")
    session = requests.Session()
    url = f"http://127.0.0.1:{flask_port}/step"
    for _ in range(200):  # Flask is up when it answers
        try:
            session.post(url, json={"observation": {"screenshot": ""}}, timeout=1)
            break
        except requests.ConnectionError:
            await asyncio.sleep(0.05)
    modes = ("guirl", "raw", "zmq_asyncio", "flask")
    results: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in screens}
    async with Supervisor(cfg) as sup:
        server = await sup.start(
            ActorSpec(name="echo", target="guirl.actors.echo:EchoActor", bind=["tcp://127.0.0.1:0"])
        )
        client = Actor("bench", runtime=cfg.runtime)
        task = await client.start()
        conn = client.connect("echo", server.endpoints[0], DiagChannel)
        await conn.wait_alive(10)
        for name, png in screens.items():
            rounds, reps, freps = plan[name]
            # warm-up, not recorded
            await time_guirl(conn, png, 5)
            time_raw(raw, png, 5)
            await time_zmq_asyncio(aio, png, 5)
            time_flask(session, url, png, 2)
            for _ in range(rounds):
                results[name]["guirl"] += await time_guirl(conn, png, reps)
                results[name]["raw"] += time_raw(raw, png, reps)
                results[name]["zmq_asyncio"] += await time_zmq_asyncio(aio, png, reps)
                results[name]["flask"] += time_flask(session, url, png, freps)
        client.request_shutdown("bench done")
        await task
    raw.send(b"stop")
    raw.recv()
    raw.close(linger=0)
    zctx.term()
    await aio.send_multipart([b"", b"stop"])
    aio.close(linger=100)
    actx.term()
    procs[1].terminate()
    for p in procs:
        p.join(5)
    figures: dict = {"bench": "transport", "png_bytes": {k: len(v) for k, v in screens.items()}}
    med = {k: {m: statistics.median(v) * 1e3 for m, v in r.items()} for k, r in results.items()}
    figures["median_ms"] = {k: {m: round(x, 4) for m, x in v.items()} for k, v in med.items()}
    figures["samples"] = {k: {m: len(v) for m, v in r.items()} for k, r in results.items()}
    figures["guirl_over_raw"] = {k: round(v["guirl"] / v["raw"], 3) for k, v in med.items()}
    figures["flask_over_guirl"] = {k: round(v["flask"] / v["guirl"], 2) for k, v in med.items()}
    # the whole guirl runtime (codec, correlation, counters, heartbeats) vs pyzmq's bare asyncio layer
    figures["guirl_over_zmq_asyncio_bare"] = {
        k: round(v["guirl"] / v["zmq_asyncio"], 3) for k, v in med.items()
    }
    figures["targets_met"] = {
        "guirl_le_2x_raw": all(x <= 2.0 for x in figures["guirl_over_raw"].values()),
        "guirl_ge_10x_faster_than_flask_photo": figures["flask_over_guirl"]["photo"] >= 10.0,
    }
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run, ~10 s)")
    args = ap.parse_args()
    import uvloop

    figures = uvloop.run(run(args.quick))
    print(
        f"{'screenshot':<10} {'PNG':>10} {'guirl ms':>9} {'raw ms':>9} {'z.asyncio':>10} {'flask ms':>9} "
        f"{'guirl/raw':>10} {'flask/guirl':>12}"
    )
    for k, m in figures["median_ms"].items():
        print(
            f"{k:<10} {figures['png_bytes'][k]:>10} {m['guirl']:>9.3f} {m['raw']:>9.3f} "
            f"{m['zmq_asyncio']:>10.3f} {m['flask']:>9.3f} "
            f"{figures['guirl_over_raw'][k]:>10.2f} {figures['flask_over_guirl'][k]:>12.1f}"
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
