"""Prompt rendering in processes of its own, for the SGLang engines of one broker
(`inference.sglang.render_processes`).

The broker renders each request's chat prompt into the exact token ids it sends SGLang (the template, the
tokenizer, each image's pad run from its header: `sglang_api.render_request`), about 4.4 ms of CPU per
full-HD request. On the engines' threads that work shares the broker's one interpreter, so one broker renders
about 230 requests/s whatever the cores of its host: near a thousand desktops stepping every 5 s, the first
central limit (docs/scale.md). A `RenderPool` runs it in `processes` worker processes instead, each with the
checkpoint's renderer loaded once, so a broker renders on as many cores as it is given; the broker's own
process keeps the messaging (about 0.85 ms per step).

The engines of a broker share one pool per checkpoint (`RenderPool.shared`). A request the renderer refuses
fails alone (ValueError, as on the thread); a worker that dies fails the requests it held as retryable
engine errors and the next request starts a fresh pool; a checkpoint whose renderer cannot load fails the
engine's start.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, ClassVar

from guirl.inference.base import EngineError, GenRequest

log = logging.getLogger(__name__)

_renderer: Any = None  # in a worker process: the checkpoint's ChatRenderer


def _load(ckpt_dir: str) -> None:
    """A worker's initializer: the renderer, once."""
    global _renderer
    from guirl.inference.sglang_api import load_renderer

    _renderer = load_renderer(Path(ckpt_dir))


def _vocab() -> int:
    """The loaded renderer's tokenizer size (proves a worker loaded it)."""
    return len(_renderer.tokenizer)


def _render(req: GenRequest) -> list[int]:
    """In a worker: the request's exact prompt ids (ValueError for a request the renderer refuses)."""
    from guirl.inference.sglang_api import render_request

    ids, _ = render_request(_renderer, req)
    return ids


class RenderPool:
    """See the module docstring."""

    _shared: ClassVar[dict[tuple[str, int], RenderPool]] = {}

    def __init__(self, ckpt_dir: str | Path, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"a render pool needs at least one process, not {processes}")
        self.ckpt_dir, self.processes = str(ckpt_dir), processes
        self.users = 0
        self.restarts = 0
        self._pool: ProcessPoolExecutor | None = None

    @classmethod
    def shared(cls, ckpt_dir: str | Path, processes: int) -> RenderPool:
        """The pool of this process for `ckpt_dir` (made on first use); `release` it when done."""
        key = (str(ckpt_dir), processes)
        pool = cls._shared.get(key)
        if pool is None:
            pool = cls._shared[key] = cls(ckpt_dir, processes)
        pool.users += 1
        return pool

    async def start(self) -> None:
        """Start the workers and check that one loads the renderer (EngineError, not retryable, if not)."""
        try:
            await self._run(_vocab)
        except EngineError as exc:
            raise EngineError(f"render processes for {self.ckpt_dir}: {exc}", retryable=False) from None

    async def render(self, req: GenRequest) -> list[int]:
        """`req`'s exact prompt ids, rendered in a worker (ValueError: the renderer refuses the request)."""
        light = GenRequest(messages=req.messages, images=req.images, prompt_ids=req.prompt_ids)
        return await self._run(_render, light)

    async def _run(self, fn: Any, *args: Any) -> Any:
        pool = self._executor()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool as exc:  # a worker died (or could not load the renderer)
            if self._pool is pool:
                self._pool = None  # the next request starts a fresh pool
                self.restarts += 1
                pool.shutdown(wait=False, cancel_futures=True)
            raise EngineError(f"a render process died: {exc}", retryable=True) from None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawned, not forked: the broker has threads and an event loop running
            self._pool = ProcessPoolExecutor(
                max_workers=self.processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_load,
                initargs=(self.ckpt_dir,),
            )
        return self._pool

    def release(self) -> None:
        """One engine done with it; the last one stops the workers."""
        self.users -= 1
        if self.users > 0:
            return
        self._shared.pop((self.ckpt_dir, self.processes), None)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
