"""The `local` provider: each VM is a sandboxed X desktop on this machine (see `sandbox.py`).

A VM is a directory under the provider's root: `home/` (the user's home, restored from a template at
every reset), `api.sock` (the VM server's socket, created here and passed into the sandbox), `etc/` (the
sandbox's passwd and group), `vm.json` (tag, owner pid, session pid) and `session.log`. Reset kills the
session and restores the home: seconds.
A pool process that dies (even by SIGKILL) takes its VMs with it (`--die-with-parent`); directories it
left behind are reaped by the next provider on the same root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from guirl.proc import cmdline, pid_alive
from guirl.vmpool.provider import ProviderError
from guirl.vmpool.sandbox import (
    HOME,
    bwrap_argv,
    kill_namespace,
    namespace_members,
    namespace_name,
    open_sandbox_namespace,
)

log = logging.getLogger(__name__)

SOCKET = "api.sock"
TEMPLATE_VERSION = "3"
"""Bumped whenever the default home template changes, so an old one is not reused."""

LIBREOFFICE_PROFILE = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse">
<value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse">
<value>false</value></prop></item>
<item oor:path="/org.openoffice.Setup/Product"><prop oor:name="ooSetupLastVersion" oor:op="fuse">
<value>99.9</value></prop></item>
<item oor:path="/org.openoffice.Setup/Office"><prop oor:name="ooSetupInstCompleted" oor:op="fuse">
<value>true</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="WarnAlienFormat" oor:op="fuse">
<value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Recovery/RecoveryInfo"><prop oor:name="Enabled" oor:op="fuse">
<value>false</value></prop></item>
</oor:items>
"""
VLC_PROFILE = """[qt] # Qt interface
qt-privacy-ask=0

[core] # core program
extraintf=http

[lua] # Lua interpreter
http-password=password
"""
"""VLC's settings as OSWorld's image has them: no privacy question at the first start, and the web interface
on (port 8080, password "password"), which OSWorld's `vlc_playing_info` getter reads."""
_NOT_SERVER = shutil.ignore_patterns("__pycache__", "screenshots", "*.md")
UNIX_PATH_MAX = 100  # AF_UNIX paths are limited to 108 bytes; keep a margin


@dataclass
class LocalVM:
    """One running (or stopped) local desktop."""

    vm_id: str
    dir: Path
    tag: str
    proc: asyncio.subprocess.Process | None = None
    display: str = ""
    started_at: float = 0.0
    resets: int = 0
    pidns_fd: int | None = None
    """The sandbox's PID namespace, held open: how its processes are found to be killed."""
    log_file: object = field(default=None, repr=False)

    @property
    def socket(self) -> Path:
        """The server's socket, in the VM's directory on the host: not mounted in the sandbox, so nothing
        inside can replace it (the session gets the listening socket as an inherited descriptor)."""
        return self.dir / SOCKET


class LocalProvider:
    """Sandboxed Xvfb desktops under `root`."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        width: int = 1920,
        height: int = 1080,
        png_level: int = 1,
        cursor: bool = True,
        accessibility: bool = True,
        template: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 60.0,
        window_manager: str = "icewm",
        osworld_server: str | os.PathLike[str] | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.width, self.height, self.png_level = width, height, png_level
        self.cursor = cursor  # the pointer drawn into guirl's server's screenshots, as OSWorld's server does
        self.accessibility = accessibility  # AT-SPI on the desktop's session bus, as on OSWorld's image
        self.template = Path(template) if template else self._default_template()
        self.start_timeout_s = start_timeout_s
        self.window_manager = window_manager
        # OSWorld's own VM server (its main.py) instead of guirl's: the server an OSWorld image runs
        self.osworld_server = Path(osworld_server).resolve() if osworld_server else None
        if self.osworld_server is not None and not self.osworld_server.is_file():
            raise ProviderError(f"osworld_server: no such file {self.osworld_server}")
        self.vms: dict[str, LocalVM] = {}
        self.reaped = self.reap_stale()

    def reap_stale(self) -> list[str]:
        """Remove the VMs a dead pool process left under `root` (kill their sessions if any survived).

        VMs of a live owner (another pool sharing the root) are left alone."""
        reaped = []
        for vm_dir in sorted(self.root.glob("vm-*")):
            try:
                state = json.loads((vm_dir / "vm.json").read_text())
            except (OSError, ValueError):
                state = {}
            owner = int(state.get("owner", 0) or 0)
            if owner and owner != os.getpid() and pid_alive(owner):
                continue
            session = int(state.get("session", 0) or 0)
            if session and pid_alive(session) and str(vm_dir) in cmdline(session):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(session, signal.SIGKILL)
            ns = state.get("pidns")
            if isinstance(ns, str) and ns.startswith("pid:["):  # a desktop that outlived its bwrap
                # nobody holds it open any more: its name may be another sandbox's now, unless its own
                # processes (bwrap's command line names the VM's directory) are still in it
                own = next((p for p in namespace_members(ns) if f"{vm_dir}/" in cmdline(p)), None)
                fd = None
                with contextlib.suppress(OSError):  # held open: its name cannot go to another one now
                    fd = os.open(f"/proc/{own}/ns/pid", os.O_RDONLY | os.O_CLOEXEC) if own else None
                if fd is not None:
                    try:
                        if namespace_name(fd) == ns:
                            kill_namespace(ns)
                    finally:
                        os.close(fd)
            shutil.rmtree(vm_dir, ignore_errors=True)
            Path(tempfile.gettempdir(), f"guirl-{vm_dir.name}").unlink(missing_ok=True)
            reaped.append(vm_dir.name)
        if reaped:
            log.warning("reaped %d VMs left by a dead pool under %s: %s", len(reaped), self.root, reaped)
        return reaped

    def _default_template(self) -> Path:
        tpl = self.root / f"template-home-v{TEMPLATE_VERSION}"
        if not tpl.exists():
            tmp = self.root / f".template-{uuid.uuid4().hex[:6]}"
            (tmp / "Desktop").mkdir(parents=True)
            (tmp / ".bashrc").write_text("PS1='user@guirl-vm:\\w$ '\n")
            # a LibreOffice profile as a desktop image would ship it: no first-run dialogs, and saving in
            # a document's own format (xlsx, docx) without asking
            lo_user = tmp / ".config" / "libreoffice" / "4" / "user"
            lo_user.mkdir(parents=True)
            (lo_user / "registrymodifications.xcu").write_text(LIBREOFFICE_PROFILE)
            (tmp / ".config" / "vlc").mkdir()
            (tmp / ".config" / "vlc" / "vlcrc").write_text(VLC_PROFILE)
            os.replace(tmp, tpl)
        return tpl

    # -- the Provider interface -----------------------------------------------------------------------

    async def create(self, tag: str) -> str:
        vm_id = f"vm-{uuid.uuid4().hex[:8]}"
        vm_dir = self.root / vm_id
        vm_dir.mkdir(parents=True)
        vm = LocalVM(vm_id=vm_id, dir=vm_dir, tag=tag)
        self.vms[vm_id] = vm
        try:
            await asyncio.to_thread(self._restore_home, vm)
            await self._start(vm)
        except BaseException:
            await self.delete(vm_id)
            raise
        return vm_id

    def address(self, vm_id: str) -> str:
        return f"unix://{self._socket_path(self.vms[vm_id])}"

    def _socket_path(self, vm: LocalVM) -> Path:
        """The VM server's socket as a path short enough for AF_UNIX (108 bytes): a deep VM directory is
        reached through a short symlink in the temporary directory."""
        if len(str(vm.socket)) < UNIX_PATH_MAX:
            return vm.socket
        link = Path(tempfile.gettempdir()) / f"guirl-{vm.vm_id}"
        try:
            link.symlink_to(vm.dir)
        except FileExistsError:
            if not link.is_symlink() or os.readlink(link) != str(vm.dir):
                raise ProviderError(f"{link} exists and is not this VM's link: refusing to use it") from None
        return link / SOCKET

    async def reset(self, vm_id: str) -> None:
        vm = self.vms[vm_id]
        await self._stop(vm)
        await asyncio.to_thread(self._restore_home, vm)
        await self._start(vm)
        vm.resets += 1

    async def delete(self, vm_id: str) -> None:
        vm = self.vms.pop(vm_id, None)
        if vm is None:
            return
        await self._stop(vm)
        Path(tempfile.gettempdir(), f"guirl-{vm_id}").unlink(missing_ok=True)
        await asyncio.to_thread(shutil.rmtree, vm.dir, True)

    async def list(self, tag: str) -> list[str]:
        return [v.vm_id for v in self.vms.values() if v.tag == tag]

    # -- sessions ---------------------------------------------------------------------------------------

    def _restore_home(self, vm: LocalVM) -> None:
        home = vm.dir / "home"
        if home.exists():
            # moved aside first: the new home never shares a directory with anything of the old session
            trash = vm.dir / f".home-{uuid.uuid4().hex[:8]}"
            os.replace(home, trash)
            shutil.rmtree(trash, ignore_errors=True)  # what a process stuck in the kernel kept: with the VM
        shutil.copytree(self.template, home, symlinks=True)
        if self.osworld_server is not None:  # it writes beside itself (screenshots/), as in an image
            server = home / "server"
            shutil.copytree(self.osworld_server.parent, server, ignore=_NOT_SERVER)
            for path in [server, *server.rglob("*")]:  # the user's own files, whatever the source's modes
                path.chmod(0o755 if path.is_dir() else 0o644)

    async def _start(self, vm: LocalVM) -> None:
        vm.socket.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self._socket_path(vm)))  # a deep VM directory is bound through its short link
        listener.listen(128)
        command = [
            sys.executable,
            "-m",
            "guirl.vmpool.session",
            "--listen-fd",
            str(listener.fileno()),
            "--width",
            str(self.width),
            "--height",
            str(self.height),
            "--png-level",
            str(self.png_level),
            "--wm",
            self.window_manager,
            *([] if self.cursor else ["--no-cursor"]),
            *([] if self.accessibility else ["--no-accessibility"]),
        ]
        if self.osworld_server is not None:  # where an OSWorld image keeps it (copied in at each reset)
            command += ["--osworld-server", f"{HOME}/server/{self.osworld_server.name}"]
        vm.log_file = open(vm.dir / "session.log", "ab")  # noqa: SIM115  (closed in _stop)
        try:
            vm.proc = await asyncio.create_subprocess_exec(
                *bwrap_argv(vm.dir, command),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=vm.log_file,
                pass_fds=(listener.fileno(),),
            )
        finally:
            listener.close()  # the session holds it now
        self._write_state(vm)
        try:
            line = await asyncio.wait_for(vm.proc.stdout.readline(), self.start_timeout_s)
            ready = json.loads(line) if line else {}
        except (TimeoutError, json.JSONDecodeError, UnicodeDecodeError):
            ready = {}
        if not isinstance(ready, dict):
            ready = {}
        if not ready.get("ready"):
            tail = (vm.dir / "session.log").read_text(errors="replace")[-800:]
            await self._stop(vm)
            raise ProviderError(
                f"local VM {vm.vm_id} did not start within {self.start_timeout_s:.0f} s: {tail}"
            )
        vm.display, vm.started_at = ready["display"], time.time()
        vm.pidns_fd = open_sandbox_namespace(vm.proc.pid)
        self._write_state(vm)
        log.info("local VM %s ready on %s (display %s)", vm.vm_id, vm.socket, vm.display)

    async def _stop(self, vm: LocalVM) -> None:
        """Kill the VM's session and wait until every process of its sandbox has exited, so that nothing
        writes into its home any more."""
        proc, vm.proc = vm.proc, None
        ns_fd, vm.pidns_fd = vm.pidns_fd, None
        if ns_fd is None and proc is not None and proc.returncode is None:  # stopped before it was ready
            ns_fd = open_sandbox_namespace(proc.pid)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)  # the sandbox's PID namespace goes with it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        if ns_fd is not None:
            try:
                stuck = await asyncio.to_thread(kill_namespace, namespace_name(ns_fd))
            finally:
                os.close(ns_fd)
            if stuck:
                log.warning("local VM %s: sandbox processes %s outlived SIGKILL", vm.vm_id, stuck)
        if vm.log_file is not None:
            vm.log_file.close()
            vm.log_file = None

    def _write_state(self, vm: LocalVM) -> None:
        state = {
            "tag": vm.tag,
            "owner": os.getpid(),
            "session": vm.proc.pid if vm.proc else 0,
            "pidns": namespace_name(vm.pidns_fd) if vm.pidns_fd is not None else None,
        }
        tmp = vm.dir / ".vm.json.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, vm.dir / "vm.json")

    def kill(self, vm_id: str) -> None:
        """Fault injection: SIGKILL a VM's session as a crash would (the pool must notice and replace it)."""
        vm = self.vms.get(vm_id)
        if vm is not None and vm.proc is not None and vm.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                vm.proc.send_signal(signal.SIGKILL)

    def alive(self, vm_id: str) -> bool:
        vm = self.vms.get(vm_id)
        return vm is not None and vm.proc is not None and vm.proc.returncode is None
