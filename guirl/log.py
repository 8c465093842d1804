"""Structured logging: every line names the actor, pid and host that wrote it.

Each actor process calls ``setup_logging`` once at start; modules then use
``logging.getLogger(__name__)`` as usual. Structured fields go in ``extra={"fields": {...}}``
(or ``extra=log_fields(k=v)``): text lines append them as ``key=value``, JSON lines add them as
top-level keys. Namespacing them under "fields" keeps them from colliding with LogRecord
attributes, which ``logging`` refuses to overwrite.
"""

import datetime as dt
import json
import logging
import os
import socket
import sys
from typing import Any, TextIO

# JSON keys written by the formatter; a structured field with one of these names is written as
# "fields.<name>" rather than silently replacing the record's own value.
_RESERVED = frozenset({"ts", "level", "actor", "pid", "host", "logger", "msg", "exc", "stack"})


def log_fields(**fields: Any) -> dict[str, dict[str, Any]]:
    """The ``extra=`` argument that attaches ``fields`` to one log call."""
    return {"fields": fields}


def _timestamp(record: logging.LogRecord) -> str:
    when = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{int(record.msecs):03d}Z"


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    if text == "" or any(c in text for c in ' ="\n\t'):
        return json.dumps(text, ensure_ascii=False)
    return text


class _ActorFormatter(logging.Formatter):
    def __init__(self, actor: str, host: str) -> None:
        super().__init__()
        self.actor = actor
        self.host = host

    def _exc_text(self, record: logging.LogRecord) -> str | None:
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        return record.exc_text or None


class TextFormatter(_ActorFormatter):
    """``<ts> LEVEL actor=<a> pid=<p> host=<h> <logger>: <msg> key=value…`` plus any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        # os.getpid() at format time, so a spawned child reports its own pid.
        head = (
            f"{_timestamp(record)} {record.levelname} actor={self.actor} pid={os.getpid()} "
            f"host={self.host} {record.name}: {record.getMessage()}"
        )
        parts = [head, *(f"{k}={_logfmt_value(v)}" for k, v in _record_fields(record).items())]
        line = " ".join(parts)
        if exc := self._exc_text(record):
            line += "\n" + exc
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(_ActorFormatter):
    """One JSON object per line: ts, level, actor, pid, host, logger, msg, [exc, stack], fields…"""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "actor": self.actor,
            "pid": os.getpid(),
            "host": self.host,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if exc := self._exc_text(record):
            obj["exc"] = exc
        if record.stack_info:
            obj["stack"] = self.formatStack(record.stack_info)
        for key, value in _record_fields(record).items():
            obj[f"fields.{key}" if key in _RESERVED else key] = value
        # default=str: a field value JSON cannot encode (a Path, an enum) is logged, not dropped.
        return json.dumps(obj, ensure_ascii=False, default=str)


class _GuirlHandler(logging.StreamHandler):
    """Marks the handler setup_logging installed, so a later call knows it may close it."""


QUIET_LIBRARIES = (
    "botocore",
    "boto3",
    "s3transfer",
    "urllib3",
    "volcenginesdkcore",
    "alibabacloud_tea_openapi",
)
"""Libraries whose DEBUG logs would print secrets (botocore logs request headers and session tokens): kept at
INFO or above whatever `logging.level` says."""


def setup_logging(
    actor: str, *, level: str = "INFO", fmt: str = "text", stream: TextIO | None = None
) -> logging.Logger:
    """Configure this process's root logger to write ``fmt`` ("text" or "json") lines to ``stream``.

    Replaces any handlers already on the root logger, so calling it again reconfigures rather
    than duplicating output. ``stream`` defaults to stderr. Returns the root logger.
    """
    formatters = {"text": TextFormatter, "json": JsonFormatter}
    if fmt not in formatters:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {sorted(formatters)}")
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, _GuirlHandler):  # close only what we made; others belong to their owners
            old.close()
    handler = _GuirlHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatters[fmt](actor, socket.gethostname()))
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in QUIET_LIBRARIES:  # their DEBUG lines carry request headers: credentials and session tokens
        logging.getLogger(name).setLevel(max(root.level, logging.INFO))
    return root
