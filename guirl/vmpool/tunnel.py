"""A port inside a VM, reachable from the host: `forward_port(client, port)` listens on 127.0.0.1 here and
carries each connection to `port` on the VM's loopback through the VM server's `/tunnel/{port}` WebSocket.

A local desktop has no network (its sandbox shares none with the host), so this is how the host reaches
the VM's Chrome DevTools, as OSWorld's host reaches a VM's at `http://VM_IP:9222`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp

from guirl.vmpool.client import VMClient
from guirl.vmpool.server.http import splice


async def _pipe(
    client: VMClient, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        ws = await client._http().ws_connect(f"{client._base}/tunnel/{port}", max_msg_size=0, heartbeat=None)
    except (aiohttp.ClientError, OSError):  # nothing listens there (yet): the connection is refused
        writer.close()
        return
    except BaseException:  # cancelled: the forwarder is closing
        writer.close()
        raise
    await splice(ws, reader, writer)


@contextlib.asynccontextmanager
async def forward_port(client: VMClient, port: int) -> AsyncIterator[str]:
    """`http://127.0.0.1:N`, whose connections reach `127.0.0.1:port` in the VM of `client` (guirl's server);
    closed, with every connection through it, on exit."""
    open_pipes: set[asyncio.Task] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        open_pipes.add(task)
        try:
            await _pipe(client, port, reader, writer)
        finally:
            open_pipes.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in list(open_pipes):
            task.cancel()
        await asyncio.gather(*open_pipes, return_exceptions=True)
        await server.wait_closed()


@contextlib.asynccontextmanager
async def devtools_endpoint(client: VMClient, port: int) -> AsyncIterator[str | None]:
    """Chrome's DevTools endpoint on the VM of `client` from this host: a networked VM's own address at
    `port` (OSWorld's way), a local desktop's port through a tunnel; None with no port configured."""
    from guirl.vmpool.tasks.setup_chrome import devtools_url

    url = devtools_url(client.address, port)
    if url is not None or not port or not client.address.startswith("unix://"):
        yield url
        return
    async with forward_port(client, port) as url:
        yield url
