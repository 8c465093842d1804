"""A diagnostic actor: answers `Echo` (after an optional delay), used by the demo, tests and benchmarks.

Fault injection is configuration, not monkeypatching: `crash_on` names an `Echo.text` that makes the
process exit abruptly (as a crash would), `fail_on` one that makes the handler raise.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import msgspec

from guirl.messages import DiagChannel
from guirl.messages.types import Echo, EchoReply, Message
from guirl.runtime.base import Actor, Request

log = logging.getLogger(__name__)


class EchoOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    crash_on: str = ""
    """An `Echo.text` that makes the process exit abruptly, as a crash would."""
    fail_on: str = ""
    """An `Echo.text` that makes the handler raise."""


class EchoActor(Actor):
    """Echoes text and blobs; `Echo.delay_s` simulates a slow handler."""

    channel = DiagChannel
    Options = EchoOptions

    def __init__(self, name: str, options: EchoOptions | None = None, **runtime: Any) -> None:
        super().__init__(name, **runtime)
        options = options or EchoOptions()
        self.crash_on = options.crash_on
        self.fail_on = options.fail_on

    async def handle(self, req: Request) -> Message | None:
        match req.msg:
            case Echo(text=text) if self.crash_on and text == self.crash_on:
                log.error("crash injected by configuration (crash_on=%r)", text)
                os._exit(70)
            case Echo(text=text) if self.fail_on and text == self.fail_on:
                raise RuntimeError(f"failure injected by configuration (fail_on={text!r})")
            case Echo(text=text, blobs=blobs, delay_s=delay, return_blobs=ret):
                if delay > 0:
                    await asyncio.sleep(delay)
                return EchoReply(text=text, blobs=blobs if ret else [], sizes=[len(b) for b in blobs])
        return await super().handle(req)
