"""Small network helpers shared by the actors, the engines and the tests."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now (for a server started just after; another process may still take
    it in between, so the caller must handle a bind failure)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
