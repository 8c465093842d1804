"""Small network helpers shared by the actors, the engines and the tests."""

from __future__ import annotations

import os
import socket
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now (for a server started just after; another process may still take
    it in between, so the caller must handle a bind failure)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


HOST_ADDRESS_ENV = "GUIRL_HOST_ADDRESS"
"""Set by the cluster launcher on every process it starts: the address of the host (the interface the
cluster file names). torch.distributed stores and gloo devices use it instead of what the hostname
resolves to, so nothing listens on an interface the cluster file did not name."""


def host_address(default: str = "127.0.0.1") -> str:
    """This host's address in the cluster (`GUIRL_HOST_ADDRESS`), else `default`."""
    return os.environ.get(HOST_ADDRESS_ENV, "") or default


def listening_store(host: str, port: int, world_size: int, timeout: Any, *, wait_for_workers: bool = True):
    """A torch.distributed TCPStore master listening on `host` only. Built plainly, torch's store binds
    every interface (`*:port`) whatever host it is given; here guirl binds the socket and hands torch the
    listening fd. `port` 0 takes a free port (`store.port` tells which)."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    fd = sock.detach()  # torch owns the descriptor from here on (it closes it, also when it fails)
    return dist.TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=wait_for_workers,
        master_listen_fd=fd,
    )


def gloo_group(store: Any, rank: int, world_size: int, timeout: Any):
    """A gloo process group whose device is on this host's cluster address when the launcher set one
    (`GUIRL_HOST_ADDRESS`), else gloo's default device."""
    import torch.distributed as dist

    address = os.environ.get(HOST_ADDRESS_ENV, "")
    if not address:
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, world_size, options)


def interface_of(address: str) -> str:
    """The name of the network interface holding IPv4 `address` here ("" if none does)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(
                    sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15])
                )  # SIOCGIFADDR
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return ""
