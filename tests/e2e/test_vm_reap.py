"""`guirl vm reap` against a cloud (Volcengine's API, served by its stand-in on loopback): instances of a run
whose heartbeat stopped are terminated, a live run's are kept, `--dry-run` terminates nothing, and a bad
duration is a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from guirl.config.schema import ENV_VARS, VolcengineConfig
from guirl.testing.fakes import FakeVolcengine
from guirl.vmpool.cloud import TAG_CREATED, TAG_POOL, TAG_RUN, TAG_TTL, write_heartbeat
from guirl.vmpool.clouds.volcengine import VolcengineCloud
from tests.helpers import ServedInThread

ROOT = Path(__file__).resolve().parents[2]
AK, SK = "AKLTreapertest", "SKreapertest"


def _launch(cloud: VolcengineCloud, run: str, n: int) -> list[str]:
    tags = {TAG_RUN: run, TAG_POOL: "worker0", TAG_CREATED: str(int(time.time())), TAG_TTL: "86400"}
    return [cloud.launch(token=f"{run}-{i}", tags=tags, user_data="#!/bin/sh\n") for i in range(n)]


def test_reap_terminates_the_instances_of_dead_runs_only(tmp_path: Path) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(name, None)
    server = ServedInThread(FakeVolcengine(credentials={AK: SK}, boot_delay_s=0.05))
    with server as fake:
        volc = VolcengineConfig(
            access_key=AK,
            secret_key=SK,
            image_id="image-guirl-desktop",
            subnet_id="subnet-guirl",
            security_group_id="sg-guirl",
            host=f"127.0.0.1:{fake.port}",
            scheme="http",
        )
        cloud = VolcengineCloud(volc, "cn-beijing")
        runs = tmp_path / "runs"
        for run, beat_age in (("run-dead", 3600.0), ("run-live", 0.0)):
            (runs / run).mkdir(parents=True)
            write_heartbeat(runs / run, run, interval_s=30)
            if beat_age:
                beat = json.loads((runs / run / "heartbeat.json").read_text())
                beat["time"] -= beat_age
                (runs / run / "heartbeat.json").write_text(json.dumps(beat))
        dead = _launch(cloud, "run-dead", 3)
        live = _launch(cloud, "run-live", 2)
        config = tmp_path / "cloud.toml"
        config.write_text(
            '[env]\nregion = "cn-beijing"\n[cloud]\ncluster_cidr = "10.0.0.0/16"\n[cloud.volcengine]\n'
            f'image_id = "image-guirl-desktop"\nhost = "127.0.0.1:{fake.port}"\nscheme = "http"\n'
            'subnet_id = "subnet-guirl"\nsecurity_group_id = "sg-guirl"\n'
        )
        env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and "proxy" not in k.lower()}
        env |= {"VOLC_ACCESSKEY": AK, "VOLC_SECRETKEY": SK}
        base = [sys.executable, str(ROOT / "bin" / "guirl"), "vm", "reap", "--provider", "volcengine"]
        base += ["--config", str(config), "--runs-dir", str(runs)]

        dry = subprocess.run([*base, "--dry-run"], capture_output=True, text=True, timeout=120, env=env)
        assert dry.returncode == 0, dry.stderr[-2000:]
        report = json.loads(dry.stdout.strip().splitlines()[-1])
        assert sorted(report["reaped"]) == sorted(dead) and report["dry_run"]
        assert sorted(i.id for i in server.call(fake.live)) == sorted(dead + live)

        done = subprocess.run(base, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert sorted(json.loads(done.stdout.strip().splitlines()[-1])["reaped"]) == sorted(dead)
        for _ in range(100):  # DELETING -> gone takes the fake's delete delay
            remaining = {i.id for i in server.call(fake.live) if i.status != "DELETING"}
            if remaining == set(live):
                break
            time.sleep(0.05)  # polling the fake's state, not synchronising with it
        assert remaining == set(live)
        assert SK not in done.stdout + done.stderr + dry.stdout + dry.stderr

        bad = subprocess.run(
            [*base, "--older-than", "soon"], capture_output=True, text=True, timeout=60, env=env
        )
        assert bad.returncode == 2 and "--older-than 'soon'" in bad.stderr
