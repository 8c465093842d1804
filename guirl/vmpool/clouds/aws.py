"""AWS EC2 desktops: the `CloudAPI` adapter over boto3 (the lifecycle is `guirl/vmpool/cloud.py`'s).

Credentials come from boto3's own chain only (environment, profile, instance role) and stay inside the
SDK: they are never logged, and any error text is scrubbed of them before it becomes a `CloudError`.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import re
import time
import uuid
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from guirl.vmpool.cloud import CloudError, Instance

log = logging.getLogger(__name__)

THROTTLE_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
"""EC2's (and the AWS SDKs') codes for "slow down"."""
TRANSIENT_CODES = frozenset({"InternalError", "InternalFailure", "Unavailable", "ServiceUnavailable"})
"""Codes of a call that failed in passing (the same call may succeed later)."""
GONE_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})
"""A terminate of these ids has nothing to do."""
STATES = {
    "pending": "pending",
    "running": "running",
    "shutting-down": "terminating",
    "terminated": "terminated",
    "stopping": "stopping",
    "stopped": "stopped",
}
_ACCESS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|ANVA|AIPA)[A-Z0-9]{12,}\b")
_TERMINATE_BATCH = 500  # well under EC2's per-call limit on instance ids


class AWSCloud:
    """EC2 through boto3 for `CloudProvider` (see `CloudAPI`): instances in a private subnet, tagged at
    launch, reset by replacing the root volume from `aws.root_snapshot_id` (or the AMI).

    `client`: an EC2 client to use instead of building one (its credentials are then not known here, so
    error text is scrubbed of access-key-shaped strings only). `replace_timeout_s` bounds one root-volume
    replacement; `replace_poll_s` is the first interval between polls of its task (then backing off)."""

    name = "aws"

    def __init__(
        self,
        aws: Any,
        region: str,
        *,
        client: Any = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        max_attempts: int = 3,
        replace_timeout_s: float = 900.0,
        replace_poll_s: float = 2.0,
    ) -> None:
        missing = [k for k in ("image_id", "subnet_id", "security_group_id") if not getattr(aws, k)]
        if missing:
            raise ValueError(f"cloud.aws.{', cloud.aws.'.join(missing)} must be set for the aws provider")
        self.cfg = aws
        self.region = region
        self.replace_timeout_s, self.replace_poll_s = replace_timeout_s, replace_poll_s
        self._session: Any = None
        if client is None:
            # the SDK's own retries (standard mode) take the first throttles; CloudProvider retries the rest
            self._session = boto3.session.Session(region_name=region)
            client = self._session.client(
                "ec2",
                region_name=region,
                endpoint_url=aws.endpoint_url or None,
                config=botocore.config.Config(
                    retries={"mode": "standard", "max_attempts": max_attempts},
                    connect_timeout=connect_timeout_s,
                    read_timeout=read_timeout_s,
                ),
            )
        self.client = client

    def __repr__(self) -> str:
        return f"AWSCloud(region={self.region!r}, endpoint={self.cfg.endpoint_url or 'aws'!r})"

    # -- CloudAPI ---------------------------------------------------------------------------------------

    def launch(self, *, token: str, tags: dict[str, str], user_data: str) -> str:
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        reply = self._api(
            "run_instances",
            ImageId=self.cfg.image_id,
            InstanceType=self.cfg.instance_type,
            MinCount=1,
            MaxCount=1,
            ClientToken=token,  # EC2 answers a repeated token with the first call's instance
            UserData=user_data,
            InstanceInitiatedShutdownBehavior="terminate",  # the user data's TTL shutdown ends it
            NetworkInterfaces=[
                {
                    "DeviceIndex": 0,
                    "SubnetId": self.cfg.subnet_id,
                    "Groups": [self.cfg.security_group_id],
                    "AssociatePublicIpAddress": False,
                }
            ],
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": tag_list},
                {"ResourceType": "volume", "Tags": tag_list},
            ],
        )
        return reply["Instances"][0]["InstanceId"]

    def describe(self, *, ids: list[str] | None = None, tags: dict[str, str] | None = None) -> list[Instance]:
        filters = []
        if ids is not None:
            if not ids:
                return []
            # a filter, not InstanceIds: unknown (or not yet visible) ids are absent instead of an error
            filters.append({"Name": "instance-id", "Values": list(ids)})
        for key, value in (tags or {}).items():
            if value == "*":
                filters.append({"Name": "tag-key", "Values": [key]})
            else:
                filters.append({"Name": f"tag:{key}", "Values": [value]})
        found = []
        for page in self._pages("describe_instances", Filters=filters):
            for reservation in page.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    found.append(
                        Instance(
                            id=inst["InstanceId"],
                            state=STATES.get(inst.get("State", {}).get("Name", ""), "error"),
                            private_ip=inst.get("PrivateIpAddress", "") or "",
                            tags={t["Key"]: t.get("Value", "") for t in inst.get("Tags", [])},
                        )
                    )
        return found

    def terminate(self, ids: list[str]) -> None:
        for start in range(0, len(ids), _TERMINATE_BATCH):
            batch = ids[start : start + _TERMINATE_BATCH]
            try:
                self._api("terminate_instances", InstanceIds=batch)
            except CloudError as exc:
                if exc.code not in GONE_CODES:
                    raise
                # EC2 refuses the whole call for one unknown id: the others one at a time
                for one in batch if len(batch) > 1 else []:
                    try:
                        self._api("terminate_instances", InstanceIds=[one])
                    except CloudError as inner:
                        if inner.code not in GONE_CODES:
                            raise

    def replace_root(self, instance_id: str) -> None:
        """Replace the root volume and wait (polling with backoff) until the task has succeeded."""
        deadline = time.monotonic() + self.replace_timeout_s
        source = (
            {"SnapshotId": self.cfg.root_snapshot_id}
            if self.cfg.root_snapshot_id
            else {"ImageId": self.cfg.image_id}
        )
        token = f"guirl-{uuid.uuid4().hex}"  # a retried create returns the same task, never a second one
        delay = self.replace_poll_s
        while True:
            try:
                reply = self._api(
                    "create_replace_root_volume_task",
                    InstanceId=instance_id,
                    DeleteReplacedRootVolume=True,
                    ClientToken=token,
                    **source,
                )
                break
            except CloudError as exc:
                if not exc.retryable or time.monotonic() + delay > deadline:
                    raise
            time.sleep(random.uniform(0, delay))  # throttled: jittered backoff (this runs on a thread)
            delay = min(delay * 2, 20.0)
        task_id = reply["ReplaceRootVolumeTask"]["ReplaceRootVolumeTaskId"]
        state = reply["ReplaceRootVolumeTask"].get("TaskState", "pending")
        delay = self.replace_poll_s
        while state != "succeeded":
            if state.startswith("fail"):  # failing, failed, failing-detached, failed-detached
                raise CloudError(
                    f"EC2 root volume replacement {task_id} of {instance_id} is {state}",
                    code=f"ReplaceRootVolumeTask.{state}",
                )
            if time.monotonic() > deadline:
                raise CloudError(
                    f"EC2 root volume replacement {task_id} of {instance_id} still {state} after "
                    f"{self.replace_timeout_s:g} s",
                    code="ReplaceRootVolumeTask.timeout",
                )
            time.sleep(delay * random.uniform(0.5, 1.0))  # the task's progress poll (runs on a thread)
            delay = min(delay * 1.5, 15.0)
            try:
                tasks = self._api(
                    "describe_replace_root_volume_tasks", ReplaceRootVolumeTaskIds=[task_id]
                ).get("ReplaceRootVolumeTasks", [])
            except CloudError as exc:
                if not exc.retryable:
                    raise
                continue  # a throttled poll: poll again later
            if tasks:  # not yet visible: still pending
                state = tasks[0].get("TaskState", "pending")

    def check_network(self, cidr: str, port: int) -> None:
        """Refuse a security group that lets anything outside `cidr` reach `port` (or that names a prefix
        list, whose ranges cannot be checked); add a rule for `cidr` when no rule admits the whole of it."""
        group = self.cfg.security_group_id
        net = ipaddress.ip_network(cidr, strict=False)
        groups = self._api("describe_security_groups", GroupIds=[group]).get("SecurityGroups", [])
        if not groups:
            raise CloudError(f"EC2 security group {group} does not exist", code="InvalidGroup.NotFound")
        admitted = False
        for rule in groups[0].get("IpPermissions", []):
            if not _covers(rule, port):
                continue
            what = _rule_text(rule)
            ranges = [r["CidrIp"] for r in rule.get("IpRanges", [])]
            ranges += [r["CidrIpv6"] for r in rule.get("Ipv6Ranges", [])]
            for text in ranges:
                inside = _inside(text, net)
                if not inside:
                    raise CloudError(
                        f"EC2 security group {group} opens port {port} ({what}) to {text}, outside "
                        f"cloud.cluster_cidr {cidr}: the VM server runs any command it is sent; narrow the "
                        f"rule to {cidr}",
                        code="guirl.OpenSecurityGroup",
                    )
                admitted = admitted or ipaddress.ip_network(text, strict=False) == net
            if rule.get("PrefixListIds"):
                names = ", ".join(p.get("PrefixListId", "?") for p in rule["PrefixListIds"])
                raise CloudError(
                    f"EC2 security group {group} opens port {port} ({what}) to prefix list(s) {names}, "
                    f"whose ranges cannot be checked against cloud.cluster_cidr {cidr}: use a CIDR rule",
                    code="guirl.OpenSecurityGroup",
                )
        if admitted:
            return
        log.info("adding an ingress rule to %s: tcp %d from %s", group, port, cidr)
        permission = {"IpProtocol": "tcp", "FromPort": port, "ToPort": port}
        if net.version == 4:
            permission["IpRanges"] = [{"CidrIp": str(net), "Description": "guirl VM server"}]
        else:
            permission["Ipv6Ranges"] = [{"CidrIpv6": str(net), "Description": "guirl VM server"}]
        try:
            self._api("authorize_security_group_ingress", GroupId=group, IpPermissions=[permission])
        except CloudError as exc:
            if exc.code != "InvalidPermission.Duplicate":  # another process added it meanwhile
                raise

    # -- calls ------------------------------------------------------------------------------------------

    def _api(self, operation: str, **params: Any) -> Any:
        """One SDK call, its failure as a `CloudError` (throttled / retryable as EC2's code says)."""
        return self._guard(operation, lambda: getattr(self.client, operation)(**params))

    def _pages(self, operation: str, **params: Any) -> list[Any]:
        """Every page of a paginated SDK call."""
        return self._guard(operation, lambda: list(self.client.get_paginator(operation).paginate(**params)))

    def _guard(self, operation: str, call: Any) -> Any:
        try:
            return call()
        except botocore.exceptions.ClientError as exc:
            raise self._error(operation, exc) from None
        except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as exc:
            raise CloudError(
                f"EC2 {operation}: {self._scrub(str(exc))}", code=type(exc).__name__, retryable=True
            ) from None
        except botocore.exceptions.BotoCoreError as exc:  # no credentials, bad parameters: not transient
            raise CloudError(f"EC2 {operation}: {self._scrub(str(exc))}", code=type(exc).__name__) from None

    def _error(self, operation: str, exc: botocore.exceptions.ClientError) -> CloudError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "") or "")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = self._scrub(str(error.get("Message", "") or ""))
        return CloudError(
            f"EC2 {operation}: {code or status}: {message}",
            code=self._scrub(code),
            throttled=code in THROTTLE_CODES,
            retryable=code in TRANSIENT_CODES or status >= 500,
        )

    def _scrub(self, text: str) -> str:
        """`text` without this client's credentials or anything shaped like an access key id."""
        secrets: list[str] = []
        if self._session is not None:
            try:
                creds = self._session.get_credentials()
                frozen = creds.get_frozen_credentials() if creds is not None else None
            except Exception:  # noqa: BLE001 - scrubbing must never raise; the regex still applies
                frozen = None
            if frozen is not None:
                # a placeholder as short as a test's "x" is no secret, and replacing it would garble text
                secrets = [
                    s for s in (frozen.access_key, frozen.secret_key, frozen.token) if s and len(s) >= 8
                ]
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return _ACCESS_KEY_ID.sub("***", text)


def _covers(rule: dict[str, Any], port: int) -> bool:
    """Whether an ingress rule admits TCP traffic to `port`."""
    protocol = str(rule.get("IpProtocol", ""))
    if protocol == "-1":  # all traffic
        return True
    if protocol not in ("tcp", "6"):
        return False
    low, high = rule.get("FromPort", -1), rule.get("ToPort", -1)
    return low == -1 or low <= port <= high


def _rule_text(rule: dict[str, Any]) -> str:
    if str(rule.get("IpProtocol")) == "-1":
        return "all traffic"
    return f"tcp {rule.get('FromPort')}-{rule.get('ToPort')}"


def _inside(text: str, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    try:
        rng = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return rng.version == net.version and rng.subnet_of(net)  # type: ignore[arg-type]
