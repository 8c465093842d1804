"""Applications' settings: VS Code, Thunderbird, VLC (OSWorld's metrics/vscode.py, thunderbird.py, vlc.py)."""

from __future__ import annotations

from collections.abc import Callable

METRICS: dict[str, Callable[..., float]] = {}
"""This family's metrics, by OSWorld's names."""
