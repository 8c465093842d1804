"""Google Drive for OSWorld's `googledrive` setup step and `googledrive_file` getter.

OSWorld uses PyDrive (Drive API v2, whose queries say `title = '...'`) with a PyDrive settings.yml that
names an OAuth client and a saved credentials file holding a refresh token. guirl reads the same
settings.yml (`TaskContext.google_drive_settings`) and speaks Drive v2's REST API directly with aiohttp:
PyDrive pulls in oauth2client and google-api-python-client, both retired.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from guirl.vmpool.tasks.files import fetch
from guirl.vmpool.tasks.setup_chrome import BrowserUnavailable

REQUIRES = ("yaml",)
"""Modules beyond guirl's own dependencies that this module imports (PyYAML, in the `osworld` extra)."""

API_ROOT = "https://www.googleapis.com"
TOKEN_URI = "https://oauth2.googleapis.com/token"
FOLDER = "application/vnd.google-apps.folder"
TIMEOUT = aiohttp.ClientTimeout(total=120)


def _resolve(name: str, settings: Path) -> Path:
    """PyDrive's paths are relative to OSWorld's working directory; also try the settings file's own."""
    path = Path(name)
    if path.is_absolute() or path.exists():
        return path
    return settings.parent / path.name


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def path_queries(path: list[str]) -> list[str]:
    """OSWorld's per-level queries for a file path on the Drive: folders, then the file."""
    last = len(path) - 1
    return [
        f"title = '{p}' and mimeType = '{FOLDER}' and trashed = false"
        if i < last
        else f"title = '{p}' and trashed = false"
        for i, p in enumerate(path)
    ]


class GoogleDrive:
    """A signed-in Drive v2 session (use as `async with`)."""

    def __init__(
        self,
        client_id: str,
        client_secret: str,
        refresh_token: str,
        token_uri: str = TOKEN_URI,
        api_root: str = API_ROOT,
    ) -> None:
        self._creds = {"client_id": client_id, "client_secret": client_secret, "refresh_token": refresh_token}
        self._token_uri = token_uri
        self._api = f"{api_root}/drive/v2"
        self._upload = f"{api_root}/upload/drive/v2/files"
        self._session: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] = {}

    @classmethod
    def from_settings(cls, settings_file: str | None) -> GoogleDrive:
        """The session PyDrive's settings.yml describes (`client_config_file` or `client_config`, and
        `save_credentials_file` with the refresh token; relative paths as OSWorld resolves them)."""
        if not settings_file:
            raise BrowserUnavailable(
                "Google Drive tasks need PyDrive's settings.yml: set env.google_drive_settings"
            )
        settings = Path(settings_file)
        conf = yaml.safe_load(settings.read_text()) or {}
        client = conf.get("client_config")
        if not client:
            secrets = json.loads(
                _resolve(conf.get("client_config_file", "client_secrets.json"), settings).read_text()
            )
            client = secrets.get("installed") or secrets.get("web") or secrets
        saved = conf.get("save_credentials_file")
        if not saved:
            raise BrowserUnavailable(
                f"{settings}: no save_credentials_file (the refresh token) in the settings"
            )
        creds = json.loads(_resolve(saved, settings).read_text())
        return cls(
            client["client_id"],
            client["client_secret"],
            creds["refresh_token"],
            creds.get("token_uri") or client.get("token_uri") or TOKEN_URI,
            # guirl's own key, for a Drive-compatible endpoint other than Google's (a test double)
            conf.get("api_root", API_ROOT),
        )

    async def __aenter__(self) -> GoogleDrive:
        self._session = aiohttp.ClientSession(timeout=TIMEOUT)
        try:
            async with self._session.post(
                self._token_uri, data={**self._creds, "grant_type": "refresh_token"}
            ) as resp:
                if resp.status != 200:
                    raise BrowserUnavailable(f"the token endpoint refused the refresh: {resp.status}")
                token = (await resp.json())["access_token"]
        except BaseException as exc:
            await self._session.close()
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                raise BrowserUnavailable(
                    f"the token endpoint {self._token_uri} did not answer: {exc}"
                ) from exc
            raise
        self._headers = {"Authorization": f"Bearer {token}"}
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()

    async def _json(self, method: str, url: str, **kw: Any) -> Any:
        assert self._session is not None
        try:
            async with self._session.request(method, url, headers=self._headers, **kw) as resp:
                resp.raise_for_status()
                return await resp.json() if resp.status != 204 else None
        except (aiohttp.ClientError, TimeoutError) as exc:  # the Drive, not the policy, failed
            raise BrowserUnavailable(f"Google Drive: {method} {url}: {exc}") from exc

    async def list(self, query: str) -> list[dict[str, Any]]:
        """Every file matching a Drive v2 query, following pages."""
        items: list[dict[str, Any]] = []
        params = {"q": query, "maxResults": "1000"}
        while True:
            page = await self._json("GET", f"{self._api}/files", params=params)
            items += page.get("items", [])
            if not page.get("nextPageToken"):
                return items
            params["pageToken"] = page["nextPageToken"]

    async def mkdirs(self, path: list[str]) -> str:
        """The id of the folder at `path` under the root, creating missing levels."""
        parent = "root"
        for name in path:
            found = await self.list(
                f"'{parent}' in parents and title = '{_quote(name)}' "
                f"and mimeType = '{FOLDER}' and trashed = false"
            )
            if found:
                parent = found[0]["id"]
                continue
            meta: dict[str, Any] = {"title": name, "mimeType": FOLDER}
            if parent != "root":
                meta["parents"] = [{"id": parent}]
            parent = (await self._json("POST", f"{self._api}/files", json=meta))["id"]
        return parent

    async def upload(self, local: Path, path: list[str]) -> None:
        parent = await self.mkdirs(path[:-1])
        meta: dict[str, Any] = {"title": path[-1]}
        if parent != "root":
            meta["parents"] = [{"id": parent}]
        form = aiohttp.MultipartWriter("related")
        form.append_json(meta)
        form.append(local.read_bytes(), {"Content-Type": "application/octet-stream"})
        await self._json("POST", self._upload, params={"uploadType": "multipart"}, data=form)

    async def delete(self, query: str, trash: bool) -> None:
        """OSWorld's clean-up: files matching the query first, then folders (taking their contents)."""
        q = query.strip()
        for folder_clause in (f"mimeType != '{FOLDER}'", f"mimeType = '{FOLDER}'"):
            for item in await self.list(f"( {q} ) and {folder_clause}" if q else folder_clause):
                if trash:
                    await self._json("POST", f"{self._api}/files/{item['id']}/trash")
                else:
                    await self._json("DELETE", f"{self._api}/files/{item['id']}")

    async def run_setup(self, config: dict[str, Any], download_cache: Path) -> None:
        """OSWorld's `googledrive` step: `operation[i]` in delete, mkdirs, upload with `args[i]`."""
        for operation, args in zip(config["operation"], config["args"], strict=True):
            if operation == "delete":
                await self.delete(args.get("query", ""), bool(args.get("trash", False)))
            elif operation == "mkdirs":
                await self.mkdirs(args["path"] if isinstance(args["path"], list) else [args["path"]])
            elif operation == "upload":
                local = await fetch(args["url"], download_cache)
                await self.upload(local, args["path"] if isinstance(args["path"], list) else [args["path"]])
            else:
                raise BrowserUnavailable(f"googledrive: operation {operation!r} is not implemented")

    async def download(self, queries: list[str], dest: Path) -> Path | None:
        """Follow the queries level by level from the root (the first match each time, as OSWorld does);
        None when a level matches nothing."""
        parent, item = "root", None
        for q in queries:
            found = await self.list(f"( {q} ) and '{parent}' in parents")
            if not found:
                return None
            item = found[0]
            parent = item["id"]
        if item is None:
            return None
        assert self._session is not None
        url = f"{self._api}/files/{item['id']}"
        try:
            async with self._session.get(url, params={"alt": "media"}, headers=self._headers) as resp:
                if resp.status == 404:  # listed, then gone: not there, as a level matching nothing
                    return None
                if resp.status == 403 and "fileNotDownloadable" in await resp.text():
                    return None  # a folder or a Google Doc where a file was expected: what the agent left
                resp.raise_for_status()
                data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:  # the Drive, not the policy, failed
            raise BrowserUnavailable(f"Google Drive: GET {url}: {exc}") from exc
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        return dest
