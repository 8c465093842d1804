"""W&B tracking: mode resolution, metric flattening, secret redaction, real offline runs read back.

The offline tests run real wandb (its wandb-core service process included, about a second each) and
read the run's transaction log back. Any request wandb makes goes to a loopback HTTP server
(``WANDB_BASE_URL``), never to the internet, and wandb's cache/config files go under tmp_path.
"""

import base64
import http.server
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psutil
import pytest

from guirl.config import load_config
from guirl.config.schema import WandbConfig
from guirl.tracking import (
    Tracker,
    TrackingError,
    find_key,
    flatten_metrics,
    redact_config,
    resolve_mode,
)
from tests.helpers import history, read_records

FAKE_KEY = "fake0key0" + "7" * 31  # shaped like a W&B key (40 characters), valid nowhere
WANDB_ENV = ("WANDB_MODE", "WANDB_SILENT", "WANDB_ERROR_REPORTING")


class _Server(http.server.ThreadingHTTPServer):
    requests: list[str]
    keys: list[str]


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every request 401 (an unknown key), recording its path."""

    def _answer(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")  # type: ignore[attr-defined]
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Basic "):  # W&B sends "api:<key>"
            self.server.keys.append(base64.b64decode(auth[6:]).decode().partition(":")[2])  # type: ignore
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"errors": [{"message": "user is not logged in"}]}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def wandb_server() -> Iterator[_Server]:
    """A loopback stand-in for the W&B server that refuses every key and counts requests."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.requests, server.keys = [], []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(autouse=True)
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wandb_server: _Server) -> None:
    """wandb's user files under tmp_path, its server on loopback, no W&B settings from the caller."""
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # not the caller's `wandb login`
    for name in (*WANDB_ENV, "WANDB_API_KEY", "WANDB_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{wandb_server.server_port}")


def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir(parents=True)
    return path


def only(records: list[Any], kind: str) -> list[Any]:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def wandb_core_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "wandb-core"]


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


# --------------------------------------------------------------------------- pure parts


def test_resolve_mode() -> None:
    assert resolve_mode(WandbConfig()) == "disabled"  # auto, no key
    assert resolve_mode(WandbConfig(key="k")) == "online"  # auto, key
    assert resolve_mode(WandbConfig(mode="offline")) == "offline"  # no key needed
    assert resolve_mode(WandbConfig(mode="disabled", key="k")) == "disabled"
    with pytest.raises(TrackingError, match="no W&B API key was found: run `wandb login`, or set WANDB_API"):
        resolve_mode(WandbConfig(mode="online"))
    # W&B's own values of WANDB_MODE, as W&B means them
    assert resolve_mode(WandbConfig(mode="dryrun")) == "offline"
    assert resolve_mode(WandbConfig(mode="run", key="k")) == "online"
    assert load_config(None, env={"WANDB_MODE": "dryrun"}).wandb.mode == "dryrun"


def test_the_key_is_found_where_w_and_b_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """guirl's WANDB_KEY (wandb.key), then W&B's WANDB_API_KEY, then `wandb login`'s netrc for the host of
    WANDB_BASE_URL (the loopback stand-in here)."""
    netrc_file = tmp_path / "netrc"
    host = os.environ["WANDB_BASE_URL"].removeprefix("http://")  # host:port, as `wandb login` writes it
    netrc_file.write_text(f"machine {host}\n  login user\n  password {FAKE_KEY}n\n")
    netrc_file.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc_file))
    assert find_key(WandbConfig()) == (FAKE_KEY + "n", f"{netrc_file} (`wandb login`)")
    assert resolve_mode(WandbConfig()) == "online"
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY + "e")
    assert find_key(WandbConfig()) == (FAKE_KEY + "e", "WANDB_API_KEY")
    assert find_key(WandbConfig(key=FAKE_KEY)) == (FAKE_KEY, "wandb.key")
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_BASE_URL", "https://api.wandb.ai")  # another host: the netrc has no key for it
    assert find_key(WandbConfig()) == ("", "") and resolve_mode(WandbConfig()) == "disabled"


@pytest.mark.parametrize("where", ["WANDB_API_KEY", "netrc"])
def test_w_and_bs_own_authentication_reaches_the_server(
    where: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    wandb_server: _Server,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A user who ran `wandb login` or set WANDB_API_KEY gets an online run (here refused by the stand-in,
    which records the credentials wandb sent); the key is nowhere on disk but where the user put it."""
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    if where == "WANDB_API_KEY":
        monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    else:
        host = os.environ["WANDB_BASE_URL"].removeprefix("http://")
        (tmp_path / "netrc").write_text(f"machine {host} login user password {FAKE_KEY}\n")
        (tmp_path / "netrc").chmod(0o600)
        monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    directory = run_dir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="guirl.tracking"):
        tracker = Tracker.open(WandbConfig(), run_dir=directory, config={}, job="train")
    assert FAKE_KEY in wandb_server.keys  # wandb was given the key W&B's own tools would use
    # the server refused it: `auto` went online only on W&B's own credentials, so the run goes on unlogged
    assert not tracker.enabled and "logging to W&B is off for this run" in caplog.text
    assert files_containing(directory, FAKE_KEY) == []
    with pytest.raises(TrackingError, match="W&B could not start the online run"):  # asked for: refused
        Tracker.open(WandbConfig(mode="online"), run_dir=directory, config={}, job="train")


def test_flatten_keeps_numeric_leaves_with_slash_keys() -> None:
    metrics = {
        "loss": 0.5,
        "n": 3,
        "ok": True,
        "train": {"kl": np.float32(0.25), "tokens": np.int64(7), "clip": {"frac": 0.1}},
        "rewards": [1.0, 0.0],
        "task": "t1",
        "none": None,
        "empty": {},
    }
    flat = flatten_metrics(metrics)
    assert flat == {"loss": 0.5, "n": 3, "ok": 1, "train/kl": 0.25, "train/tokens": 7, "train/clip/frac": 0.1}
    assert [type(v) for v in flat.values()] == [float, int, int, float, int, float]


def test_redact_config_hides_every_secret() -> None:
    cfg = load_config(
        env={"WANDB_KEY": FAKE_KEY, "OPENAI_API_KEY": "sk-x"}, overrides=[f"run.name=leak-{FAKE_KEY}"]
    )
    cfg.eval.domains.append(FAKE_KEY)
    sent = redact_config(msgspec.to_builtins(cfg), secrets=(FAKE_KEY,))
    assert sent["wandb"]["key"] == "***" and sent["inference"]["openai"]["api_key"] == "***"
    assert sent["eval"]["domains"] == ["***"]
    assert sent["cloud"]["volcengine"]["secret_key"] == ""  # unset secrets stay visibly empty
    assert FAKE_KEY not in json.dumps(sent) and "sk-x" not in json.dumps(sent)
    assert sent["run"]["name"] == "leak-***"
    assert redact_config({"a": {"b": "x"}}, secrets=("",)) == {"a": {"b": "x"}}  # no key: nothing to hide
    assert sent["train"] == msgspec.to_builtins(cfg.train)


# --------------------------------------------------------------------------- disabled / missing wandb


def test_disabled_tracker_is_a_no_op_that_never_imports_wandb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` now raises ImportError
    directory = run_dir(tmp_path)
    for cfg in (WandbConfig(), WandbConfig(mode="disabled", key=FAKE_KEY)):
        with Tracker.open(cfg, run_dir=directory, config={}, job="train") as tracker:
            assert tracker.mode == "disabled" and not tracker.enabled and tracker.run_path is None
            tracker.log({"loss": 1.0}, step=0)
            tracker.summary({"final": 1})
        tracker.close()  # again: idempotent
    assert list(directory.iterdir()) == []
    assert not any(name in os.environ for name in WANDB_ENV)


def test_missing_wandb_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    for cfg in (WandbConfig(mode="offline"), WandbConfig(key=FAKE_KEY)):
        with pytest.raises(TrackingError, match=r"wandb is not installed: pip install 'guirl\[wandb\]'"):
            Tracker.open(cfg, run_dir=run_dir(tmp_path / cfg.mode), config={}, job="train")
    assert not any(name in os.environ for name in WANDB_ENV)


def test_online_without_key_fails_before_wandb_starts(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="no W&B API key"):
        Tracker.open(WandbConfig(mode="online"), run_dir=run_dir(tmp_path), config={}, job="train")
    assert wandb_core_children() == []


# --------------------------------------------------------------------------- real wandb


def test_offline_run_records_history_and_never_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wandb_server: _Server
) -> None:
    # the key arrives the two ways a person gives it: the environment, and `--set` on the command line
    # (wandb would copy sys.argv into the run's metadata)
    monkeypatch.setattr(sys, "argv", ["guirl", "train", "--set", f"wandb.key={FAKE_KEY}"])
    cfg = load_config(env={"WANDB_KEY": FAKE_KEY, "WANDB_MODE": "offline"}, overrides=["wandb.tags=['t1']"])
    directory = run_dir(tmp_path)
    with Tracker.open(cfg.wandb, run_dir=directory, config=msgspec.to_builtins(cfg), job="train") as tracker:
        assert tracker.mode == "offline" and tracker.enabled
        assert os.environ["WANDB_MODE"] == "offline"
        path = tracker.run_path
        assert path is not None and path.parent == directory / "wandb"
        assert path.name.startswith("offline-run-")
        for step in range(3):
            tracker.log({"loss": 1.0 / (step + 1), "grpo": {"clipfrac": 0.1 * step}, "rewards": [1, 0]}, step)
        tracker.summary({"final": {"success_rate": 0.5}})
    assert not tracker.enabled
    assert not any(name in os.environ for name in WANDB_ENV)  # the environment is as it was
    assert wandb_core_children() == []  # close stopped wandb's service process

    records = read_records(next(path.glob("run-*.wandb")))
    rows = history(records)
    assert [r["_step"] for r in rows] == [0, 1, 2]
    assert [r["loss"] for r in rows] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert [r["grpo/clipfrac"] for r in rows] == [0.0, 0.1, 0.2]
    assert not any("rewards" in r for r in rows)
    [run] = only(records, "run")
    assert run.display_name == directory.name and run.job_type == "train" and list(run.tags) == ["t1"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["wandb"]["key"] == "***" and config["wandb"]["mode"] == "offline"
    summary_keys = {"/".join(u.nested_key) or u.key for s in only(records, "summary") for u in s.update}
    assert "final/success_rate" in summary_keys
    assert [e.exit_code for e in only(records, "exit")] == [0]

    assert files_containing(directory, FAKE_KEY) == []
    assert files_containing(tmp_path / "wandb-home", FAKE_KEY) == []
    assert wandb_server.requests == []


def test_run_left_by_an_exception_is_marked_failed(tmp_path: Path) -> None:
    directory = run_dir(tmp_path)
    with pytest.raises(RuntimeError, match="learner died"):
        with Tracker.open(WandbConfig(mode="offline"), run_dir=directory, config={}, job="eval") as tracker:
            path = tracker.run_path
            tracker.log({"accuracy": 0.5}, step=0)
            raise RuntimeError("learner died")
    assert path is not None
    records = read_records(next(path.glob("run-*.wandb")))
    assert [e.exit_code for e in only(records, "exit")] == [1]
    assert [r["accuracy"] for r in history(records)] == [0.5]


def test_two_trackers_in_one_process_are_two_runs(tmp_path: Path) -> None:
    directory = run_dir(tmp_path)
    cfg = WandbConfig(mode="offline")
    with (
        Tracker.open(cfg, run_dir=directory, config={}, job="train") as train,
        Tracker.open(cfg, run_dir=directory, config={}, job="eval") as evaluation,
    ):
        assert train.run_path != evaluation.run_path
        paths = [train.run_path, evaluation.run_path]
        train.log({"loss": 1.0}, step=0)
        evaluation.log({"accuracy": 0.5}, step=0)
        train.close()  # the other run, and wandb's service, go on
        assert os.environ["WANDB_MODE"] == "offline" and len(wandb_core_children()) == 1
        evaluation.log({"accuracy": 0.75}, step=1)
    assert not any(name in os.environ for name in WANDB_ENV) and wandb_core_children() == []
    runs = [read_records(next(p.glob("run-*.wandb"))) for p in paths if p is not None]
    assert [only(records, "run")[0].job_type for records in runs] == ["train", "eval"]
    assert [r.get("loss") for r in history(runs[0])] == [1.0]
    assert [r.get("accuracy") for r in history(runs[1])] == [0.5, 0.75]


def test_wandb_dying_mid_run_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = WandbConfig(mode="offline")
    with (
        Tracker.open(cfg, run_dir=run_dir(tmp_path), config={}, job="train") as tracker,
        caplog.at_level(logging.WARNING, logger="guirl.tracking"),
    ):
        tracker.log({"loss": 1.0}, step=0)
        [core] = wandb_core_children()
        core.kill()  # the service process wandb.init spawned: every later call to wandb fails
        core.wait(timeout=10)
        tracker.log({"loss": 0.5}, step=1)
        assert not tracker.enabled
        tracker.log({"loss": 0.25}, step=2)
        tracker.summary({"final": 1})
        tracker.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("W&B log failed")
    assert not any(name in os.environ for name in WANDB_ENV)


def test_online_refused_by_the_server_is_a_clear_error_without_the_key_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wandb_server: _Server
) -> None:
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    directory = run_dir(tmp_path)
    with pytest.raises(TrackingError, match="W&B could not start the online run for 'train'"):
        Tracker.open(WandbConfig(key=FAKE_KEY), run_dir=directory, config={}, job="train")
    assert "POST /graphql" in wandb_server.requests  # it did ask the (loopback) server
    assert files_containing(directory, FAKE_KEY) == []
    assert files_containing(tmp_path / "wandb-home", FAKE_KEY) == []
    assert not any(name in os.environ for name in WANDB_ENV)
    assert wandb_core_children() == []


def test_offline_process_sends_nothing_to_the_server(tmp_path: Path, wandb_server: _Server) -> None:
    # wandb exports its own usage telemetry to the server when the process exits, so this needs a
    # process of its own that ends.
    script = (
        "import sys; from pathlib import Path; from guirl.config.schema import WandbConfig;"
        "from guirl.tracking import Tracker;"
        "t = Tracker.open(WandbConfig(mode='offline', key=sys.argv[2]), run_dir=Path(sys.argv[1]),"
        " config={}, job='train'); t.log({'loss': 1.0}, step=0); t.close()"
    )
    directory = run_dir(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", script, str(directory), FAKE_KEY], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert wandb_server.requests == []
    assert list((directory / "wandb").glob("offline-run-*/run-*.wandb"))
