"""A desktop session: the program that runs inside a local VM's sandbox.

It starts the X server (Xvfb, readiness via `-displayfd`, no polling), a window manager, and the VM server
on the listening socket the host passed in (or on a Unix socket path), then prints one JSON line
`{"ready": ...}` on stdout. It ends — taking its children with it — on SIGTERM, or as soon as the X
server dies, so the host sees a dead VM at once.

    python -m guirl.vmpool.session --listen-fd 3 --width 1920 --height 1080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def read_line(fd: int, timeout: float) -> str:
    """One line a child writes on the pipe `fd` (read whole before the pipe is closed: a late newline
    meeting a closed pipe kills some writers), stripped; "" if none came within `timeout`. Closes `fd`."""
    data, deadline = b"", time.monotonic() + timeout
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 512) if ready else b""
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data.decode(errors="replace").strip()


def start_x(width: int, height: int, timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
    """Xvfb on the first free display number; returns (process, ":N") once it accepts clients."""
    x11 = Path("/tmp/.X11-unix")
    x11.mkdir(exist_ok=True)
    x11.chmod(0o1777)  # Xvfb, not root here, refuses a socket dir it cannot trust
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [
            "Xvfb",
            "-displayfd",
            str(write_fd),
            "-screen",
            "0",
            f"{width}x{height}x24",
            "-nolisten",
            "tcp",
            "-noreset",
        ],
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        # to the session log: a pipe nobody reads fills up with X warnings, and Xvfb blocks on it
        stderr=sys.stderr,
    )
    os.close(write_fd)
    # Xvfb writes "N\n" when it accepts clients (a newline meeting a closed pipe would kill it: "Cannot
    # write display number to fd")
    number = read_line(read_fd, timeout)
    if not number:
        proc.kill()
        raise RuntimeError(f"Xvfb did not start within {timeout:.0f} s (its messages are in the session log)")
    return proc, f":{number}"


def wait_for_window_manager(display: str, timeout: float = 30.0) -> bool:
    """Until a window manager runs on `display` (it sets `_NET_SUPPORTING_WM_CHECK` on the root window).

    Applications started before the window manager has taken over can be left unmanaged and never
    shown, so a session is not ready until this holds. Event-driven: we listen for property changes
    on the root window."""
    from Xlib import X
    from Xlib import display as xdisplay

    conn = xdisplay.Display(display)
    try:
        root = conn.screen().root
        atom = conn.intern_atom("_NET_SUPPORTING_WM_CHECK")
        root.change_attributes(event_mask=X.PropertyChangeMask)
        deadline = time.monotonic() + timeout
        while root.get_full_property(atom, X.AnyPropertyType) is None:
            while conn.pending_events():
                conn.next_event()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            select.select([conn.fileno()], [], [], remaining)  # wakes on the next X event
        return True
    finally:
        conn.close()


A11Y_ENV = {
    "GNOME_ACCESSIBILITY": "1",  # Gecko (Thunderbird, Firefox)
    "QT_LINUX_ACCESSIBILITY_ALWAYS_ON": "1",  # Qt 5 (VLC)
    "ACCESSIBILITY_ENABLED": "1",  # Chromium
    "GTK_MODULES": "gail:atk-bridge",  # GTK 2 (GIMP): GNOME sets the same
}
"""What makes each toolkit expose its widgets over AT-SPI without a GNOME session telling it to (GTK does
so whenever a session bus runs)."""
LIBREOFFICE_GTK3 = Path("/usr/lib/libreoffice/program/libvclplug_gtk3lo.so")
"""LibreOffice's GTK 3 front end (Debian's libreoffice-gtk3): its only one that speaks AT-SPI."""


CHROMIUM_FLAGS = (
    "--no-sandbox",  # the desktop's own sandbox confines it; Chromium's cannot nest inside it
    "--test-type",  # no warning bar about --no-sandbox
    "--no-first-run",
    "--no-default-browser-check",
    "--password-store=basic",
    "--disable-dev-shm-usage",
)


def command_shims(directory: Path) -> dict[str, str]:
    """Commands OSWorld's tasks run that this desktop has under another name, written into `directory` (to
    go first on the PATH): `google-chrome` is Debian's Chromium, with the flags a sandboxed desktop needs.
    Returns {command: what it runs}."""
    made = {}
    chromium = shutil.which("chromium")
    if chromium and not shutil.which("google-chrome"):
        directory.mkdir(parents=True, exist_ok=True)
        shim = directory / "google-chrome"
        # OSWorld's getters read Chrome's profile where Google Chrome keeps it
        profile = '--user-data-dir="$HOME/.config/google-chrome"'
        shim.write_text(f'#!/bin/sh\nexec {chromium} {" ".join(CHROMIUM_FLAGS)} {profile} "$@"\n')
        shim.chmod(0o755)
        made["google-chrome"] = chromium
    return made


def start_session_bus(env: dict[str, str], timeout: float = 10.0) -> tuple[subprocess.Popen, str] | None:
    """A D-Bus session bus for the desktop (AT-SPI's registry is found through it, and the services it
    starts on demand, such as GNOME Terminal's server, get `env`: the display); returns (process,
    address), or None where dbus-daemon is not installed."""
    if shutil.which("dbus-daemon") is None:
        return None
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--nopidfile", f"--print-address={write_fd}"],
        pass_fds=(write_fd,),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=sys.stderr,
    )
    os.close(write_fd)
    address = read_line(read_fd, timeout)
    if not address:
        proc.kill()
        print("guirl session: no D-Bus session bus (dbus-daemon said nothing)", file=sys.stderr, flush=True)
        return None
    return proc, address


def enable_accessibility(env: dict[str, str]) -> None:
    """Start the accessibility bus and its registry, and tell the toolkits that ask (through the bus's
    `IsEnabled`) that a screen reader listens, as GNOME does when its accessibility setting is on
    (OSWorld's image has it on). Done before the desktop is ready: Qt (VLC) registers its widgets only
    with a registry that already runs when it starts."""
    if shutil.which("dbus-send") is None:
        print(
            "guirl session: no dbus-send (Debian's dbus-bin): Qt applications will not be in the "
            "accessibility tree",
            file=sys.stderr,
            flush=True,
        )
        return

    def send(*argv: str) -> str:
        try:
            return subprocess.run(
                ["dbus-send", "--print-reply", "--reply-timeout=5000", *argv],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:  # the tree is optional; the desktop is not
            print(f"guirl session: accessibility bus: {exc}", file=sys.stderr, flush=True)
            return ""

    bus = ("--session", "--dest=org.a11y.Bus", "/org/a11y/bus")
    properties = "org.freedesktop.DBus.Properties"
    send(*bus, f"{properties}.Set", "string:org.a11y.Status", "string:IsEnabled", "variant:boolean:true")
    address = re.search(r'string "([^"]+)"', send(*bus, "org.a11y.Bus.GetAddress"))
    if address:  # a call to the registry starts it (D-Bus activation) and returns once it answers
        send(
            f"--bus={address.group(1)}",
            "--dest=org.a11y.atspi.Registry",
            "/org/a11y/atspi/accessible/root",
            "org.freedesktop.DBus.Peer.Ping",
        )


A11Y_START_S = 15.0
"""How long a desktop's start waits for its accessibility bus and registry (then it is ready without)."""
NO_ACCESSIBILITY = "GUIRL_NO_ACCESSIBILITY"
"""Set in the session's environment when accessibility is off (`--no-accessibility`)."""


async def _settle(a11y: asyncio.Future) -> None:
    try:
        await a11y
    except TimeoutError:
        print(
            f"guirl session: no accessibility bus within {A11Y_START_S:.0f} s; going on without",
            file=sys.stderr,
            flush=True,
        )


async def serve(args: argparse.Namespace, ready_out: int) -> int:
    from aiohttp import web

    from guirl.vmpool.server.app import VMServer
    from guirl.vmpool.server.desktop import Desktop

    home = os.environ.get("HOME", "/home/user")
    xauth = Path(home) / ".Xauthority"
    xauth.touch(exist_ok=True)  # pyautogui insists on the file, even empty
    xvfb, display = start_x(args.width, args.height)
    desktop_env = {"DISPLAY": display, "XAUTHORITY": str(xauth), "XDG_SESSION_TYPE": "x11"}
    shims = Path(tempfile.mkdtemp(prefix="guirl-bin-"))
    if command_shims(shims):
        desktop_env["PATH"] = f"{shims}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    children = [xvfb]
    if not args.no_accessibility:
        desktop_env.update(A11Y_ENV)
        if LIBREOFFICE_GTK3.exists():
            desktop_env["SAL_USE_VCLPLUGIN"] = "gtk3"
    else:
        desktop_env["NO_AT_BRIDGE"] = "1"  # GTK: no accessibility bridge
        desktop_env[NO_ACCESSIBILITY] = "1"  # the server answers 501 for the tree
    # for guirl's server and OSWorld's alike; applications need it with or without accessibility
    bus = start_session_bus(dict(os.environ, **desktop_env))
    if bus is not None:
        children.append(bus[0])
        desktop_env["DBUS_SESSION_BUS_ADDRESS"] = bus[1]
    env = dict(os.environ, **desktop_env)
    os.environ.update(desktop_env)
    # the accessibility bus and registry start while the window manager does; both before the desktop is ready
    a11y = asyncio.ensure_future(
        asyncio.wait_for(asyncio.to_thread(enable_accessibility, env), A11Y_START_S)
        if "DBUS_SESSION_BUS_ADDRESS" in desktop_env and not args.no_accessibility
        else asyncio.sleep(0)
    )
    if args.wm:
        children.append(
            subprocess.Popen([args.wm], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        if not await asyncio.to_thread(wait_for_window_manager, display):
            print(f"guirl session: the window manager {args.wm!r} did not start", file=sys.stderr, flush=True)
            await _settle(a11y)
            return 4
    await _settle(a11y)
    server: VMServer | None = None
    runner: web.AppRunner | None = None
    if args.osworld_server:
        children.append(await asyncio.to_thread(start_foreign_server, args, env))
    else:
        server = VMServer(
            Desktop(display, png_level=args.png_level, cursor=not args.no_cursor), env=env, home=home
        )
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        if args.listen_fd is not None:  # the host made the socket, where nothing in here can touch it
            await web.SockSite(runner, socket.socket(fileno=args.listen_fd)).start()
        else:
            sock = Path(args.socket)
            sock.unlink(missing_ok=True)
            await web.UnixSite(runner, str(sock)).start()
    os.write(ready_out, (json.dumps({"ready": True, "display": display, "pid": os.getpid()}) + "\n").encode())
    os.close(ready_out)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # the display is the VM, and so is a foreign server: without either, end
    vital = {"the X server": xvfb, **({"the VM server": children[-1]} if args.osworld_server else {})}
    died = [loop.run_in_executor(None, proc.wait) for proc in vital.values()]
    await asyncio.wait([asyncio.ensure_future(stop.wait()), *died], return_when=asyncio.FIRST_COMPLETED)
    code = 0 if stop.is_set() else 3
    if not stop.is_set():
        for name, proc in vital.items():
            if proc.poll() is not None:
                print(
                    f"guirl session: {name} exited ({proc.returncode}); ending", file=sys.stderr, flush=True
                )
    if runner is not None:
        await runner.cleanup()
    for proc in [*(server.launched if server else []), *reversed(children)]:
        if proc.poll() is None:
            proc.terminate()
    return code


def start_foreign_server(
    args: argparse.Namespace, env: dict[str, str], timeout: float = 60.0
) -> subprocess.Popen:
    """OSWorld's own VM server (`guirl.vmpool.wsgi_host`) on the inherited socket, on the desktop's D-Bus
    session bus (where its accessibility routes read AT-SPI; without dbus-daemon, under a bus of its own
    from dbus-run-session); returns once the server file has been imported."""
    if args.listen_fd is None:
        raise SystemExit("--osworld-server needs --listen-fd")
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-m", "guirl.vmpool.wsgi_host", "--main", args.osworld_server]
    argv += ["--listen-fd", str(args.listen_fd), "--ready-fd", str(write_fd)]
    if not env.get("DBUS_SESSION_BUS_ADDRESS") and shutil.which("dbus-run-session"):
        argv = ["dbus-run-session", "--", *argv]
    proc = subprocess.Popen(
        argv, env=env, pass_fds=(args.listen_fd, write_fd), stdin=subprocess.DEVNULL, stdout=sys.stderr
    )
    os.close(write_fd)
    ready, _, _ = select.select([read_fd], [], [], timeout)
    line = os.read(read_fd, 64) if ready else b""
    os.close(read_fd)
    if not line.startswith(b"ready"):
        proc.kill()
        raise SystemExit(
            f"OSWorld's server {args.osworld_server} did not start (its messages are in the session log)"
        )
    return proc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", help="Unix socket path the VM server listens on")
    where.add_argument("--listen-fd", type=int, help="an inherited, already listening socket to serve on")
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--png-level", type=int, default=1, help="PNG compression level of screenshots (0-9)")
    ap.add_argument("--no-cursor", action="store_true", help="screenshots without the mouse pointer drawn in")
    ap.add_argument(
        "--no-accessibility", action="store_true", help="no AT-SPI: no accessibility tree, no terminal text"
    )
    ap.add_argument("--wm", default="icewm", help="window manager to run ('' for none)")
    ap.add_argument("--osworld-server", help="run this OSWorld VM server main.py instead of guirl's server")
    args = ap.parse_args(argv)
    # stdout carries exactly one line to the host, the ready line; whatever else anyone prints (a library's
    # warning, a child process) goes to the session log with stderr
    ready_out = os.dup(1)
    os.dup2(2, 1)
    import uvloop

    return uvloop.run(serve(args, ready_out))


if __name__ == "__main__":
    sys.exit(main())
