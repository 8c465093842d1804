"""The desktop's windows and accessibility tree (OSWorld's getters/info.py `vm_window_size`, misc.py
`accessibility_tree`); merged into info.py's `GETTERS`."""

from __future__ import annotations

import json
from typing import Any

from guirl.vmpool.client import VMClient, VMTransientError
from guirl.vmpool.tasks.getters.base import Getter
from guirl.vmpool.tasks.setup import TaskContext


async def accessibility_tree(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """The desktop's accessibility tree as OSWorld's server serialises it (XML text, `GET /accessibility`).

    A desktop without AT-SPI answers 501, one whose tree cannot be read in time 503: the client's error
    propagates and the task cannot be scored there (an environment fault), rather than scoring the policy 0
    for the desktop's limitation. OSWorld's getter would give None, on which its metrics raise.
    """
    return await client.accessibility_tree()


async def vm_window_size(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:
    """`{width, height}` of the first window whose WM class is `app_class_name`; None when there is none.

    Both OSWorld's server and guirl's answer 500 when no window has that class (OSWorld's handler returns
    None, which Flask turns into a 500); OSWorld's getter then gives None, and so does this one. A VM that
    does not answer at all (no status) still raises.
    """
    try:
        body = (
            await client._call(
                "POST", "/window_size", idempotent=True, data={"app_class_name": config["app_class_name"]}
            )
        )[1]
    except VMTransientError as exc:
        if exc.status == 500:
            return None
        raise
    return json.loads(body)


GETTERS: dict[str, Getter] = {
    "accessibility_tree": accessibility_tree,
    "vm_window_size": vm_window_size,
}
"""The desktop's getters, by OSWorld's names."""
