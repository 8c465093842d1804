"""The AWS provider for real: boto3 over HTTP to `FakeAWSFront` (moto's EC2 behind a front that adds client
tokens, root-volume replacement tasks and throttling), driven through `CloudProvider` and `VMPool`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import msgspec
import pytest

from guirl.config.schema import AWSConfig, CloudConfig
from guirl.testing.fakes import FakeAWSFront
from guirl.vmpool.client import VMClient
from guirl.vmpool.cloud import TAG_POOL, TAG_RUN, CloudError, CloudProvider, reap
from guirl.vmpool.clouds.aws import AWSCloud
from guirl.vmpool.local import LocalProvider
from guirl.vmpool.pool import VMPool
from guirl.vmpool.runner import load_solution, play
from guirl.vmpool.tasks.evaluate import evaluate
from guirl.vmpool.tasks.model import load_task
from guirl.vmpool.tasks.setup import TaskContext
from tests.helpers import run

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tasks" / "local"
REGION = "us-east-1"
CLUSTER = "10.0.0.0/16"
GONE = ("shutting-down", "terminated")


@pytest.fixture(autouse=True)
def aws_env(monkeypatch, tmp_path):
    """Dummy credentials, no proxy, and nothing from this machine's AWS configuration."""
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_EC2",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@dataclass
class World:
    """An EC2 account on loopback: a VPC, a private subnet, a security group opening the VM port to the
    cluster only, and an AMI; `ec2` is the test's own client (to look, and to misconfigure)."""

    front: FakeAWSFront
    ec2: Any
    aws: AWSConfig
    vpc_id: str


@contextlib.asynccontextmanager
async def aws_world(**front: Any) -> AsyncIterator[World]:
    async with FakeAWSFront(**front) as fake:
        ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=fake.endpoint_url)

        def setup() -> World:
            vpc = ec2.create_vpc(CidrBlock=CLUSTER)["Vpc"]["VpcId"]
            subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
            group = ec2.create_security_group(GroupName="guirl-vms", Description="guirl", VpcId=vpc)[
                "GroupId"
            ]
            _allow(ec2, group, "tcp", 5000, CLUSTER)
            images = ec2.describe_images(
                Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}]
            )
            image = images["Images"][0]["ImageId"]  # one of moto's stock AMIs
            aws = AWSConfig(
                image_id=image, subnet_id=subnet, security_group_id=group, endpoint_url=fake.endpoint_url
            )
            return World(fake, ec2, aws, vpc)

        yield await asyncio.to_thread(setup)


def _allow(ec2: Any, group: str, protocol: str, port: int, cidr: str) -> None:
    rule: dict[str, Any] = {"IpProtocol": protocol}
    if protocol != "-1":
        rule.update(FromPort=port, ToPort=port)
    key, field = ("Ipv6Ranges", "CidrIpv6") if ":" in cidr else ("IpRanges", "CidrIp")
    rule[key] = [{field: cidr}]
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[rule])


def cloud_cfg(**overrides: Any) -> CloudConfig:
    base = dict(
        cluster_cidr=CLUSTER,
        launch_rate_per_s=200.0,
        launch_burst=16,
        launch_concurrency=16,
        ready_timeout_s=30.0,
        ttl_s=600.0,
    )
    return CloudConfig(**{**base, **overrides})


async def healthy(address: str, timeout_s: float) -> bool:
    """moto's addresses are never connected to: every VM server "answers"."""
    return True


async def instances(ec2: Any, run_name: str) -> dict[str, str]:
    """Instance id -> EC2 state of every instance tagged with `run_name`, as the test's own client sees it."""

    def look() -> dict[str, str]:
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [run_name]}]
        )
        return {
            i["InstanceId"]: i["State"]["Name"]
            for p in pages
            for r in p["Reservations"]
            for i in r["Instances"]
        }

    return await asyncio.to_thread(look)


async def live(ec2: Any, run_name: str) -> list[str]:
    return sorted(i for i, state in (await instances(ec2, run_name)).items() if state not in GONE)


@contextlib.contextmanager
def unthrottled(front: FakeAWSFront):
    """The test's own look goes unthrottled (nothing else calls meanwhile)."""
    rates = front.throttle_rate, front.throttle_after_rate
    front.throttle_rate = front.throttle_after_rate = 0.0
    try:
        yield
    finally:
        front.throttle_rate, front.throttle_after_rate = rates


# -- the lifecycle at scale ------------------------------------------------------------------------------


@pytest.mark.parametrize("reset", ["replace_root", "relaunch"])
def test_prewarm_16_lease_reset_and_close_leave_nothing(reset):
    run_name = f"scale-{reset}-{uuid.uuid4().hex[:6]}"

    async def main():
        async with aws_world(replace_delay_s=0.1) as w:
            api = AWSCloud(w.aws, REGION, replace_poll_s=0.02)
            provider = CloudProvider(api, run=run_name, cloud=cloud_cfg(reset=reset), health=healthy)
            pool = VMPool(
                provider, tag="scale", max_envs=16, prewarm=16, prewarm_concurrency=16, health_interval_s=3600
            )
            async with pool:
                assert pool.metrics()["idle"] == 16
                assert await live(w.ec2, run_name) == sorted(provider.vms)
                # tagged in the launch call itself (instance and root volume), private, ended by a shutdown
                launches = [r for r in w.front.requests if r.get("Action") == "RunInstances"]
                assert len(launches) == 16 and w.front.calls["CreateTags"] == 0
                for params in launches:
                    assert params["NetworkInterface.1.AssociatePublicIpAddress"] == "false"
                    assert params["InstanceInitiatedShutdownBehavior"] == "terminate"
                    assert params["ClientToken"].startswith("guirl-")
                    assert {
                        params["TagSpecification.1.ResourceType"],
                        params["TagSpecification.2.ResourceType"],
                    } == {
                        "instance",
                        "volume",
                    }
                    assert "shutdown -P" in base64.b64decode(params["UserData"]).decode()
                volumes = await asyncio.to_thread(
                    w.ec2.describe_volumes, Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [run_name]}]
                )
                assert len(volumes["Volumes"]) == 16

                a, b = await pool.acquire(), await pool.acquire()
                await asyncio.gather(pool.release(a.lease_id), pool.release(b.lease_id))
                m = pool.metrics()
                assert m["resets"] == 2 and m["idle"] == 16 and m["replaced"] == 0
                states = await instances(w.ec2, run_name)
                if reset == "replace_root":  # the same instances, their root volumes replaced by a task each
                    tasks = {t.instance_id: t for t in w.front.replace_tasks.values()}
                    assert set(tasks) == {a.vm_id, b.vm_id}
                    assert all(t.state == "succeeded" and t.delete_replaced for t in tasks.values())
                    assert all(t.image_id == w.aws.image_id for t in tasks.values())
                    assert len(states) == 16 and provider.vms[a.vm_id].instance == a.vm_id
                else:  # new instances under the same VM ids; the old ones are gone
                    assert w.front.calls["CreateReplaceRootVolumeTask"] == 0
                    for lease in (a, b):
                        fresh = provider.vms[lease.vm_id].instance
                        assert fresh != lease.vm_id and states[fresh] == "running"
                        assert states[lease.vm_id] in GONE
                    assert len(await live(w.ec2, run_name)) == 16
                assert provider.metrics()[f"reset.{reset}"] == 2
                if reset == "replace_root":  # a replacement that fails: the pool replaces the VM instead
                    w.front.replace_result = "failed-detached"
                    c = await pool.acquire()
                    await pool.release(c.lease_id)
                    assert pool.metrics()["replaced"] == 1 and pool.metrics()["idle"] == 16
                    assert provider.failures["replace_root:ReplaceRootVolumeTask.failed-detached"] == 1
                    assert (await instances(w.ec2, run_name))[c.vm_id] in GONE
                    assert len(await live(w.ec2, run_name)) == 16
            assert await live(w.ec2, run_name) == []  # close terminated every instance of the run

    run(main(), timeout=60)


POOL = textwrap.dedent(
    """
    import asyncio, json, sys
    from guirl.config.schema import AWSConfig, CloudConfig
    from guirl.vmpool.cloud import CloudProvider
    from guirl.vmpool.clouds.aws import AWSCloud
    from guirl.vmpool.pool import VMPool

    async def healthy(address, timeout_s):
        return True

    async def main():
        aws = AWSConfig(**json.loads(sys.argv[1]))
        cloud = CloudConfig(cluster_cidr="10.0.0.0/16", ttl_s=600)
        provider = CloudProvider(AWSCloud(aws, "us-east-1"), run=sys.argv[2], cloud=cloud, health=healthy)
        pool = VMPool(provider, tag="killed", max_envs=4, prewarm=4, health_interval_s=3600)
        await pool.start()
        print(json.dumps(pool.metrics()), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def test_instances_of_a_killed_pool_are_reaped():
    killed, other = f"killed-{uuid.uuid4().hex[:6]}", f"alive-{uuid.uuid4().hex[:6]}"

    async def main():
        async with aws_world() as w:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                POOL,
                msgspec.json.encode(w.aws).decode(),
                killed,
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                assert json.loads(line)["idle"] == 4
            finally:
                proc.kill()  # SIGKILL: the pool gets no chance to clean up
                await proc.wait()
            assert len(await live(w.ec2, killed)) == 4  # its instances outlive it
            api = AWSCloud(w.aws, REGION)
            # another run, still alive, in the same account
            survivor = CloudProvider(api, run=other, cloud=cloud_cfg(), health=healthy)
            kept = await survivor.create("killed")
            # past their TTL they are all found (a dry run only lists them)
            expired = await reap(api, run=killed, now=time.time() + 601, dry_run=True)
            assert len(expired) == 4 and len(await live(w.ec2, killed)) == 4
            # the killed run's heartbeat has stopped: every one of its instances goes, the live run's stay
            doomed = await reap(api, alive=lambda r: {killed: False, other: True}.get(r))
            assert sorted(i.id for i in doomed) == sorted(await instances(w.ec2, killed))
            assert {i.tags[TAG_POOL] for i in doomed} == {"killed"}
            assert await live(w.ec2, killed) == []
            assert await live(w.ec2, other) == [kept]
            await survivor.delete(kept)

    run(main(), timeout=90)


# -- throttling -----------------------------------------------------------------------------------------


def test_throttled_half_the_time_prewarm_and_resets_complete_without_duplicates():
    run_name = f"throttled-{uuid.uuid4().hex[:6]}"

    async def main():
        async with aws_world(seed=7, replace_delay_s=0.1) as w:
            # botocore's own retries stay on (one: its standard backoff grows 2^n s and would make this slow);
            # CloudProvider's jittered backoff takes the rest
            api = AWSCloud(w.aws, REGION, max_attempts=1, replace_poll_s=0.02)
            # the cloud launched, the answer was lost (every time): the retried token is the same instance
            w.front.throttle_after_rate = 1.0
            with pytest.raises(CloudError) as lost:
                await asyncio.to_thread(
                    api.launch, token="guirl-lost", tags={TAG_RUN: run_name}, user_data=""
                )
            assert lost.value.throttled and lost.value.retryable and lost.value.code == "RequestLimitExceeded"
            w.front.throttle_after_rate = 0.0
            first = await asyncio.to_thread(
                api.launch, token="guirl-lost", tags={TAG_RUN: run_name}, user_data=""
            )
            assert await live(w.ec2, run_name) == [first] and w.front.replayed >= 1
            await asyncio.to_thread(api.terminate, [first])

            # half of all calls throttled: a quarter before the cloud acts, a quarter after
            w.front.throttle_rate, w.front.throttle_after_rate = 0.25, 1 / 3
            provider = CloudProvider(api, run=run_name, cloud=cloud_cfg(api_attempts=30), health=healthy)
            pool = VMPool(
                provider,
                tag="throttled",
                max_envs=8,
                prewarm=8,
                prewarm_concurrency=8,
                health_interval_s=3600,
            )
            async with pool:
                assert pool.metrics()["idle"] == 8
                with unthrottled(w.front):
                    assert await live(w.ec2, run_name) == sorted(provider.vms)  # exactly 8: no duplicates
                a, b = await pool.acquire(), await pool.acquire()
                await asyncio.gather(pool.release(a.lease_id), pool.release(b.lease_id))
                m = pool.metrics()
                assert m["resets"] == 2 and m["replaced"] == 0
                # one replacement task per reset, however often its creation was retried
                assert sorted(t.instance_id for t in w.front.replace_tasks.values()) == sorted(
                    [a.vm_id, b.vm_id]
                )
                assert {t.state for t in w.front.replace_tasks.values()} == {"succeeded"}
            w.front.throttle_rate = w.front.throttle_after_rate = 0.0
            throttled = sum(w.front.throttled.values())
            assert throttled >= 0.3 * sum(w.front.calls.values()) and w.front.throttled["RunInstances"] > 0
            assert provider.counters["throttled"] > 0
            assert await live(w.ec2, run_name) == []  # closing under throttling still terminated all

    run(main(), timeout=90)


# -- network hygiene -------------------------------------------------------------------------------------


def test_a_security_group_open_beyond_the_cluster_is_refused_and_a_missing_rule_added():
    async def main():
        async with aws_world() as w:

            async def create(group: str, rule: tuple[str, int, str] | None) -> CloudProvider:
                sg = await asyncio.to_thread(
                    w.ec2.create_security_group, GroupName=group, Description="x", VpcId=w.vpc_id
                )
                if rule is not None:
                    await asyncio.to_thread(_allow, w.ec2, sg["GroupId"], *rule)
                aws = msgspec.structs.replace(w.aws, security_group_id=sg["GroupId"])
                return CloudProvider(AWSCloud(aws, REGION), run="net", cloud=cloud_cfg(), health=healthy)

            for name, rule, says in (
                ("world", ("tcp", 5000, "0.0.0.0/0"), r"opens port 5000 \(tcp 5000-5000\) to 0\.0\.0\.0/0"),
                ("all-v6", ("-1", 0, "::/0"), r"opens port 5000 \(all traffic\) to ::/0"),
                ("other-lan", ("tcp", 5000, "192.168.0.0/16"), r"to 192\.168\.0\.0/16, outside"),
            ):
                provider = await create(name, rule)
                with pytest.raises(CloudError, match=says) as refused:
                    await provider.create("net")
                assert provider.api.cfg.security_group_id in str(refused.value)
                assert refused.value.code == "guirl.OpenSecurityGroup" and not refused.value.retryable
            assert w.front.calls["RunInstances"] == 0  # nothing was launched behind an open group

            # a group with no rule for the VM port gets the cluster's, and the launch goes ahead
            provider = await create("empty", None)
            vm = await provider.create("net")
            group = provider.api.cfg.security_group_id
            described = await asyncio.to_thread(w.ec2.describe_security_groups, GroupIds=[group])
            rules = described["SecurityGroups"][0]["IpPermissions"]
            assert [(r["IpProtocol"], r["FromPort"], r["IpRanges"][0]["CidrIp"]) for r in rules] == [
                ("tcp", 5000, CLUSTER)
            ]
            await provider.delete(vm)

            # a public cluster range is refused before any call
            for cidr in ("0.0.0.0/0", "8.8.0.0/16", ""):
                with pytest.raises(ValueError, match="cluster_cidr"):
                    CloudProvider(provider.api, run="net", cloud=cloud_cfg(cluster_cidr=cidr))

    run(main(), timeout=60)


# -- real episodes on desktops behind the AWS lifecycle ----------------------------------------------------


def test_real_episodes_on_local_desktops_reset_by_root_volume_replacement(tmp_path):
    local = LocalProvider(tmp_path / "vms", width=800, height=600)
    run_name = f"episodes-{uuid.uuid4().hex[:6]}"
    task = load_task(SUITE / "examples" / "terminal" / "terminal-echo-hello.json")
    solution = load_solution(SUITE / "solutions" / "terminal-echo-hello.jsonl")

    def ctx(label: str) -> TaskContext:
        (tmp_path / "cache" / label).mkdir(parents=True)
        return TaskContext(
            task_id=task.id,
            cache_dir=tmp_path / "cache" / label,
            download_cache=tmp_path / "downloads",
            width=800,
            height=600,
        )

    async def main():
        desktops = list(await asyncio.gather(local.create("aws"), local.create("aws")))
        desktop_of: dict[str, str] = {}  # instance -> the local desktop standing for it

        def address_for(inst: Any) -> str:
            if inst.id not in desktop_of:
                desktop_of[inst.id] = desktops[len(desktop_of)]
            return local.address(desktop_of[inst.id])

        async def on_replace_root(instance_id: str) -> None:  # the new root volume: a pristine desktop
            await local.reset(desktop_of[instance_id])

        try:
            async with aws_world(on_replace_root=on_replace_root, replace_delay_s=0.1) as w:
                api = AWSCloud(w.aws, REGION, replace_poll_s=0.05)
                provider = CloudProvider(api, run=run_name, cloud=cloud_cfg(), address_for=address_for)
                async with VMPool(
                    provider, tag="episodes", max_envs=2, prewarm=2, health_interval_s=60
                ) as pool:
                    lease = await pool.acquire()
                    async with VMClient(lease.address, timeout_s=60) as client:
                        episode = await play(task, client, solution, ctx("solved"), keep_screenshots=True)
                    assert episode.score == 1.0 and episode.refused == [] and episode.screenshots
                    await pool.release(lease.lease_id)  # the root volume is replaced: the desktop reset
                    (replaced,) = w.front.replace_tasks.values()
                    assert replaced.instance_id == lease.vm_id and replaced.state == "succeeded"
                    assert local.vms[desktop_of[lease.vm_id]].resets == 1

                    a, b = await pool.acquire(), await pool.acquire()
                    again = a if a.vm_id == lease.vm_id else b
                    assert again.vm_id == lease.vm_id and again.address == lease.address
                    async with VMClient(again.address, timeout_s=60) as client:
                        assert await client.get_file("/home/user/hello.txt") is None  # pristine again
                        assert await evaluate(task, client, ctx("after-reset")) == 0.0
                        assert (await client.screenshot())[:8] == b"\x89PNG\r\n\x1a\n"
                assert await live(w.ec2, run_name) == []
        finally:
            for desktop in desktops:
                await local.delete(desktop)

    run(main(), timeout=150)


# -- secrets ---------------------------------------------------------------------------------------------

KEY_ID = "AKIAGUIRLTESTKEY0042"
SECRET = "guirl/Secret+Access/Key0042abcdefghijklmnop"
TOKEN = "guirl-session-token-0042-FwoGZXIvYXdzEJr"


def test_credentials_never_reach_logs_errors_tags_or_user_data(monkeypatch, caplog):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="guirl")
    run_name = f"secrets-{uuid.uuid4().hex[:6]}"
    errors: list[str] = []

    async def main():
        async with aws_world(replace_delay_s=0.05) as w:
            api = AWSCloud(w.aws, REGION, replace_poll_s=0.02)
            provider = CloudProvider(api, run=run_name, cloud=cloud_cfg(reset="replace_root"), health=healthy)
            vm = await provider.create("secrets")
            await provider.reset(vm)
            await reap(api, run=run_name, now=time.time() + 601)  # logs what it reaped
            # an error whose text carries the credentials (as some AWS services echo a key id back)
            w.front.errors["RunInstances"] = (401, "AuthFailure", f"{KEY_ID} / {SECRET} / {TOKEN} refused")
            with pytest.raises(CloudError, match="AuthFailure") as refused:
                await provider.create("secrets")
            errors.append(f"{refused.value} {refused.value!r} {refused.value.code}")
            # an endpoint that does not answer: a retryable error, no secret in it
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                closed = probe.getsockname()[1]
            dead = AWSCloud(
                msgspec.structs.replace(w.aws, endpoint_url=f"http://127.0.0.1:{closed}"),
                REGION,
                max_attempts=1,
            )
            with pytest.raises(CloudError) as unreachable:
                await asyncio.to_thread(dead.describe, ids=["i-0123456789abcdef0"])
            assert unreachable.value.retryable
            errors.append(f"{unreachable.value} {unreachable.value!r} {dead!r} {api!r}")
            # nothing sent to the cloud carries them: tags, user data, any parameter
            for params in w.front.requests:
                sent = " ".join(params.values())
                if "UserData" in params:
                    sent += base64.b64decode(params["UserData"]).decode()
                errors.append(sent)

    run(main(), timeout=60)
    seen = caplog.text + "\n".join(errors)
    assert "reaped 1 aws instance" in caplog.text  # the logs were captured
    for secret in (KEY_ID, SECRET, TOKEN):
        assert secret not in seen
