"""Applications' settings and state: GIMP, VLC, VS Code (OSWorld's getters/gimp.py, vlc.py, vscode.py)."""

from __future__ import annotations

from typing import Any

from guirl.vmpool.client import VMClient
from guirl.vmpool.tasks.getters import apps_vlc_vscode
from guirl.vmpool.tasks.getters.base import Getter, save
from guirl.vmpool.tasks.setup import TaskContext

GIMP_CONFIG_DIR = "~/.config/GIMP/2.10"
"""GIMP 2.10's settings directory on the VM (OSWorld's getter hard-codes this version)."""


async def gimp_config_file(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """GIMP's settings file `config["file_name"]` (gimprc, sessionrc) from the VM user's profile, saved as
    `cache_dir/config["dest"]`; None when the VM has no such file or it is empty (as OSWorld returns)."""
    # OSWorld asks the VM's Python to expand `~` first; both servers expand it in /file themselves
    data = await client.get_file(f"{GIMP_CONFIG_DIR}/{config['file_name']}")
    if not data:
        return None
    local = save(ctx, config["dest"], data)
    return str(local)


GETTERS: dict[str, Getter] = {
    "gimp_config_file": gimp_config_file,
}
"""This family's getters, by OSWorld's names."""
GETTERS.update(apps_vlc_vscode.GETTERS)  # VLC and VS Code
