"""Structured logging: actor/pid/host on every line, JSON parses, reconfiguration is idempotent."""

import io
import json
import logging
import os
import re
import socket

import pytest

from guirl.log import log_fields, setup_logging

pytestmark = pytest.mark.usefixtures("restore_root_logger")  # tests/conftest.py


TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO actor=broker pid=(\d+) host=(\S+) guirl\.test: hello$"
)


def test_text_line_carries_actor_pid_host() -> None:
    out = io.StringIO()
    setup_logging("broker", stream=out)
    logging.getLogger("guirl.test").info("hello")
    match = TEXT_LINE.match(out.getvalue().rstrip("\n"))
    assert match, out.getvalue()
    assert int(match.group(1)) == os.getpid()
    assert match.group(2) == socket.gethostname()


def test_json_lines_parse_and_carry_actor_pid_host() -> None:
    out = io.StringIO()
    setup_logging("learner", fmt="json", stream=out)
    log = logging.getLogger("guirl.test")
    log.info("step %d done", 3)
    log.warning("slow")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["msg"] for r in records] == ["step 3 done", "slow"]
    assert [r["level"] for r in records] == ["INFO", "WARNING"]
    for record in records:
        assert record["actor"] == "learner"
        assert record["pid"] == os.getpid()
        assert record["host"] == socket.gethostname()
        assert record["logger"] == "guirl.test"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"])


def test_calling_twice_does_not_duplicate_lines() -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging("a", stream=first)
    setup_logging("b", stream=second)
    logging.getLogger("guirl.test").info("once")
    assert first.getvalue() == ""
    assert second.getvalue().count("once") == 1
    assert "actor=b" in second.getvalue()


def test_level_filters_lines() -> None:
    out = io.StringIO()
    setup_logging("a", level="WARNING", stream=out)
    logging.getLogger("guirl.test").info("hidden")
    logging.getLogger("guirl.test").error("shown")
    assert "hidden" not in out.getvalue()
    assert "shown" in out.getvalue()


def test_extra_fields_in_text_and_json() -> None:
    text, js = io.StringIO(), io.StringIO()
    setup_logging("env", stream=text)
    logging.getLogger("guirl.test").info("reset", extra=log_fields(env_id=7, task="open file"))
    assert text.getvalue().rstrip("\n").endswith('reset env_id=7 task="open file"')

    setup_logging("env", fmt="json", stream=js)
    logging.getLogger("guirl.test").info("reset", extra={"fields": {"env_id": 7, "pid": "clash"}})
    record = json.loads(js.getvalue())
    assert record["env_id"] == 7
    # A field named like a reserved key must not replace the real pid.
    assert record["pid"] == os.getpid()
    assert record["fields.pid"] == "clash"


def _log_exception() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("guirl.test").exception("step failed")


def test_exception_traceback_in_text() -> None:
    out = io.StringIO()
    setup_logging("a", stream=out)
    _log_exception()
    text = out.getvalue()
    assert "ERROR actor=a" in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: boom" in text


def test_exception_traceback_in_json_is_one_line() -> None:
    out = io.StringIO()
    setup_logging("a", fmt="json", stream=out)
    _log_exception()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["msg"] == "step failed"
    assert "Traceback (most recent call last)" in record["exc"]
    assert "RuntimeError: boom" in record["exc"]


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="xml"):
        setup_logging("a", fmt="xml")
