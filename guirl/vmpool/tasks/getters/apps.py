"""Applications' settings and state: GIMP, VLC, VS Code (OSWorld's getters/gimp.py, vlc.py, vscode.py)."""

from __future__ import annotations

from guirl.vmpool.tasks.getters.base import Getter

GETTERS: dict[str, Getter] = {}
"""This family's getters, by OSWorld's names."""
