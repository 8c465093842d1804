"""The cloud lifecycle's own rules, cloud-independent: which instances the reaper takes, what a cluster
range may be, the run heartbeat, the launch rate limit, the boot script, durations on the command line."""

from __future__ import annotations

import json
import time

import pytest

from guirl.config.schema import CloudConfig
from guirl.config.validate import check_cidr, check_cloud
from guirl.vmpool.cli import parse_duration
from guirl.vmpool.cloud import (
    TAG_CREATED,
    TAG_POOL,
    TAG_RUN,
    TAG_TTL,
    CloudProvider,
    Instance,
    TokenBucket,
    reap,
    run_alive,
    user_data,
    write_heartbeat,
)
from tests.helpers import run

NOW = 1_800_000_000.0


def inst(
    i: str, run: str, *, age_s: float = 60, ttl_s: float = 86400, state: str = "running", pool: str = "w0"
):
    tags = {TAG_RUN: run, TAG_POOL: pool, TAG_CREATED: str(int(NOW - age_s)), TAG_TTL: str(int(ttl_s))}
    return Instance(i, state, "10.0.0.9", tags)


class Inventory:
    """A cloud's inventory as `reap` sees it: describe by tags, terminate by ids (recorded)."""

    name = "inventory"

    def __init__(self, instances: list[Instance]) -> None:
        self.instances = instances
        self.terminated: list[str] = []
        self.asked: list[dict] = []

    def describe(self, *, ids=None, tags=None):
        self.asked.append(dict(tags or {}))
        return [
            i
            for i in self.instances
            if all(v == "*" and k in i.tags or i.tags.get(k) == v for k, v in (tags or {}).items())
        ]

    def terminate(self, ids):
        self.terminated.extend(ids)


def test_reaper_takes_dead_expired_and_old_unknown_runs_only() -> None:
    cloud = Inventory(
        [
            inst("live", "run-live"),
            inst("dead", "run-dead"),
            inst("expired", "run-live", age_s=7200, ttl_s=3600),
            inst("unknown-young", "run-elsewhere", age_s=600),
            inst("unknown-old", "run-elsewhere-old", age_s=90000),
            inst("gone", "run-dead", state="terminated"),
            inst("mine", "run-self"),
        ]
    )
    verdicts = {"run-live": True, "run-dead": False, "run-self": False}
    doomed = run(
        reap(cloud, alive=verdicts.get, older_than_s=86400, keep_run="run-self", now=NOW)  # type: ignore[arg-type]
    )
    assert sorted(i.id for i in doomed) == ["dead", "expired", "unknown-old"]
    assert sorted(cloud.terminated) == ["dead", "expired", "unknown-old"]
    assert cloud.asked == [{TAG_RUN: "*"}]


def test_reaper_dry_run_and_filters_terminate_nothing_else() -> None:
    cloud = Inventory([inst("a", "r1"), inst("b", "r2", pool="w1")])
    doomed = run(reap(cloud, run="r1", alive=lambda r: False, dry_run=True, now=NOW))
    assert [i.id for i in doomed] == ["a"] and cloud.terminated == []
    run(reap(cloud, pool="w1", alive=lambda r: False, now=NOW))
    assert cloud.terminated == ["b"] and cloud.asked[-1] == {TAG_RUN: "*", TAG_POOL: "w1"}


def test_instance_without_tags_never_expires_and_counts_as_new() -> None:
    bare = Instance("x", "running", tags={TAG_RUN: "r", TAG_CREATED: "soon"})
    assert bare.expires == float("inf") and bare.created == 0.0


@pytest.mark.parametrize("cidr", ["", "0.0.0.0/0", "8.8.8.0/24", "::/0", "not a range", "2001:4860::/32"])
def test_cluster_ranges_that_reach_the_internet_are_refused(cidr: str) -> None:
    with pytest.raises(ValueError):
        check_cidr(cidr)


@pytest.mark.parametrize("cidr", ["10.0.0.0/8", "172.16.4.0/24", "192.168.1.7/32", "fd00::/8"])
def test_private_cluster_ranges_pass(cidr: str) -> None:
    assert check_cidr(cidr).is_private


def test_a_cloud_provider_needs_its_settings() -> None:
    cloud = CloudConfig(cluster_cidr="10.0.0.0/16")
    with pytest.raises(
        ValueError, match="cloud.aws.image_id, cloud.aws.subnet_id, cloud.aws.security_group_id"
    ):
        check_cloud("aws", cloud)
    with pytest.raises(ValueError, match="not a cloud"):
        check_cloud("gcp", cloud)
    check_cloud("local", CloudConfig())  # local desktops need none of it
    with pytest.raises(ValueError, match="internet"):
        CloudProvider(Inventory([]), run="r", cloud=CloudConfig(cluster_cidr="0.0.0.0/0"))  # type: ignore[arg-type]


def test_heartbeat_says_alive_then_dead(tmp_path) -> None:
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    assert run_alive(tmp_path, "run-1") is None  # never beat here: unknown
    write_heartbeat(run_dir, "run-1", interval_s=10)
    assert run_alive(tmp_path, "run-1") is True
    assert run_alive(tmp_path, "run-1", now=time.time() + 49) is True
    assert run_alive(tmp_path, "run-1", now=time.time() + 60) is False  # silent for more than 5 beats
    (run_dir / "heartbeat.json").write_text("{not json")
    assert run_alive(tmp_path, "run-1") is False
    (run_dir / "heartbeat.json").write_text(json.dumps({"time": "yesterday"}))
    assert run_alive(tmp_path, "run-1") is False


def test_token_bucket_holds_the_launch_rate() -> None:
    async def scenario() -> float:
        bucket = TokenBucket(rate=20.0, burst=2)
        start = time.monotonic()
        for _ in range(6):
            await bucket.take()
        return time.monotonic() - start

    # 2 at once, then 4 more at 20/s: at least 0.2 s (the bound the limiter enforces, not a timing target)
    assert run(scenario()) >= 0.19


def test_user_data_arms_the_ttl_shutdown_and_holds_no_secret() -> None:
    script = user_data(7200)
    assert script.startswith("#!/bin/sh\n") and "shutdown -P +120" in script
    assert user_data(5).count("+1 ") == 1  # under a minute still powers off, after one


@pytest.mark.parametrize(
    ("text", "seconds"), [("90m", 5400), ("6h", 21600), ("2d", 172800), ("45", 45), ("1.5h", 5400)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-3h", "0", "nan", "inf", "h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
