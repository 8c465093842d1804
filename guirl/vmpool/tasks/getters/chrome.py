"""Chrome's state through the DevTools Protocol on the VM's debugging port, and its profile files (OSWorld's
getters/chrome.py).
"""

from __future__ import annotations

from guirl.vmpool.tasks.getters.base import Getter

GETTERS: dict[str, Getter] = {}
"""This family's getters, by OSWorld's names."""
