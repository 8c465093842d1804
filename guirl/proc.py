"""Process helpers every layer may use (no guirl imports)."""

from __future__ import annotations

import ctypes
import signal
import sys

try:  # resolved at import: a forked child of a threaded process (a preexec_fn) must not dlopen
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):
    _PRCTL = None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send us `sig` when our parent dies (even by SIGKILL): no orphaned actors, ranks,
    ssh/srun clients or inference servers."""
    if _PRCTL is not None:
        _PRCTL(1, sig)  # PR_SET_PDEATHSIG
