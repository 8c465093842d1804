"""guirl's real VM server (its file routes: no desktop is needed for them) on loopback, in a thread, for
testing getters against OSWorld's reference getters: guirl's getter talks to it through `VMClient`, the
reference's through desktop-env's own `PythonController` (blocking `requests`, hence the thread).

`wallpaper=` sets the desktop's wallpaper through guirl's own `/setup/change_wallpaper` first, so that
`POST /wallpaper` sends it (as OSWorld's server sends the picture GNOME shows).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from guirl.vmpool.client import VMClient
from guirl.vmpool.server.app import VMServer


@contextlib.contextmanager
def vm_file_server(home: Path, wallpaper: Path | None = None) -> Iterator[tuple[str, int]]:
    """Serve `home` as the VM user's home; yields (guirl's address `http://127.0.0.1:PORT`, PORT)."""
    loop = asyncio.new_event_loop()
    app = VMServer(None, home=str(home)).app()  # type: ignore[arg-type]  (the file routes use no desktop)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    port = runner.addresses[0][1]
    if wallpaper is not None:

        async def set_wallpaper() -> None:
            async with VMClient(f"http://127.0.0.1:{port}") as client:
                await client._call(
                    "POST", "/setup/change_wallpaper", idempotent=False, json={"path": str(wallpaper)}
                )

        loop.run_until_complete(set_wallpaper())
    thread = threading.Thread(target=loop.run_forever, name="vm-file-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
