"""The Volcengine provider end to end: `VMPool` over `CloudProvider` over `VolcengineCloud`, the real SDK
signing real requests to `FakeVolcengine` on loopback (no VM servers behind the instances' addresses: a
`health=` callable stands in for them). Pre-warming, leases, both kinds of reset, closing, the reaper after
a SIGKILLed pool, throttling, refused credentials, security-group hygiene, and secrets kept out of logs."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import signal
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from guirl.config.schema import CloudConfig, VolcengineConfig
from guirl.testing.fakes import FakeVolcengine
from guirl.testing.fakes.volcengine import signature
from guirl.vmpool.cloud import TAG_POOL, TAG_RUN, TAG_TTL, CloudError, CloudProvider, reap, run_alive
from guirl.vmpool.clouds.volcengine import VolcengineCloud
from guirl.vmpool.pool import VMPool
from tests.helpers import run

ROOT = Path(__file__).resolve().parents[2]
AK = "AKLTgUiRlTeStAcCeSsKeY7Q"  # recognisable, so a leak into a log or an error is found
SK = "gUiRlTeStSeCrEtKeY/9xW2=="
REGION = "cn-beijing"
CLUSTER = "10.0.0.0/16"


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK sends loopback calls through HTTP(S)_PROXY when set, ignoring NO_PROXY (doc §1)."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def settings(fake: FakeVolcengine, **cloud: object) -> CloudConfig:
    volc = VolcengineConfig(
        access_key=AK,
        secret_key=SK,
        image_id="image-guirl-desktop",
        subnet_id="subnet-guirl",
        security_group_id="sg-guirl",
        host=fake.endpoint,
        scheme="http",
    )  # no zone_id: the adapter asks the subnet's
    fast = dict(launch_rate_per_s=100.0, launch_burst=16, launch_concurrency=16, ready_timeout_s=30.0)
    return CloudConfig(cluster_cidr=CLUSTER, ttl_s=3600.0, volcengine=volc, **{**fast, **cloud})  # type: ignore[arg-type]


def adapter(cloud: CloudConfig) -> VolcengineCloud:
    return VolcengineCloud(cloud.volcengine, REGION, poll_s=0.05, wait_s=20.0)


async def answering(address: str, timeout_s: float) -> bool:
    return True


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll `condition` (the fake changes status over time; nothing to wait on but its answers)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert AK not in text and SK not in text


def test_the_fakes_signature_is_the_docs_worked_example() -> None:
    headers = {
        "content-type": "text/plain",
        "host": "127.0.0.1:18080",
        "x-content-sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "x-date": "20240102T030405Z",
        "x-sdk-invocation-id": "00000000-0000-4000-8000-000000000000",
        "x-sdk-request": "attempt=1; max=4",
    }
    raw = (
        "InstanceIds.1=i-abc123&TagFilters.1.Key=guirl%3Acluster&TagFilters.1.Values.1=c+1&MaxResults=10"
        "&Action=DescribeInstances&Version=2020-04-01"
    )
    signed = "content-type;host;x-content-sha256;x-date;x-sdk-invocation-id;x-sdk-request".split(";")
    got = signature("EXAMPLESECRET", "cn-beijing", "ecs", "GET", "/", raw, headers, signed, b"")
    assert got == "d3691b1dd824a7a1f22f40cca67cb6999791c6848f0b9535cf7c07a97d01ced0"  # doc §3.3


def test_prewarm_lease_reset_by_replace_root_and_relaunch_then_close(caplog, capfd) -> None:
    caplog.set_level(logging.DEBUG)  # the SDK's loggers included: nothing secret may reach them

    async def main() -> None:
        async with FakeVolcengine(credentials={AK: SK}) as fake:
            fake.page_limit = 5  # listings of 16 instances follow NextToken
            rebuilt: list[str] = []
            fake.on_replace_root = rebuilt.append
            cloud = settings(fake)
            provider = CloudProvider(adapter(cloud), run="run-a", cloud=cloud, health=answering)
            pool = VMPool(
                provider, tag="w0", max_envs=16, prewarm=16, prewarm_concurrency=16, health_interval_s=3600
            )
            await pool.start()
            try:
                live = fake.live()
                assert len(live) == 16 and {i.status for i in live} == {"RUNNING"}
                assert fake.calls["RunInstances"] == 16 and fake.calls["DescribeSubnetAttributes"] >= 1
                subnet = ipaddress.ip_network("10.0.1.0/24")
                assert len({i.ip for i in live}) == 16 and all(
                    ipaddress.ip_address(i.ip) in subnet for i in live
                )
                assert not any(i.eip for i in live)  # private addresses only
                assert all(i.tags[TAG_RUN] == "run-a" and i.tags[TAG_POOL] == "w0" for i in live)
                assert all(i.tags[TAG_TTL] == "3600" and "shutdown -P +60" in i.user_data for i in live)
                ingress = [r for r in fake.security_groups["sg-guirl"] if r["Direction"] == "ingress"]
                assert [(r["Protocol"], r["PortStart"], r["PortEnd"], r["CidrIp"]) for r in ingress] == [
                    ("tcp", 5000, 5000, CLUSTER)
                ]
                assert sorted(await provider.list("w0")) == sorted(i.id for i in live)

                # release: the root volume is replaced; the instance and its address stay
                lease = await pool.acquire()
                ip = fake.instances[lease.vm_id].ip
                await pool.release(lease.lease_id)
                assert rebuilt == [lease.vm_id] and fake.replaced[lease.vm_id] == 1
                assert (
                    fake.instances[lease.vm_id].status == "RUNNING" and fake.instances[lease.vm_id].ip == ip
                )
                assert fake.calls["StopInstance"] == 1 and provider.address(lease.vm_id) == lease.address
                # the new disk runs its boot script again: its timer at what is left of the TTL, not all of it
                assert "shutdown -P +59 " in fake.instances[lease.vm_id].user_data

                # relaunch: the instance is replaced by a new one under the same VM id
                provider.cfg = msgspec.structs.replace(cloud, reset="relaunch")
                lease = await pool.acquire()
                before = provider.vms[lease.vm_id].instance
                await pool.release(lease.lease_id)
                after = provider.vms[lease.vm_id].instance
                assert after != before and fake.instances[after].status == "RUNNING"
                assert before not in fake.instances or fake.instances[before].status == "DELETING"
                assert fake.calls["RunInstances"] == 17 and len(rebuilt) == 1
                m, counts = provider.metrics(), pool.metrics()
                assert m["reset.replace_root"] == 1 and m["reset.relaunch"] == 1 and counts["resets"] == 2
                assert counts["replaced"] == 0 and counts["idle"] == 16
            finally:
                await pool.close()
            assert {i.status for i in fake.live()} <= {"DELETING"}
            await until(lambda: not fake.live())
            assert await asyncio.to_thread(provider.api.describe, tags={TAG_RUN: "run-a"}) == []

    run(main(), timeout=60)
    out, err = capfd.readouterr()
    assert "volcenginesdkcore" in caplog.text  # the SDK did log (its response bodies), at debug level
    assert_no_secret(caplog.text, out, err)


POOL = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from pathlib import Path
    from guirl.config.schema import CloudConfig, VolcengineConfig
    from guirl.vmpool.cloud import CloudProvider, write_heartbeat
    from guirl.vmpool.clouds.volcengine import VolcengineCloud
    from guirl.vmpool.pool import VMPool

    async def answering(address, timeout_s):
        return True

    async def main():
        endpoint, runs = sys.argv[1], Path(sys.argv[2])
        volc = VolcengineConfig(
            access_key=os.environ["TEST_VOLC_AK"], secret_key=os.environ["TEST_VOLC_SK"],
            image_id="image-guirl-desktop", subnet_id="subnet-guirl", security_group_id="sg-guirl",
            host=endpoint, scheme="http",
        )
        cloud = CloudConfig(cluster_cidr="10.0.0.0/16", ttl_s=3600.0, launch_rate_per_s=100.0,
                            volcengine=volc)
        (runs / "run-killed").mkdir(parents=True)
        write_heartbeat(runs / "run-killed", "run-killed", 30.0)
        api = VolcengineCloud(volc, "cn-beijing", poll_s=0.05)
        provider = CloudProvider(api, run="run-killed", cloud=cloud, health=answering)
        pool = VMPool(provider, tag="w0", max_envs=4, prewarm=4, health_interval_s=3600)
        await pool.start()
        print(json.dumps(pool.metrics()), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def test_the_reaper_takes_every_instance_of_a_sigkilled_pool(tmp_path) -> None:
    script, runs = tmp_path / "pool.py", tmp_path / "runs"
    script.write_text(POOL)

    async def main() -> None:
        async with FakeVolcengine(credentials={AK: SK}) as fake:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(script),
                fake.endpoint,
                str(runs),
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(ROOT), "TEST_VOLC_AK": AK, "TEST_VOLC_SK": SK},
            )
            try:
                assert json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))["idle"] == 4  # type: ignore[union-attr]
            finally:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
            leaked = fake.live()
            assert len(leaked) == 4 and all(i.tags[TAG_RUN] == "run-killed" for i in leaked)
            cloud = settings(fake)
            api = adapter(cloud)

            def alive_in(later_s: float) -> Callable[[str], bool | None]:
                return lambda run: run_alive(runs, run, now=time.time() + later_s)

            # its heartbeat is fresh: the next pool's start leaves the run alone
            fresh = VMPool(
                CloudProvider(api, run="run-b", cloud=cloud, health=answering, alive=alive_in(0)), tag="w0"
            )
            await fresh.start()
            await fresh.close()
            assert fresh.counters["reaped"] == 0 and len(fake.live()) == 4
            # past their TTL they would go (a dry run only lists them)
            expired = await reap(api, run="run-killed", now=time.time() + 3601, dry_run=True)
            assert sorted(i.id for i in expired) == sorted(i.id for i in leaked) and len(fake.live()) == 4
            # its heartbeat silent for five beats: the run is dead, and a pool of its tag reaps it at start
            later = VMPool(
                CloudProvider(api, run="run-c", cloud=cloud, health=answering, alive=alive_in(200)), tag="w0"
            )
            await later.start()
            await later.close()
            assert later.counters["reaped"] == 4
            assert {i.status for i in fake.live()} <= {"DELETING"}
            await until(lambda: not fake.live())

    run(main(), timeout=60)


def test_half_the_calls_throttled_before_or_after_acting_still_gives_exactly_eight() -> None:
    async def main() -> None:
        async with FakeVolcengine(credentials={AK: SK}, seed=9) as fake:
            # a quarter of calls refused before acting, a third of the rest after acting: half throttled
            fake.throttle_rate, fake.throttle_after_rate = 0.25, 1 / 3
            cloud = settings(fake, api_attempts=40)
            provider = CloudProvider(adapter(cloud), run="run-t", cloud=cloud, health=answering)
            pool = VMPool(
                provider, tag="w0", max_envs=8, prewarm=8, prewarm_concurrency=8, health_interval_s=3600
            )
            await pool.start()
            try:
                live = fake.live()
                assert len(live) == 8 and pool.metrics()["idle"] == 8  # no duplicate from a replayed launch
                assert fake.calls["RunInstances"] > 8 and fake.throttled["RunInstances"] > 0
                assert provider.metrics()["throttled"] == sum(fake.throttled.values())
                # a reset under the same throttling: each step is done once, however often it is sent
                lease = await pool.acquire()
                await pool.release(lease.lease_id)
                assert fake.replaced[lease.vm_id] == 1 and pool.metrics()["resets"] == 1
                assert fake.instances[lease.vm_id].status == "RUNNING"
            finally:
                fake.throttle_rate = fake.throttle_after_rate = 0.0
                await pool.close()
            await until(lambda: not fake.live())

    run(main(), timeout=60)


def test_a_reset_that_leaves_the_instance_stopped_starts_it() -> None:
    async def main() -> None:
        async with FakeVolcengine(credentials={AK: SK}) as fake:
            fake.rebuild_leaves_stopped = True
            cloud = settings(fake)
            provider = CloudProvider(adapter(cloud), run="run-s", cloud=cloud, health=answering)
            vm = await provider.create("w0")
            await provider.reset(vm)
            assert fake.instances[vm].status == "RUNNING" and fake.calls["StartInstance"] == 1
            await provider.delete(vm)

    run(main(), timeout=30)


@pytest.mark.parametrize(
    ("credentials", "skew_s", "code"),
    [
        ({AK: "another-secret"}, 0.0, "SignatureDoesNotMatch"),
        ({"AKLTsomeoneelse": SK}, 0.0, "InvalidAccessKey"),
        ({AK: SK}, 3600.0, "InvalidTimestamp"),
    ],
)
def test_refused_credentials_fail_clearly_at_once(credentials, skew_s, code, caplog, capfd) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        async with FakeVolcengine(credentials=credentials) as fake:
            fake.clock_skew_s = skew_s
            cloud = settings(fake)
            provider = CloudProvider(adapter(cloud), run="run-x", cloud=cloud, health=answering)
            with pytest.raises(CloudError) as refused:
                await provider.create("w0")
            assert refused.value.code == code and not refused.value.retryable
            assert code in str(refused.value) and refused.value.__cause__ is None
            assert sum(fake.calls.values()) == 1  # not retried, by the SDK or by the provider
            assert fake.instances == {}
            assert_no_secret(str(refused.value), repr(refused.value))

    run(main(), timeout=30)
    out, err = capfd.readouterr()
    assert_no_secret(caplog.text, out, err)


@pytest.mark.parametrize(
    ("protocol", "start", "end", "cidr"),
    [
        ("tcp", 5000, 5000, "0.0.0.0/0"),
        ("tcp", 1, 65535, "0.0.0.0/0"),
        ("all", -1, -1, "0.0.0.0/0"),
        ("tcp", 4000, 6000, "10.0.0.0/8"),
        ("tcp", 5000, 5000, "::/0"),
    ],
)
def test_a_security_group_open_wider_than_the_cluster_is_refused(protocol, start, end, cidr) -> None:
    async def main() -> None:
        async with FakeVolcengine(credentials={AK: SK}) as fake:
            fake.allow(protocol, start, end, cidr)
            cloud = settings(fake)
            provider = CloudProvider(adapter(cloud), run="run-n", cloud=cloud, health=answering)
            with pytest.raises(CloudError, match=f"opens port 5000 .* to {cidr}") as refused:
                await VMPool(provider, tag="w0", max_envs=2, prewarm=2, health_interval_s=3600).start()
            assert refused.value.code == "InsecureSecurityGroup" and not refused.value.retryable
            assert fake.calls["RunInstances"] == 0 and fake.calls["AuthorizeSecurityGroupIngress"] == 0

    run(main(), timeout=30)


def test_a_narrow_or_unrelated_rule_is_kept_and_the_cluster_rule_added_once() -> None:
    async def main() -> None:
        async with FakeVolcengine(credentials={AK: SK}) as fake:
            fake.allow("tcp", 22, 22, "0.0.0.0/0")  # another port: none of guirl's business
            fake.allow("tcp", 5000, 5000, "10.0.1.0/24")  # inside the cluster, but not all of it
            api = adapter(settings(fake))
            await asyncio.to_thread(api.check_network, CLUSTER, 5000)
            await asyncio.to_thread(api.check_network, CLUSTER, 5000)  # now present: nothing to add
            rules = [(r["PortStart"], r["CidrIp"]) for r in fake.security_groups["sg-guirl"]]
            assert rules == [(-1, "0.0.0.0/0"), (22, "0.0.0.0/0"), (5000, "10.0.1.0/24"), (5000, CLUSTER)]
            assert fake.calls["AuthorizeSecurityGroupIngress"] == 1

    run(main(), timeout=30)


@pytest.mark.parametrize(
    ("fault", "code", "throttled", "retryable"),
    [
        ({"throttle_rate": 1.0}, "AccountFlowLimitExceeded", True, True),
        ({"throttle_rate": 1.0, "throttle_status": 400}, "AccountFlowLimitExceeded", True, True),
        ({"throttle_rate": 1.0, "throttle_status": 200}, "AccountFlowLimitExceeded", True, True),
        ({"error_rate": 1.0}, "InternalError", False, True),
        ({"closed": True}, "ConnectionError", False, True),
    ],
)
def test_how_a_failed_call_reads(fault, code, throttled, retryable) -> None:
    """Throttling whatever its status (doc §8), a 5xx, a refused connection: each a CloudError the provider
    knows to back off on, at the first attempt (the SDK's own retry is off)."""

    async def main() -> None:
        async with FakeVolcengine(credentials={AK: SK}) as fake:
            api = adapter(settings(fake))
            for name, value in fault.items():
                if name == "closed":
                    await fake.close()
                else:
                    setattr(fake, name, value)
            with pytest.raises(CloudError) as failed:
                await asyncio.to_thread(api.describe, tags={TAG_RUN: "*"})
            assert (failed.value.code, failed.value.throttled, failed.value.retryable) == (
                code,
                throttled,
                retryable,
            )
            assert fake.calls["DescribeInstances"] == (0 if code == "ConnectionError" else 1)
            assert_no_secret(str(failed.value))

    run(main(), timeout=30)
