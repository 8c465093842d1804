"""The bubblewrap sandbox of a local VM.

Inside, the user is `user` (uid 1000) with home `/home/user`, as in OSWorld's images, so task files use
the same paths. The sandbox sees read-only system directories (`/usr`, a few files of `/etc`, the Python
that runs the VM server, the directories its packages are installed in, and guirl's own package) and
nothing else of the host: its home is a private directory of the VM, `/tmp` is empty and private, and it
has its own network namespace (loopback only), PID namespace (everything dies with it) and IPC. The only way
in or out is the Unix socket of the VM server, a listening socket the host creates outside the sandbox and
passes in.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import time
from pathlib import Path

import guirl

HOME = "/home/user"
"""The user's home inside every VM (OSWorld's)."""
UID = GID = 1000

ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "fonts",
    "X11",
    "alternatives",
    "xdg",
    "localtime",
    "nsswitch.conf",
    "mime.types",
    "mailcap",
    "gtk-3.0",
    "dconf",
    "libreoffice",
    "ssl",
    "python3",
    "python3.11",
    "openbox",
    "machine-id",
    "dbus-1",
    "chromium",
    "chromium.d",
    "gimp",
    "thunderbird",
    "vlc",
)
"""Entries of the host's /etc a desktop session needs; nothing secret (no shadow, no keys)."""

PASSWD = "root:x:0:0:root:/root:/usr/sbin/nologin\nuser:x:1000:1000:user:/home/user:/bin/bash\n"
GROUP = "root:x:0:\nuser:x:1000:\n"


class SandboxError(RuntimeError):
    """bubblewrap is missing or cannot create the sandbox here."""


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    return path


def _holds_distributions(path: str) -> bool:
    """Whether `path` is a directory packages are installed in (it holds a `*.dist-info`)."""
    try:
        return any(name.endswith(".dist-info") for name in os.listdir(path or "."))
    except OSError:
        return False


def python_roots() -> list[tuple[str, str]]:
    """Directories the sandbox needs to run this Python with guirl importable, read-only, as (host directory,
    path in the sandbox): the interpreter's prefixes, guirl's package, and every directory on sys.path that
    packages are installed in: guirl's dependencies may live outside the prefixes (a user site, a `.pth` or
    PYTHONPATH entry) and the VM server imports them. Only installation directories: a checkout or working
    directory on sys.path stays out of the VM (it may hold the tasks' solutions).

    Each is bound at its real path and, where this Python names it through a symlink (a virtual environment
    that is itself a link, a pyenv shim's prefix, a conda-style prefix under a linked directory), at that
    name too: the sandbox runs `sys.executable` as this process names it, and a venv's interpreter finds its
    `pyvenv.cfg` and site-packages beside that name."""
    named = [
        sys.base_prefix,
        sys.prefix,
        os.path.dirname(os.path.dirname(guirl.__file__)) + "/guirl",
        *(p or "." for p in sys.path if _holds_distributions(p)),
    ]
    pairs = set()
    for path in named:
        real = os.path.realpath(path)
        pairs.add((real, real))
        pairs.add((real, os.path.normpath(os.path.abspath(path))))
    # the interpreter itself, where it is named outside every prefix (`~/bin/python3 -> /usr/bin/python3`);
    # inside one (a venv's bin/python link) it is there already, and a read-only bind takes no file on top
    exe = os.path.normpath(os.path.abspath(sys.executable))
    if not any(_under(exe, where) for _, where in pairs) and not _under(exe, "/usr"):
        pairs.add((os.path.realpath(sys.executable), exe))
    # /usr is bound anyway; a parent is bound before what lies under it
    return sorted((p for p in pairs if not _under(p[1], "/usr")), key=lambda p: p[1])


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def bwrap_argv(vm_dir: Path, command: list[str], *, env: dict[str, str] | None = None) -> list[str]:
    """The full bwrap command that runs `command` inside the sandbox of the VM at `vm_dir`.

    `vm_dir/home` becomes the user's home; it must exist.
    """
    etc = vm_dir / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(PASSWD)
    (etc / "group").write_text(GROUP)
    (etc / "hostname").write_text("guirl-vm\n")
    # name lookups must answer at once: with no network, a resolver that tries DNS stalls X clients
    # (xterm looks up its own host name) for seconds
    (etc / "hosts").write_text("127.0.0.1 localhost guirl-vm\n::1 localhost ip6-localhost\n")
    (etc / "resolv.conf").write_text("# no network in a guirl VM\n")
    argv = [bwrap_path(), "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin", "lib32", "libx32"):
        target = os.path.join("/", link)
        if os.path.islink(target):
            argv += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            argv += ["--ro-bind", target, target]
    for name in sorted(set(ETC)):
        if os.path.exists(f"/etc/{name}"):
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for name in ("passwd", "group", "hostname", "hosts", "resolv.conf"):
        argv += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    # the empty, private directories first: a bind under one of them must come after it, or the tmpfs
    # hides it (a checkout under /tmp, as CI may use, puts the venv there)
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for private in ("/tmp", "/run", "/var/tmp", "/home"):
        argv += ["--tmpfs", private]
    for root, where in python_roots():
        argv += ["--ro-bind", root, where]
    argv += [
        "--bind",
        str(vm_dir / "home"),
        HOME,
        "--unshare-all",
        "--uid",
        str(UID),
        "--gid",
        str(GID),
        "--hostname",
        "guirl-vm",
        "--die-with-parent",
        "--new-session",
        "--chdir",
        HOME,
        "--clearenv",
    ]
    pkg_parent = os.path.dirname(os.path.dirname(guirl.__file__))
    base_env = {
        "HOME": HOME,
        "USER": "user",
        "LOGNAME": "user",
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        # the venv's bin first: OSWorld tasks run `python -c "import pyautogui ..."`
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": pkg_parent,
        "TERM": "xterm",
    }
    for key, value in {**base_env, **(env or {})}.items():
        argv += ["--setenv", key, value]
    return [*argv, "--", *command]


# -- the sandbox's processes ------------------------------------------------------------------------------
# bwrap runs the sandbox's first process in a PID namespace of its own. Killing bwrap makes the kernel kill
# the rest, but not at once: a process busy in the kernel (a LibreOffice writing a file) finishes its call
# first, so a home deleted right after bwrap was reaped can still be written into. And a sandbox whose bwrap
# died before it armed `--die-with-parent` would live on. So a VM's processes are found through their
# namespace, killed by pidfd (a pid reused meanwhile is never hit) and waited for.


def pid_namespace(pid: int | str) -> str | None:
    """The PID namespace of process `pid` ("pid:[4026532451]"), or None when it is gone or not ours to see."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def open_sandbox_namespace(bwrap_pid: int) -> int | None:
    """A descriptor of the PID namespace of the sandbox that the bwrap process `bwrap_pid` started (its
    child's), or None when it has not started one yet or it is gone. Holding it keeps the namespace's
    identity (the number in its name) from being given to another sandbox after this one ends."""
    try:
        children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    except OSError:
        return None
    own = pid_namespace("self")
    for child in children:
        try:
            fd = os.open(f"/proc/{child}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if namespace_name(fd) != own:
            return fd
        os.close(fd)
    return None


def namespace_name(fd: int) -> str:
    """The name of the PID namespace open as `fd`, as /proc/PID/ns/pid reads."""
    return f"pid:[{os.fstat(fd).st_ino}]"


def namespace_members(ns: str, *, zombies: bool = True) -> list[int]:
    """The pids (as this host numbers them) of every process in PID namespace `ns` (without `zombies`:
    only those that have not exited; a zombie holds no file and waits for its parent to reap it)."""
    pids = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit() and pid_namespace(entry.name) == ns:
                if zombies or not _zombie(entry.name):
                    pids.append(int(entry.name))
    return pids


def _zombie(pid: int | str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] in ("Z", "X")


def kill_namespace(ns: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process of PID namespace `ns` and wait until all have exited (a zombie has: it holds no
    file and no directory). Blocking. Returns the pids still running after `timeout_s` (a process stuck in
    the kernel), empty when all are gone. Never `ns` of this process itself."""
    if ns == pid_namespace("self"):
        raise ValueError("refusing to kill this process's own PID namespace")
    deadline = time.monotonic() + timeout_s
    while True:
        fds = []
        for pid in namespace_members(ns, zombies=False):
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # gone already
                continue
            if pid_namespace(pid) != ns:  # exited (and the number maybe reused) between the scan and the open
                os.close(fd)
                continue
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            fds.append((pid, fd))
        if not fds:
            return []
        poller = select.poll()
        for _, fd in fds:
            poller.register(fd, select.POLLIN)
        left = {fd for _, fd in fds}
        try:
            while left and (remaining := deadline - time.monotonic()) > 0:
                for fd, _ in poller.poll(remaining * 1000):
                    poller.unregister(fd)
                    left.discard(fd)
        finally:
            for _, fd in fds:
                os.close(fd)
        if left or time.monotonic() >= deadline:
            return [pid for pid, fd in fds if fd in left]
        # all those exited; one that forked meanwhile has a child to find (until the namespace's first
        # process is dead, when no process can be created in it any more)
