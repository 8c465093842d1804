"""The Aliyun provider (`AliyunCloud` under `CloudProvider` and `VMPool`) against `FakeAliyunECS`: the real
SDK, real HTTP on loopback, real signatures. No VM servers stand behind the fake's addresses: readiness
is a `health=` callable, and the pools' health monitors are set not to run."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import signal
import sys
import textwrap
import time
import traceback
from pathlib import Path

import pytest

from guirl.config.schema import AliyunConfig, CloudConfig
from guirl.testing.fakes import FakeAliyunECS
from guirl.testing.fakes.aliyun import acs3_signature
from guirl.vmpool.cloud import TAG_POOL, TAG_RUN, CloudError, CloudProvider, reap, run_alive
from guirl.vmpool.clouds.aliyun import AliyunCloud
from guirl.vmpool.pool import VMPool
from tests.helpers import run

ROOT = Path(__file__).resolve().parents[2]
REGION = "cn-hangzhou"
KEY_ID = "LTAI5tGuirlKeyId7Q2x"
SECRET = "GuirlSecret-never-leak-8d41c"
PROXIES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """The SDK sends even loopback calls through HTTP(S)_PROXY, whatever NO_PROXY says (doc §6)."""
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)


def fake_ecs(**kwargs) -> FakeAliyunECS:
    return FakeAliyunECS(access_keys={KEY_ID: SECRET}, **kwargs)


def cloud_config(fake: FakeAliyunECS, *, secret: str = SECRET, **overrides) -> CloudConfig:
    aliyun = AliyunConfig(
        access_key_id=KEY_ID,
        access_key_secret=secret,
        image_id=fake.IMAGE,
        vswitch_id=fake.VSWITCH,
        security_group_id=fake.SECURITY_GROUP,
        endpoint=fake.endpoint,
        protocol="http",
    )
    settings = dict(
        cluster_cidr="10.0.0.0/16",
        ttl_s=3600.0,
        launch_rate_per_s=200.0,
        launch_burst=16,
        launch_concurrency=16,
        ready_timeout_s=30.0,
        api_attempts=20,
    )
    return CloudConfig(aliyun=aliyun, **{**settings, **overrides})


def aliyun(cfg: CloudConfig) -> AliyunCloud:
    return AliyunCloud(cfg.aliyun, REGION, poll_s=(0.05, 0.4), wait_timeout_s=30.0)


async def answering(address: str, timeout_s: float) -> bool:
    return True  # the VM server of every instance answers


def pool_of(provider: CloudProvider, n: int) -> VMPool:
    return VMPool(provider, max_envs=n, prewarm=n, prewarm_concurrency=n, health_interval_s=3600.0)


def test_signature_follows_the_documented_worked_example():
    """The fake's verifier reproduces doc §2.2's signature exactly."""
    headers = {
        "host": "127.0.0.1:8765",
        "x-acs-version": "2014-05-26",
        "x-acs-action": "DescribeInstances",
        "user-agent": "AlibabaCloud (Linux; x86_64) Python/3.11.7 Core/0.4.3 TeaDSL/2",
        "x-acs-date": "2025-01-02T03:04:05Z",
        "x-acs-signature-nonce": "0123456789abcdef0123456789abcdef",
        "accept": "application/json",
        "x-acs-credentials-provider": "static_ak",
        "x-acs-content-sha256": hashlib.sha256(b"").hexdigest(),
    }
    query = (
        "InstanceIds=%5B%22i-abc%22%2C+%22i-def%22%5D&PageSize=100&RegionId=cn-hangzhou"
        "&Tag.1.Key=guirl&Tag.1.Value=true"
    )
    signature, to_sign = acs3_signature("POST", "/", query, headers, b"", "ExampleSecret123", list(headers))
    assert to_sign == "ACS3-HMAC-SHA256\nc531a17317250fd406feec1e18084cdc133cd6caed22256a2cfff3296de0accc"
    assert signature == "0c3a116da15942a7c3a21d090c6dc7b3b4899c08fc1ba45f08810702e2f8156f"


def test_pool_prewarms_leases_resets_and_closes():
    async def main():
        async with fake_ecs() as fake:
            fake.page_cap = 5  # listing 16 instances takes 4 pages
            reimaged: list[str] = []
            fake.on_replace_root = reimaged.append
            cfg = cloud_config(fake)
            provider = CloudProvider(aliyun(cfg), run="run-a", cloud=cfg, health=answering)
            async with pool_of(provider, 16) as pool:
                live = fake.live()
                assert len(live) == 16 and all(i.status == "Running" for i in live)
                assert sorted(await provider.list("guirl")) == sorted(i.id for i in live)
                assert {(i.tags[TAG_RUN], i.tags[TAG_POOL]) for i in live} == {("run-a", "guirl")}
                launches = [p for action, p in fake.requests if action == "RunInstances"]
                assert len(launches) == 16 and len({p["ClientToken"] for p in launches}) == 16
                assert all(p["InternetMaxBandwidthOut"] == "0" and p["Amount"] == "1" for p in launches)
                assert b"shutdown -P +60" in base64.b64decode(launches[0]["UserData"])
                assert all(i.auto_release is not None and not i.public_ip for i in live)
                ttl_ends = [(i.auto_release, int(i.tags["guirl:created"]) + 3600) for i in live]
                assert all(0 <= at - end < 60 for at, end in ttl_ends)  # at the TTL, to the minute
                rules = fake.security_groups[fake.SECURITY_GROUP]
                assert [(r["SourceCidrIp"], r["PortRange"]) for r in rules] == [("10.0.0.0/16", "5000/5000")]

                lease = await pool.acquire()
                before = next(i for i in fake.live() if i.id == lease.vm_id)
                assert lease.address == f"http://{before.private_ip}:5000"
                # the reset re-images the system disk, keeping the instance and its address
                await pool.release(lease.lease_id)
                assert reimaged == [lease.vm_id]
                again = fake.instances[lease.vm_id]
                assert again.status == "Running" and again.private_ip == before.private_ip
                assert provider.counters["reset.replace_root"] == 1 and len(fake.live()) == 16
            assert fake.live() == []

            cfg = cloud_config(fake, reset="relaunch")
            provider = CloudProvider(aliyun(cfg), run="run-b", cloud=cfg, health=answering)
            async with pool_of(provider, 1) as pool:
                lease = await pool.acquire()
                old = lease.vm_id
                await pool.release(lease.lease_id)  # reset: a new instance under the same VM id
                assert fake.instances[old].status == "Deleted"
                assert [i.id for i in fake.live()] == [provider.vms[old].instance] != [old]
                assert provider.counters["reset.relaunch"] == 1 and reimaged == [reimaged[0]]
            assert fake.live() == []

    run(main(), timeout=60)


def test_client_token_and_auto_release_time():
    async def main():
        async with fake_ecs() as fake:
            api = aliyun(cloud_config(fake))
            now = int(time.time())
            tags = {TAG_RUN: "r", TAG_POOL: "p", "guirl:created": str(now), "guirl:ttl": "7200"}
            first = await asyncio.to_thread(api.launch, token="tok-1", tags=tags, user_data="#!/bin/sh\n")
            again = await asyncio.to_thread(api.launch, token="tok-1", tags=tags, user_data="#!/bin/sh\n")
            assert again == first and len(fake.live()) == 1  # a retried launch returns the same instance
            with pytest.raises(CloudError) as mismatch:
                await asyncio.to_thread(api.launch, token="tok-1", tags={**tags, TAG_POOL: "q"}, user_data="")
            assert mismatch.value.code == "IdempotentParameterMismatch" and not mismatch.value.retryable
            short = {**tags, "guirl:ttl": "1800"}  # under Aliyun's 30-minute minimum once the launch is late
            brief = await asyncio.to_thread(api.launch, token="tok-2", tags=short, user_data="")
            assert fake.instances[first].auto_release and fake.instances[brief].auto_release is None
            fake.advance(7200 + 60)  # the backstop: Aliyun releases the instance at its TTL
            assert [i.id for i in fake.live()] == [brief]
            assert await asyncio.to_thread(api.describe, ids=[first, brief]) != []
            await asyncio.to_thread(api.terminate, [first, brief])  # one of them gone already: fine
            assert fake.live() == [] and await asyncio.to_thread(api.describe, ids=[first, brief]) == []

    run(main(), timeout=30)


POOL = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from guirl.config.schema import AliyunConfig, CloudConfig
    from guirl.vmpool.cloud import CloudProvider, write_heartbeat
    from guirl.vmpool.clouds.aliyun import AliyunCloud
    from guirl.vmpool.pool import VMPool

    async def answering(address, timeout_s):
        return True

    async def main():
        endpoint, key_id, secret, run, runs = sys.argv[1:6]
        aliyun = AliyunConfig(access_key_id=key_id, access_key_secret=secret, image_id="m-guirl-desktop",
                              vswitch_id="vsw-guirl", security_group_id="sg-guirl", endpoint=endpoint,
                              protocol="http")
        cfg = CloudConfig(cluster_cidr="10.0.0.0/16", ttl_s=3600, launch_rate_per_s=200, launch_burst=8,
                          aliyun=aliyun)
        write_heartbeat(Path(runs) / run, run, 1.0)
        provider = CloudProvider(AliyunCloud(aliyun, "cn-hangzhou"), run=run, cloud=cfg, health=answering)
        pool = VMPool(provider, max_envs=4, prewarm=4, health_interval_s=3600)
        await pool.start()
        print(json.dumps(pool.metrics()), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def test_the_reaper_terminates_a_killed_pools_instances(tmp_path):
    async def main():
        async with fake_ecs() as fake:
            runs = tmp_path / "runs"
            (runs / "killed").mkdir(parents=True)
            script = tmp_path / "pool.py"
            script.write_text(POOL)
            env = {k: v for k, v in os.environ.items() if k not in PROXIES}
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(script),
                fake.endpoint,
                KEY_ID,
                SECRET,
                "killed",
                str(runs),
                stdout=asyncio.subprocess.PIPE,
                env={**env, "PYTHONPATH": str(ROOT)},
            )
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 30)
                assert json.loads(line)["idle"] == 4
                proc.send_signal(signal.SIGKILL)
                await asyncio.wait_for(proc.wait(), 10)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert len(fake.live(**{TAG_RUN: "killed"})) == 4  # nothing cleaned up after a SIGKILL

            cfg = cloud_config(fake)
            api = aliyun(cfg)
            keeper = CloudProvider(api, run="alive", cloud=cfg, health=answering)
            kept = await keeper.create("guirl")  # a live run's instance is left alone
            expired_tags = {
                TAG_RUN: "forgotten",
                TAG_POOL: "guirl",
                "guirl:created": "1000",
                "guirl:ttl": "600",
            }
            expired = await asyncio.to_thread(api.launch, token="t-old", tags=expired_tags, user_data="")

            def alive(run_name: str) -> bool | None:  # as the reaper sees it a minute later: silent → dead
                return run_alive(runs, run_name, now=time.time() + 60) if run_name != "alive" else True

            doomed = await reap(api, alive=alive)
            assert sorted(i.tags[TAG_RUN] for i in doomed) == ["forgotten"] + ["killed"] * 4
            assert [i.id for i in fake.live()] == [kept] and fake.instances[expired].status == "Deleted"
            await keeper.delete(kept)

    run(main(), timeout=60)


def test_throttling_before_and_after_acting_makes_no_duplicates():
    async def main():
        async with fake_ecs(seed=7) as fake:
            fake.throttle_rate = fake.throttle_after_rate = 0.3  # about half the calls throttled
            fake.throttle_max_in_row = (
                3  # the provider's backoff doubles to 20 s: keep the test's time bounded
            )
            reimaged: list[str] = []
            fake.on_replace_root = reimaged.append
            cfg = cloud_config(fake)
            provider = CloudProvider(aliyun(cfg), run="run-t", cloud=cfg, health=answering)
            async with pool_of(provider, 8) as pool:
                ids = {i.id for i in fake.live()}
                assert len(ids) == 8 and ids == set(provider.vms)
                assert fake.errors["Throttling.User"] >= 10 and provider.counters["throttled"] >= 5
                assert fake.calls["RunInstances"] > 8  # retried, with the same token: no duplicates
                lease = await pool.acquire()
                await pool.release(lease.lease_id)
                assert reimaged == [lease.vm_id]  # once, though its steps were retried
                assert pool.metrics()["resets"] == 1 and pool.metrics()["replaced"] == 0
            assert fake.live() == []

    run(main(), timeout=60)


def test_a_wrong_secret_or_key_or_clock_is_refused_clearly_not_retried():
    async def main():
        async with fake_ecs() as fake:
            cfg = cloud_config(fake, secret="not-the-secret")
            provider = CloudProvider(aliyun(cfg), run="run-w", cloud=cfg, health=answering)
            with pytest.raises(CloudError) as refused:
                async with pool_of(provider, 2):
                    pass
            assert refused.value.code == "SignatureDoesNotMatch" and not refused.value.retryable
            assert "SignatureDoesNotMatch (HTTP 400)" in str(refused.value)
            refusals = fake.errors["SignatureDoesNotMatch"]  # the pool's reap or its creates: each once
            assert sum(fake.calls.values()) == refusals <= 2 and fake.calls["RunInstances"] == 0

            unknown = AliyunConfig(**{**_fields(cfg.aliyun), "access_key_id": "LTAI5tSomeoneElse"})
            with pytest.raises(CloudError, match=r"InvalidAccessKeyId.NotFound \(HTTP 404\)"):
                await asyncio.to_thread(AliyunCloud(unknown, REGION).describe, ids=["i-x"])
            fake.date_skew_s = 3600.0
            with pytest.raises(CloudError, match=r"InvalidTimeStamp.Expired \(HTTP 400\)"):
                await asyncio.to_thread(aliyun(cloud_config(fake)).describe, ids=["i-x"])
            assert fake.live() == []

    run(main(), timeout=30)


def _fields(struct) -> dict:
    return {f: getattr(struct, f) for f in struct.__struct_fields__}


@pytest.mark.parametrize(
    ("source", "ports", "protocol"),
    [("0.0.0.0/0", "5000/5000", "TCP"), ("10.0.0.0/8", "1/65535", "TCP"), ("0.0.0.0/0", "-1/-1", "ALL")],
)
def test_a_security_group_open_wider_than_the_cluster_fails_create(source, ports, protocol):
    async def main():
        async with fake_ecs() as fake:
            fake.add_permission(fake.SECURITY_GROUP, "10.0.0.0/16", "5000/5000")
            fake.add_permission(fake.SECURITY_GROUP, source, ports, protocol=protocol)
            cfg = cloud_config(fake)
            provider = CloudProvider(aliyun(cfg), run="run-n", cloud=cfg, health=answering)
            with pytest.raises(CloudError) as refused:
                await provider.create("guirl")
            assert refused.value.code == "InsecureSecurityGroup" and not refused.value.retryable
            assert f"port 5000 to {source}, wider than cloud.cluster_cidr 10.0.0.0/16" in str(refused.value)
            assert fake.calls["RunInstances"] == 0 and fake.calls["AuthorizeSecurityGroup"] == 0

    run(main(), timeout=30)


def test_secrets_never_reach_logs_or_errors(caplog):
    caplog.set_level(logging.DEBUG)

    async def main():
        errors: list[BaseException] = []
        async with fake_ecs() as fake:
            cfg = cloud_config(fake)
            fake.unavailable_rate = fake.throttle_rate = 0.3
            fake.throttle_max_in_row = 3
            provider = CloudProvider(aliyun(cfg), run="run-s", cloud=cfg, health=answering)
            vm = await provider.create("guirl")
            fake.unavailable_rate = fake.throttle_rate = 0.0
            await provider.reset(vm)
            await provider.delete(vm)
            for bad in (cloud_config(fake, secret="wrong"), cloud_config(fake, secret=SECRET[::-1])):
                try:
                    await asyncio.to_thread(aliyun(bad).check_network, "10.0.0.0/16", 5000)
                except CloudError as exc:
                    errors.append(exc)
            port = fake.port
        gone = AliyunConfig(**{**_fields(cfg.aliyun), "endpoint": f"127.0.0.1:{port}"})
        try:  # nobody listens there any more
            await asyncio.to_thread(AliyunCloud(gone, REGION, connect_timeout_s=1).describe, ids=["i-x"])
        except CloudError as exc:
            assert exc.retryable and exc.code == "NetworkError"
            errors.append(exc)
        return errors, fake

    errors, fake = run(main(), timeout=60)
    assert len(errors) == 3 and fake.errors["ServiceUnavailable"] + fake.errors["Throttling.User"] > 0
    texts = [caplog.text] + ["".join(traceback.format_exception(e)) + repr(e) for e in errors]
    for text in texts:
        assert KEY_ID not in text and SECRET not in text
    assert repr(aliyun(cloud_config(fake))).count(KEY_ID) == 0
