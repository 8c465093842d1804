"""Getters: how an evaluator obtains what it scores (a file from the VM, a command's output, a rule, an
application's settings, a browser's state).

Each is `await get(config, client, ctx)`; `config["type"]` names it, by OSWorld's name. A file getter
returns the local path of the fetched file (None when the VM has no such file, as OSWorld does), or a
list when `multi`. One module per family, as OSWorld's `evaluators/getters/` has; each exports `GETTERS`.
"""

from __future__ import annotations

from typing import Any

from guirl.vmpool.client import VMClient
from guirl.vmpool.tasks.getters import apps, base, chrome, info
from guirl.vmpool.tasks.setup import TaskContext


class UnsupportedGetter(Exception):
    """The task uses a getter guirl does not implement."""


GETTERS: dict[str, base.Getter] = {}
"""Getter types guirl implements, by OSWorld name."""
for _module in (base, apps, chrome, info):
    _clash = GETTERS.keys() & _module.GETTERS.keys()
    assert not _clash, f"getters defined twice: {sorted(_clash)}"
    GETTERS.update(_module.GETTERS)


async def get(config: dict[str, Any] | None, client: VMClient, ctx: TaskContext) -> Any:
    if config is None:
        return None
    kind = config.get("type")
    fn = GETTERS.get(str(kind))
    if fn is None:
        raise UnsupportedGetter(f"getter {kind!r} is not implemented")
    return await fn(config, client, ctx)
