"""Serve a foreign VM server (OSWorld's own Flask `main.py`) on a local desktop's inherited socket.

A local VM normally runs guirl's VM server. With `LocalProvider(osworld_server=PATH)` its session runs the
server an OSWorld desktop image runs instead, unchanged: this module imports that file by path (as a
module, so its `if __name__ == "__main__"` block, which binds port 5000, does not run) and serves its
`app` with Werkzeug, threaded as Flask's `app.run` is, on the listening socket the host created. It writes
one line to `--ready-fd` once the file has been imported, then serves until killed.

    python -m guirl.vmpool.wsgi_host --main PATH --listen-fd 3 --ready-fd 4
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

SYSTEM_SITE = "/usr/lib/python3/dist-packages"
"""Where Debian's python3-pyatspi lives: OSWorld's server imports pyatspi (AT-SPI) at the top."""


def load_app(main: Path) -> object:
    """The WSGI `app` of the server file `main`, imported under its own directory (for its `pyxcursor`)."""
    sys.path.insert(0, str(main.parent))
    # last, so the venv's packages win over Debian's; and only when Debian's compiled modules (PyGObject,
    # which pyatspi needs) were built for this very interpreter
    soabi = sysconfig.get_config_var("SOABI")
    if os.path.isfile(f"{SYSTEM_SITE}/gi/_gi.{soabi}.so") and SYSTEM_SITE not in sys.path:
        sys.path.append(SYSTEM_SITE)
    spec = importlib.util.spec_from_file_location("osworld_vm_server", main)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {main}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = getattr(module, "app", None)
    if app is None:
        raise SystemExit(f"{main} defines no WSGI `app`")
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--main", required=True, type=Path, help="the server's main.py")
    ap.add_argument("--listen-fd", required=True, type=int, help="an inherited, listening Unix socket")
    ap.add_argument("--ready-fd", type=int, help="written one line once the server is imported")
    args = ap.parse_args(argv)
    from werkzeug.serving import make_server

    app = load_app(args.main.resolve())
    server = make_server("unix://vm.sock", 0, app, threaded=True, fd=args.listen_fd)  # type: ignore[arg-type]
    if args.ready_fd is not None:
        os.write(args.ready_fd, b"ready\n")
        os.close(args.ready_fd)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
