"""Request parsing and error replies shared by the VM server's routes."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


def error_reply(status: int, message: str) -> web.Response:
    return web.json_response({"status": "error", "message": message}, status=status)


def bad_request(message: str) -> web.HTTPBadRequest:
    """A 400 in OSWorld's error shape, to raise from anywhere in a route."""
    return web.HTTPBadRequest(
        text=json.dumps({"status": "error", "message": message}), content_type="application/json"
    )


async def request_fields(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (OSWorld's clients send JSON; some send form fields)."""
    if request.content_type == "application/json":
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(f"bad JSON: {exc}") from None
    else:
        data = dict(await request.post())
    if not isinstance(data, dict):
        raise bad_request("expected a JSON object")
    return data
