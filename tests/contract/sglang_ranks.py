"""SGLang server ranks as child processes, for the contract tests: each runs SGLang's own weight-update code
(`guirl.testing.sglang_upstream.WeightSide`: the scheduler's manager over the model runner's `WeightUpdater`)
and answers the weight routes' bodies sent to it, as one TP rank of a server does. A server with tensor
parallelism is several such ranks with a TP group of their own, each receiving every request (SGLang's
tokenizer manager fans a control request out to all of them).

Ranks are spawned (never forked: SGLang and torch.distributed state stay in the child) and talk over a pipe.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from dataclasses import dataclass
from typing import Any


def _rank_main(conn: Any, ckpt: str, tp_size: int, tp_rank: int, tp_port: int) -> None:
    try:
        import torch
        import torch.distributed as dist

        from guirl.testing.sglang_upstream import load

        sglang = load()
        sglang.publish(
            sglang.server_args(["--model-path", ckpt, "--device", "cpu", "--tp-size", str(tp_size)])
        )
        if tp_size > 1:  # the server's TP group (its begin/end of a session barrier on it)
            store = dist.TCPStore("127.0.0.1", tp_port, tp_size, is_master=tp_rank == 0)
            dist.init_process_group("gloo", store=store, rank=tp_rank, world_size=tp_size)
        loaded: list[tuple[str, torch.Tensor]] = []
        versions: list[str | None] = []
        side = sglang.weight_side(loaded.extend, versions.append, tp_rank=tp_rank)
        conn.send(("ready", sglang.version))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            cmd, *args = conn.recv()
        except EOFError:
            return
        try:
            if cmd == "call":
                reply: Any = side.call(*args)
            elif cmd == "loaded":  # what the model was given since the last ask, as plain data
                reply = [
                    (
                        n,
                        str(t.dtype).removeprefix("torch."),
                        list(t.shape),
                        t.contiguous().view(-1).view(torch.uint8).tolist(),
                    )
                    for n, t in loaded
                ]
                loaded.clear()
            elif cmd == "versions":
                reply = list(versions)
            elif cmd == "stop":
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", reply))
        except Exception as exc:  # a body the server would not parse (FastAPI's 422), or a bug: say it
            conn.send(("raised", f"{type(exc).__name__}: {exc}"))


@dataclass
class Rank:
    """The parent's end of one rank."""

    process: Any
    conn: Any

    def send(self, *cmd: Any) -> None:
        self.conn.send(cmd)

    def reply(self, timeout: float = 120.0) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"rank {self.process.pid} did not answer within {timeout} s")
        status, value = self.conn.recv()
        if status == "raised":
            raise RuntimeError(value)
        return value

    def ask(self, *cmd: Any, timeout: float = 120.0) -> Any:
        self.send(*cmd)
        return self.reply(timeout)


class Server:
    """One SGLang server's ranks (`tp_size` of them)."""

    def __init__(self, ckpt: str, tp_size: int) -> None:
        from guirl.net import free_port

        ctx = mp.get_context("spawn")
        port = free_port() if tp_size > 1 else 0
        self.ranks: list[Rank] = []
        for tp_rank in range(tp_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(child, ckpt, tp_size, tp_rank, port), daemon=True)
            proc.start()
            self.ranks.append(Rank(proc, parent))

    def wait_ready(self, timeout: float = 300.0) -> str:
        versions = set()
        for rank in self.ranks:
            if not rank.conn.poll(timeout):
                raise TimeoutError("an SGLang rank did not load in time")
            status, value = rank.conn.recv()
            if status != "ready":
                raise RuntimeError(f"an SGLang rank failed to start:\n{value}")
            versions.add(value)
        (version,) = versions
        return version

    def send(self, route: str, body: dict[str, Any]) -> None:
        """A control request, as the server hands it to every TP rank."""
        for rank in self.ranks:
            rank.send("call", route, body)

    def replies(self, timeout: float = 120.0) -> list[tuple[bool, str]]:
        return [rank.reply(timeout) for rank in self.ranks]

    def call(self, route: str, body: dict[str, Any], timeout: float = 120.0) -> list[tuple[bool, str]]:
        self.send(route, body)
        return self.replies(timeout)

    def close(self) -> None:
        for rank in self.ranks:
            try:
                rank.send("stop")
            except (BrokenPipeError, OSError):
                pass
        for rank in self.ranks:
            rank.process.join(10)
            if rank.process.is_alive():
                rank.process.kill()
