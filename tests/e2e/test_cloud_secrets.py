"""A whole `guirl eval` on cloud desktops (Volcengine's API, served by its stand-in on loopback) with the
access keys in the environment: every API call is signed with them, and afterwards neither key appears in
the run's output, its logs, its run directory or its message logs. (The instances have no VM server behind
their addresses, so every episode ends as an environment fault: the run is short, the signing is real.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from guirl.config.schema import ENV_VARS
from guirl.testing.fakes import FakeVolcengine
from tests.helpers import ServedInThread

ROOT = Path(__file__).resolve().parents[2]
AK = "AKLTleakcheckACCESS0123456789"
SK = "SKleakcheckSECRETvalue-9876543210"


def test_no_secret_reaches_output_logs_run_directory_or_message_logs(tmp_path: Path) -> None:
    with ServedInThread(FakeVolcengine(credentials={AK: SK}, boot_delay_s=0.1)) as fake:
        sets = [
            f"run.root_dir={tmp_path}",
            "env.provider=volcengine",
            "env.region=cn-beijing",
            "env.max_envs=1",
            "env.prewarm_envs=0",
            "cloud.cluster_cidr=10.0.0.0/16",
            f"cloud.volcengine.host=127.0.0.1:{fake.port}",
            "cloud.volcengine.scheme=http",
            "cloud.volcengine.image_id=image-guirl-desktop",
            "cloud.volcengine.subnet_id=subnet-guirl",
            "cloud.volcengine.security_group_id=sg-guirl",
            "cloud.ready_timeout_s=2",
            "eval.limit=1",
            "eval.max_attempts=1",
            "recorder.enabled=true",
            "logging.level=DEBUG",
        ]
        cmd = [
            sys.executable,
            str(ROOT / "bin" / "guirl"),
            "eval",
            "--config",
            str(ROOT / "configs" / "local_eval.toml"),
        ]
        cmd += [x for s in sets for x in ("--set", s)]
        env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and "proxy" not in k.lower()}
        env |= {"VOLC_ACCESSKEY": AK, "VOLC_SECRETKEY": SK}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
        calls = dict(fake.calls)
        live = fake.live()
    assert (
        calls.get("RunInstances", 0) >= 1
        and calls.get("DeleteInstances", 0) + calls.get("DeleteInstance", 0) >= 1
    ), (
        calls,
        out.stderr[-3000:],
    )
    assert live == []  # the pool terminated what it launched
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert list(run_dir.glob("msglogs/*")), "the run recorded no message logs"
    for secret in (AK, SK):
        assert secret not in out.stdout and secret not in out.stderr
        for path in run_dir.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), (
                    f"{secret[:6]}… in {path.relative_to(run_dir)}"
                )
    (pool,) = (run_dir / "pools").glob("*.json")  # the provider's figures, kept at the worker's end
    figures = json.loads(pool.read_text())
    assert figures["provider"] == "volcengine" and figures["pool"]["failed"] >= 1
    assert figures["cloud"]["failures"].get("ready:timeout", 0) >= 1 and figures["cloud"]["terminated"] >= 1
    assert figures["cloud"]["instance_minutes"] > 0  # a billed instance counts even if it never served
    config = (run_dir / "config.toml").read_text()
    assert 'access_key = "***"' in config and 'secret_key = "***"' in config
