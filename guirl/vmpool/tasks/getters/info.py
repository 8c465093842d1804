"""The desktop's state: window size, wallpaper, accessibility tree, slides' media, relative-time rules
(OSWorld's getters/info.py, misc.py, impress.py, file.py).
"""

from __future__ import annotations

from guirl.vmpool.tasks.getters import desktop, info_files
from guirl.vmpool.tasks.getters.base import Getter

GETTERS: dict[str, Getter] = {}
"""This family's getters, by OSWorld's names."""
GETTERS.update(desktop.GETTERS)  # accessibility_tree, vm_window_size
GETTERS.update(info_files.GETTERS)  # audio/background_image_in_slide, content_from_vm_file, vm_wallpaper
