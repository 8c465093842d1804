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

import os
import shutil
import sys
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
    "xdg",
    "machine-id",
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


def python_roots() -> list[str]:
    """Directories the sandbox needs to run this Python with guirl importable, read-only: the interpreter's
    prefixes, guirl's package, and every directory on sys.path that packages are installed in: guirl's
    dependencies may live outside the prefixes (a user site, a `.pth` or PYTHONPATH entry) and the VM
    server imports them. Only installation directories: a checkout or working directory on sys.path
    stays out of the VM (it may hold the tasks' solutions)."""
    roots = {
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sys.prefix),
        os.path.realpath(os.path.dirname(os.path.dirname(guirl.__file__)) + "/guirl"),
        *(os.path.realpath(p or ".") for p in sys.path if _holds_distributions(p)),
    }
    return sorted(r for r in roots if not r.startswith("/usr"))  # /usr is bound anyway


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
    for root in python_roots():
        argv += ["--ro-bind", root, root]
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
