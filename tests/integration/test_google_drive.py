"""The Google Drive steps (`googledrive` setup, `googledrive_file` getter) against a stand-in for Google's
Drive v2 REST API and OAuth token endpoint, served on loopback.

Google's API cannot be reached from here, so this module holds the one fake: a Drive that keeps files in
memory and answers the requests guirl makes as Drive v2 does (files.list with `q` queries in Drive's
query language, files.insert, the multipart upload, trash, delete, `alt=media` downloads; a trashed or
deleted folder takes its contents). The queries are the suite's own task files' shapes. The settings are
read from a PyDrive settings.yml as OSWorld writes it, with guirl's `api_root` pointing at the fake.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from guirl.vmpool.tasks.getters import GETTERS
from guirl.vmpool.tasks.setup import TaskContext
from guirl.vmpool.tasks.setup_chrome import HANDLERS, BrowserUnavailable
from tests.helpers import run

FOLDER = "application/vnd.google-apps.folder"
_TOKEN = re.compile(
    r"""\s*(?:(?P<field>title|mimeType|trashed)\s*(?P<op>!=|=)\s*(?P<value>'(?:[^'\\]|\\.)*'|"[^"]*"|true|false)"""
    r"""|(?P<parent>'[^']*'|"[^"]*")\s+in\s+parents|(?P<word>and|or|not|\(|\)))"""
)


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1]) if text[0] in "'\"" else text


def matches(query: str, item: dict[str, Any]) -> bool:
    """Drive v2's query language, the clauses OSWorld's tasks use: title, mimeType, trashed, parents."""
    python, pos = [], 0
    while pos < len(query.rstrip()):
        m = _TOKEN.match(query, pos)
        assert m, f"the fake Drive does not understand {query[pos:]!r}"
        pos = m.end()
        if m["word"]:
            python.append(m["word"])
        elif m["parent"]:
            python.append(str(_unquote(m["parent"]) in [p["id"] for p in item["parents"]]))
        else:
            value = _unquote(m["value"])
            have = {
                "title": item["title"],
                "mimeType": item["mimeType"],
                "trashed": str(item["trashed"]).lower(),
            }
            python.append(str((have[m["field"]] == value) == (m["op"] == "=")))
    return bool(eval(" ".join(python)))  # noqa: S307  (only True/False/and/or/not/parentheses)


class FakeDrive:
    """Files by id; "root" is the root folder."""

    def __init__(self) -> None:
        self.files: dict[str, dict[str, Any]] = {}
        self.content: dict[str, bytes] = {}
        self.requests: list[str] = []

    def add(self, title: str, parent: str = "root", mime: str = "application/pdf", data: bytes = b"") -> str:
        fid = f"f{len(self.files) + 1}"
        self.files[fid] = {
            "id": fid,
            "title": title,
            "mimeType": mime,
            "parents": [{"id": parent}],
            "trashed": False,
        }
        self.content[fid] = data
        return fid

    def _descendants(self, fid: str) -> list[str]:
        kids = [k for k, f in self.files.items() if any(p["id"] == fid for p in f["parents"])]
        return [fid] + [d for k in kids for d in self._descendants(k)]

    def app(self) -> web.Application:
        async def token(request: web.Request) -> web.Response:
            form = await request.post()
            if form.get("grant_type") != "refresh_token" or form.get("refresh_token") != "refresh-me":
                return web.json_response({"error": "invalid_grant"}, status=400)
            return web.json_response({"access_token": "tok", "expires_in": 3600})

        def authorised(request: web.Request) -> None:
            self.requests.append(f"{request.method} {request.path}")
            if request.headers.get("Authorization") != "Bearer tok":
                raise web.HTTPUnauthorized()

        async def list_or_insert(request: web.Request) -> web.Response:
            authorised(request)
            if request.method == "POST":
                meta = await request.json()
                parent = meta.get("parents", [{"id": "root"}])[0]["id"]
                return web.json_response(self.files[self.add(meta["title"], parent, meta["mimeType"])])
            q = request.query.get("q", "")
            return web.json_response({"items": [f for f in self.files.values() if matches(q, f)]})

        async def upload(request: web.Request) -> web.Response:
            authorised(request)
            assert request.query["uploadType"] == "multipart"
            reader = await request.multipart()
            meta = json.loads(await (await reader.next()).read())  # type: ignore[union-attr]
            data = await (await reader.next()).read()  # type: ignore[union-attr]
            parent = meta.get("parents", [{"id": "root"}])[0]["id"]
            return web.json_response(self.files[self.add(meta["title"], parent, data=bytes(data))])

        async def one(request: web.Request) -> web.StreamResponse:
            authorised(request)
            fid = request.match_info["fid"]
            if fid not in self.files:
                raise web.HTTPNotFound()
            if request.method == "DELETE":
                for d in self._descendants(fid):
                    self.files.pop(d)
                return web.Response(status=204)
            if request.query.get("alt") == "media":
                return web.Response(body=self.content[fid])
            return web.json_response(self.files[fid])

        async def trash(request: web.Request) -> web.Response:
            authorised(request)
            for d in self._descendants(request.match_info["fid"]):
                self.files[d]["trashed"] = True
            return web.json_response(self.files[request.match_info["fid"]])

        app = web.Application()
        app.router.add_post("/token", token)
        app.router.add_route("*", "/drive/v2/files", list_or_insert)
        app.router.add_post("/upload/drive/v2/files", upload)
        app.router.add_route("*", "/drive/v2/files/{fid}", one)
        app.router.add_post("/drive/v2/files/{fid}/trash", trash)
        return app


def _settings(tmp: Path, root: str) -> Path:
    """PyDrive's settings.yml as OSWorld's evaluation_examples/settings/googledrive has it."""
    (tmp / "client_secrets.json").write_text(
        json.dumps({"installed": {"client_id": "id", "client_secret": "s"}})
    )
    creds = {
        "client_id": "id",
        "client_secret": "s",
        "refresh_token": "refresh-me",
        "token_uri": f"{root}/token",
    }
    (tmp / "credentials.json").write_text(json.dumps(creds))
    settings = tmp / "settings.yml"
    settings.write_text(
        "client_config_backend: file\n"
        "client_config_file: client_secrets.json\n"
        "save_credentials: True\n"
        "save_credentials_backend: file\n"
        "save_credentials_file: credentials.json\n"
        "get_refresh_token: True\n"
        f"api_root: {root}\n"
    )
    return settings


def _with_drive(tmp: Path, drive: FakeDrive, steps: Any) -> Any:
    async def main() -> Any:
        runner = web.AppRunner(drive.app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            root = f"http://127.0.0.1:{runner.addresses[0][1]}"
            ctx = TaskContext(
                task_id="drive",
                cache_dir=tmp / "cache",
                download_cache=tmp / "downloads",
                google_drive_settings=str(_settings(tmp, root)),
            )
            return await steps(ctx)
        finally:
            await runner.cleanup()

    return run(main(), timeout=30)


def _titles(drive: FakeDrive, trashed: bool = False) -> set[str]:
    return {f["title"] for f in drive.files.values() if f["trashed"] == trashed}


def test_setup_deletes_makes_folders_and_uploads(tmp_path: Path) -> None:
    drive = FakeDrive()
    drive.add("environment_policy_report (draft).docx")
    drive.add("environment_policy_report (draft).doc")
    figures = drive.add("figures", mime=FOLDER)
    drive.add("1.png", parent=figures)
    drive.add("keep.txt")
    attachment = drive.add("attachment", mime=FOLDER)
    drive.add("Invoice.pdf", parent=attachment)
    invoice = tmp_path / "invoice.pdf"
    invoice.write_bytes(b"%PDF-1.4 invoice")

    async def steps(ctx: TaskContext) -> None:
        setup = HANDLERS["googledrive"]
        draft = " or ".join(f"title = 'environment_policy_report (draft).{x}'" for x in ("doc", "docx"))
        await setup(None, ctx, operation=["delete"], args=[{"query": draft, "trash": False}])
        assert _titles(drive) == {"figures", "1.png", "keep.txt", "attachment", "Invoice.pdf"}
        folder = f"title = 'figures' and 'root' in parents and mimeType = '{FOLDER}'"
        await setup(None, ctx, operation=["delete"], args=[{"query": folder, "trash": False}])
        assert _titles(drive) == {"keep.txt", "attachment", "Invoice.pdf"}
        await setup(None, ctx, operation=["delete"], args=[{"query": "title = 'attachment'", "trash": True}])
        assert _titles(drive, trashed=True) == {"attachment", "Invoice.pdf"}
        await setup(
            None,
            ctx,
            operation=["delete", "mkdirs", "upload"],
            args=[
                {"query": "title = 'keep.txt'"},
                {"path": ["meetings"]},
                {"url": str(invoice), "path": ["bills", "invoice.pdf"]},
            ],
        )
        await setup(None, ctx, operation=["mkdirs"], args=[{"path": ["meetings"]}])  # already there

    _with_drive(tmp_path, drive, steps)
    live = {f["title"]: f for f in drive.files.values() if not f["trashed"]}
    assert set(live) == {"meetings", "bills", "invoice.pdf"}
    assert live["invoice.pdf"]["parents"] == [{"id": live["bills"]["id"]}]
    assert drive.content[live["invoice.pdf"]["id"]] == b"%PDF-1.4 invoice"


def test_getter_follows_paths_and_queries(tmp_path: Path) -> None:
    drive = FakeDrive()
    policy = drive.add("environment_policy", mime=FOLDER)
    drive.add("environment_policy_report (draft)", parent=policy, data=b"docx bytes")
    figures = drive.add("figures", mime=FOLDER)
    drive.add("1.png", parent=figures, data=b"png one")
    drive.add("1.png", data=b"a 1.png in the root: not the one")
    old = drive.add("old", mime=FOLDER)
    drive.add("2.png", parent=old, data=b"trashed")
    drive.files[old]["trashed"] = True
    in_figures = f"title = 'figures' and trashed = false and 'root' in parents and mimeType = '{FOLDER}'"

    async def steps(ctx: TaskContext) -> list[Any]:
        get = GETTERS["googledrive_file"]
        return [
            await get(
                {
                    "type": "googledrive_file",
                    "path": ["environment_policy", "environment_policy_report (draft)"],
                    "dest": "report.docx",
                },
                None,  # type: ignore[arg-type]
                ctx,
            ),
            await get(
                {
                    "type": "googledrive_file",
                    "query_list": [
                        [in_figures, "title = '1.png' and trashed = false"],
                        ["title = 'nothing'"],
                    ],
                    "dest": ["1.png", "nothing"],
                },
                None,  # type: ignore[arg-type]
                ctx,
            ),
            await get(
                {"type": "googledrive_file", "path_list": [["old", "2.png"]], "dest": ["2.png"]},
                None,  # type: ignore[arg-type]
                ctx,
            ),
        ]

    report, (png, nothing), [trashed] = _with_drive(tmp_path, drive, steps)
    assert Path(report).read_bytes() == b"docx bytes" and Path(report).name == "report.docx"
    assert Path(png).read_bytes() == b"png one"
    assert nothing is None and trashed is None  # not there / only in the trash: None, as OSWorld


def test_a_refused_refresh_is_an_environment_error(tmp_path: Path) -> None:
    drive = FakeDrive()

    async def steps(ctx: TaskContext) -> None:
        creds = Path(str(ctx.google_drive_settings)).parent / "credentials.json"
        creds.write_text(json.dumps({**json.loads(creds.read_text()), "refresh_token": "revoked"}))
        await HANDLERS["googledrive"](None, ctx, operation=["mkdirs"], args=[{"path": ["x"]}])

    with pytest.raises(BrowserUnavailable, match="refused the refresh"):
        _with_drive(tmp_path, drive, steps)
    assert drive.requests == []
