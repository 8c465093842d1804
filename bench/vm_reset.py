"""Cloud VM lifecycle figures, through guirl's AWS provider (real boto3 over HTTP):

1. reset latency by method, side by side on the same pool: the root volume replaced from the image
   (`replace_root`: the instance and its address stay) vs terminate-and-relaunch (`relaunch`), with the
   cloud calls each method makes;
2. launch throughput under the rate limit: a pool pre-warming N VMs with `launch_rate_per_s` R against the
   same pre-warm unlimited, as instances per second and the ratio to R.

By default against the AWS stand-in on loopback (`FakeAWSFront`: moto's EC2 plus root-volume replacement
tasks), where an instance boots in `--boot-s` and a replacement takes `--replace-s` (both modelled: moto's
instances run at once), so the figures show guirl's own overhead and the methods' call counts, not a
cloud's. On a real account (`--config FILE`, a guirl config with `env.provider = "aws"`, `[cloud]` and
`[cloud.aws]`, credentials from boto3's chain) the same script measures the cloud itself: it launches
real instances (billed) and terminates them at the end. One line of JSON last.

    python bench/vm_reset.py [--vms 8] [--resets 4] [--rate 4] [--boot-s 0.5] [--replace-s 1.0]
    python bench/vm_reset.py --config my-aws.toml --vms 2 --resets 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from guirl.config.schema import AWSConfig, CloudConfig  # noqa: E402
from guirl.vmpool.cloud import CloudProvider  # noqa: E402
from guirl.vmpool.clouds.aws import AWSCloud  # noqa: E402
from guirl.vmpool.pool import VMPool  # noqa: E402

REGION = "us-east-1"
CLUSTER = "10.0.0.0/16"


def standin_world(endpoint: str) -> AWSConfig:
    """A VPC, a private subnet, a security group open to the cluster only, and one of moto's AMIs."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    vpc = ec2.create_vpc(CidrBlock=CLUSTER)["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="guirl-bench", Description="guirl", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(
        GroupId=group,
        IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 5000, "ToPort": 5000, "IpRanges": [{"CidrIp": CLUSTER}]}
        ],
    )
    images = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}])
    return AWSConfig(
        image_id=images["Images"][0]["ImageId"],
        subnet_id=subnet,
        security_group_id=group,
        endpoint_url=endpoint,
    )


class Booting:
    """The stand-in's model of boot time: an instance's VM server answers `boot_s` after the instance was
    first seen running, or after its root volume was replaced (it reboots); addresses are `stand-in://ID`."""

    def __init__(self, boot_s: float) -> None:
        self.boot_s, self.since = boot_s, {}

    def rebooted(self, instance_id: str) -> None:  # FakeAWSFront's on_replace_root hook
        self.since[instance_id] = time.monotonic()

    @staticmethod
    def address_for(inst) -> str:
        return f"stand-in://{inst.id}"

    async def __call__(self, address: str, timeout_s: float) -> bool:
        seen = self.since.setdefault(address.removeprefix("stand-in://"), time.monotonic())
        return time.monotonic() - seen >= self.boot_s


async def reset_round(api, cloud: CloudConfig, method: str, vms: int, resets: int, health) -> dict:
    cfg = CloudConfig(**{**_fields(cloud), "reset": method})
    provider = CloudProvider(
        api, run=f"bench-{method}-{os.getpid()}", cloud=cfg, health=health, address_for=_address_for(health)
    )
    calls_before = _calls(api)
    async with VMPool(provider, tag=f"bench-{method}", max_envs=vms, prewarm=vms) as pool:
        times = []
        for _ in range(resets):
            leases = [await pool.acquire() for _ in range(vms)]
            started = time.monotonic()
            await asyncio.gather(*(pool.release(lease.lease_id) for lease in leases))
            times.append(time.monotonic() - started)
        m = provider.metrics()
    per_reset = provider.reset_s[method]
    return {
        "method": method,
        "resets": len(per_reset),
        "reset_p50_s": round(statistics.median(per_reset), 3) if per_reset else None,
        "reset_max_s": round(max(per_reset), 3) if per_reset else None,
        "round_of_resets_s": round(statistics.median(times), 3),
        "api_calls": _delta(calls_before, _calls(api)),
        "instance_minutes": m["instance_minutes"],
    }


async def launch_round(api, cloud: CloudConfig, vms: int, rate: float | None, health) -> dict:
    fields = _fields(cloud)
    if rate is None:
        fields.update(launch_rate_per_s=1000.0, launch_burst=vms, launch_concurrency=vms)
    else:
        fields.update(launch_rate_per_s=rate, launch_burst=1, launch_concurrency=vms)
    provider = CloudProvider(
        api,
        run=f"bench-launch-{os.getpid()}",
        cloud=CloudConfig(**fields),
        health=health,
        address_for=_address_for(health),
    )
    started = time.monotonic()
    async with VMPool(provider, tag="bench-launch", max_envs=vms, prewarm=vms):
        elapsed = time.monotonic() - started
    per_s = vms / elapsed
    return {
        "rate_limit_per_s": rate,
        "vms": vms,
        "seconds": round(elapsed, 3),
        "launches_per_s": round(per_s, 3),
        "ratio_to_limit": round(per_s / rate, 3) if rate else None,
    }


def _address_for(health):
    return health.address_for if isinstance(health, Booting) else None


def _fields(cloud: CloudConfig) -> dict:
    import msgspec

    return msgspec.structs.asdict(cloud)


def _calls(api) -> dict:
    return dict(getattr(api, "calls", {}))


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0)}


class CountingAWS(AWSCloud):
    """The adapter, counting its calls by method (the same on a real account and on the stand-in)."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def launch(self, **kw):
        self._count("launch")
        return super().launch(**kw)

    def describe(self, **kw):
        self._count("describe")
        return super().describe(**kw)

    def terminate(self, ids):
        self._count("terminate")
        return super().terminate(ids)

    def replace_root(self, instance_id):
        self._count("replace_root")
        return super().replace_root(instance_id)


async def main_async(args) -> dict:
    if args.config:
        from guirl.config import load_config

        cfg = load_config(args.config)
        cloud, aws, region, where = cfg.cloud, cfg.cloud.aws, cfg.env.region, "aws"
        health = None  # the real VM servers answer
        front = None
    else:
        from guirl.testing.fakes import FakeAWSFront

        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            os.environ.pop(name, None)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
        health = Booting(args.boot_s)
        front = FakeAWSFront(replace_delay_s=args.replace_s, on_replace_root=health.rebooted)
        await front.start()
        aws = await asyncio.to_thread(standin_world, front.endpoint_url)
        region, where = REGION, "stand-in"
        cloud = CloudConfig(
            cluster_cidr=CLUSTER, ready_timeout_s=120.0, ttl_s=3600.0, launch_concurrency=args.vms
        )
    try:
        api = CountingAWS(
            aws, region, replace_timeout_s=cloud.ready_timeout_s, replace_poll_s=0.05 if front else 2.0
        )
        resets = []
        for method in ("replace_root", "relaunch"):
            resets.append(await reset_round(api, cloud, method, args.vms, args.resets, health))
            print(f"reset {method}: {resets[-1]}", file=sys.stderr)
        launches = []
        for rate in (args.rate, None):
            launches.append(await launch_round(api, cloud, args.vms, rate, health))
            print(f"launch at {rate or 'no'} limit: {launches[-1]}", file=sys.stderr)
    finally:
        if front is not None:
            await front.close()
    by = {r["method"]: r for r in resets}
    ratio = (
        round(by["relaunch"]["reset_p50_s"] / by["replace_root"]["reset_p50_s"], 2)
        if by["replace_root"]["reset_p50_s"]
        else None
    )
    return {
        "bench": "vm_reset",
        "cloud": where,
        "vms": args.vms,
        "model": None if args.config else {"boot_s": args.boot_s, "replace_s": args.replace_s},
        "resets": resets,
        "relaunch_over_replace_root": ratio,
        "launch": launches,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="a guirl config for a real AWS account (launches billed instances)")
    ap.add_argument("--vms", type=int, default=8)
    ap.add_argument("--resets", type=int, default=3, help="rounds of resetting every VM, per method")
    ap.add_argument("--rate", type=float, default=4.0, help="launch_rate_per_s of the limited launch round")
    ap.add_argument("--boot-s", type=float, default=0.5, help="stand-in: seconds an instance takes to boot")
    ap.add_argument("--replace-s", type=float, default=1.0, help="stand-in: seconds a root replacement takes")
    args = ap.parse_args()
    result = asyncio.run(main_async(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
