"""Process helpers every layer may use (no guirl imports)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

try:  # resolved at import: a forked child of a threaded process (a preexec_fn) must not dlopen
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):
    _PRCTL = None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send us `sig` when our parent dies (even by SIGKILL): no orphaned actors, ranks,
    ssh/srun clients or inference servers."""
    if _PRCTL is not None:
        _PRCTL(1, sig)  # PR_SET_PDEATHSIG


def pid_alive(pid: object) -> bool:
    """Whether a process `pid` exists (one of another user's counts); False for anything not a pid."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmdline(pid: int) -> str:
    """Process `pid`'s command line, its arguments joined by spaces ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
