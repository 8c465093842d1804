"""`guirl view RUN_DIR --serve`: the site on loopback, rebuilt while the run writes.

The run directory's site and screenshots are served read-only on 127.0.0.1 (never another interface), and
nothing else of it: only `view/`, `episodes/` (and a folder of runs' `curve.png` and its runs' own `view/`
and `episodes/`); a run's configuration, checkpoints and VM folders are not served. A request whose `Host`
is not this loopback address is refused (a web page elsewhere cannot reach it by rebinding a name to
127.0.0.1). Every `interval_s` the run's files are looked at (their sizes and modification times, a
few thousand `stat` calls for a thousand episodes); when something changed the site is rebuilt
(incrementally). `view/build.json` says which build last wrote each page; an open page polls it and
reloads when its own page was written again.
"""

from __future__ import annotations

import functools
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

from guirl.view.site import SITE, build, is_run

RUN_FILES = ("summary.json", "metrics.jsonl", "eval.jsonl", "episodes.jsonl", "advantages.jsonl", "sft.jsonl")
GROUP_FILES = ("learn.json", "curve.json", "curve.png")
SERVED = ("view", "episodes")
EPISODE_FILES = ("result.json", "traj.jsonl", "prm.jsonl", "final.png")


def fingerprint(root: Path, *others: Path) -> tuple:
    """What a rebuild depends on, cheaply: sizes and modification times of the run's files (and of the
    runs it is compared with)."""
    out: list[Any] = []
    for other in others:
        out.append(fingerprint(other))

    def stat(path: str) -> None:
        try:
            st = os.stat(path)
            out.append((path, st.st_mtime_ns, st.st_size))
        except OSError:
            pass

    runs = [root] if is_run(root) else [c for c in sorted(root.iterdir()) if c.is_dir() and is_run(c)]
    for name in GROUP_FILES if len(runs) != 1 or runs[0] != root else ():
        stat(os.path.join(root, name))
    for run in runs:
        for name in RUN_FILES:
            stat(os.path.join(run, name))
        try:
            tasks = list(os.scandir(run / "episodes"))
        except OSError:
            continue
        for task in tasks:
            try:
                eps = list(os.scandir(task.path))
            except OSError:
                continue
            for ep in eps:
                out.append(ep.path)
                for name in EPISODE_FILES:
                    stat(os.path.join(ep.path, name))
    return tuple(sorted(out, key=str))


class _Handler(SimpleHTTPRequestHandler):
    hosts: frozenset[str] = frozenset()

    def send_head(self) -> Any:
        if self.headers.get("Host", "").strip().lower() not in self.hosts:
            self.send_error(403, "not this server's address")
            return None
        # the path the base class will open (unquoted, `..` resolved), relative to the served folder
        opened = os.path.realpath(self.translate_path(self.path))
        root = os.path.realpath(self.directory)
        parts = (
            list(Path(os.path.relpath(opened, root)).parts) if opened.startswith(root + os.sep) else [".."]
        )
        served = (
            bool(parts)
            and ".." not in parts
            and (parts[0] in SERVED or parts == ["curve.png"] or (len(parts) > 1 and parts[1] in SERVED))
        )
        if not served:
            self.send_error(404, "only the site (view/) and the episodes' files are served")
            return None
        return super().send_head()

    def list_directory(self, path: Any) -> Any:
        self.send_error(404, "no listings")
        return None

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
        pass


class Server:
    """The HTTP server on its thread, and the rebuild loop (`run`, on the caller's thread)."""

    def __init__(self, root: Path, *, port: int = 0, interval_s: float = 2.0, **build_args: Any) -> None:
        self.root = root.resolve()
        self.interval_s = interval_s
        self.build_args = build_args
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        bound = self.httpd.server_address[1]
        hosts = {f"127.0.0.1:{bound}", f"localhost:{bound}"}
        if bound == 80:  # a browser leaves the default port out
            hosts |= {"127.0.0.1", "localhost"}
        hosts = frozenset(hosts)
        self.httpd.RequestHandlerClass = functools.partial(  # type: ignore[assignment]
            type("Handler", (_Handler,), {"hosts": hosts}), directory=str(self.root)
        )
        others = [build_args["compare"]] if build_args.get("compare") else []
        self.others = [Path(o).resolve() for o in others]
        self.stop = threading.Event()
        self._seen: tuple | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/{SITE}/index.html"

    def rebuild_if_changed(self, out: TextIO | None = None) -> bool:
        now = fingerprint(self.root, *self.others)
        if now == self._seen:
            return False
        built = build(self.root, **self.build_args)
        self._seen = now
        if out is not None:
            print(built.line(), file=out, flush=True)
        return True

    def run(self, out: TextIO | None = None) -> None:
        thread = threading.Thread(target=self.httpd.serve_forever, name="view-http", daemon=True)
        thread.start()
        try:
            while not self.stop.wait(self.interval_s):
                try:
                    self.rebuild_if_changed(out)
                except Exception as exc:  # noqa: BLE001  (the run may be mid-write: try again next time)
                    if out is not None:
                        print(f"[view] rebuild failed, trying again: {type(exc).__name__}: {exc}", file=out)
        finally:
            self.httpd.shutdown()
            self.httpd.server_close()
            thread.join()
