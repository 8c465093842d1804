"""Alibaba Cloud ECS behind `CloudAPI`, with the official SDK (`alibabacloud_ecs20140526`, current release).

Calls and their names follow `docs/cloud/aliyun-ecs.md`. What this adapter decides:

- **Launch** = RunInstances with `Amount=1`, the provider's ClientToken (a retry of a launch that timed out or
  was throttled after Aliyun acted returns the same instance), the tags in the call itself,
  `InternetMaxBandwidthOut=0` (no public IP), user data base64-encoded, and `AutoReleaseTime` at the tags'
  `guirl:created + guirl:ttl` (rounded up to the minute) as a second backstop besides the shutdown timer.
  Aliyun refuses an AutoReleaseTime under 30 minutes ahead, and a refusal would fail the launch, so it is
  set only for a TTL of at least 35 minutes (and at most 3 years) and while it still lies 31 minutes ahead;
  it is derived from the tags, never from the clock alone, so every retry of one launch sends the same
  parameters (a changed one would be `IdempotentParameterMismatch`).
- **Describe** = DescribeInstances (InstanceIds as a JSON array, at most 100 at a time; tag filters, a tag
  value of "*" sent as a key alone; NextToken paging). Pending and Starting are `pending`; an unknown status
  is taken for `pending` too, so the reaper still takes the instance. The private IP is the VPC one.
- **Terminate** = DeleteInstances with `Force=True`; an id Aliyun does not know is gone already.
- **Replace root** = StopInstance (forced, `KeepCharging`) → ReplaceSystemDisk (ImageId) → StartInstance,
  polling DescribeInstances with bounded backoff for each state the next call needs. A step throttled, failed
  in passing or refused while the instance is still busy is retried within the call (the steps done are
  kept); a step that acted and then failed is recognised by the state it left. If the call still fails and
  the provider retries it, it resumes where it stopped, and one ClientToken per reset makes a repeated
  ReplaceSystemDisk a replay, never a second re-image.
- **Network** = DescribeSecurityGroupAttribute: an accepting ingress rule that opens the VM port (TCP or ALL)
  to a source wider than the cluster's range (0.0.0.0/0 included), or to a prefix list whose addresses cannot
  be checked here, is refused; if no rule opens the port to exactly the cluster's range, one is added with
  AuthorizeSecurityGroup (adding an existing rule creates nothing).
- **Errors**: `Throttling*` codes → `CloudError(throttled=True)`; HTTP 5xx, `ServiceUnavailable`,
  `InternalError`, a transient instance lock (`IncorrectInstanceStatus.Initializing`) and connection
  failures or timeouts → retryable; everything else (auth refusals included) fails at once. The SDK's own
  retries stay off (its default): the provider retries, with backoff.

The access key lives only in the SDK's client: never in a message, a log line or a tag. Error texts are
built from Aliyun's code, message and request id (the SDK's exception is not chained: it holds the signed
request), with the key id masked and URLs' query strings cut.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from alibabacloud_ecs20140526 import models as ecs
from alibabacloud_ecs20140526.client import Client
from alibabacloud_tea_openapi.models import Config

from guirl.config.schema import AliyunConfig
from guirl.vmpool.cloud import TAG_CREATED, TAG_TTL, CloudError, Instance

log = logging.getLogger(__name__)

STATES = {
    "Pending": "pending",
    "Starting": "pending",
    "Running": "running",
    "Stopping": "stopping",
    "Stopped": "stopped",
}
"""Aliyun's instance statuses, normalised (a deleted instance is simply absent)."""
AUTO_RELEASE_MIN_TTL_S = 35 * 60
"""Shortest TTL given an AutoReleaseTime: Aliyun's 30-minute minimum plus room for a delayed launch."""
AUTO_RELEASE_MAX_TTL_S = 3 * 365 * 86400
"""Longest: Aliyun's 3 years."""
NOT_FOUND = "InvalidInstanceId.NotFound"
_RETRYABLE = {
    "ServiceUnavailable",
    "InternalError",
    "UnknownError",
    "IncorrectInstanceStatus.Initializing",
    "LastTokenProcessing",
    "IdempotentProcessing",
}
_BUSY = ("IncorrectInstanceStatus", "IncorrectDiskStatus", "OperationConflict")
"""Codes of an instance still busy with the previous step (a re-image in progress): wait, then again."""
_RESUME_WITHIN_S = 120.0
"""A replace_root of an instance whose last one failed less than this ago is a retry of it (the provider's
backoff sleeps at most 20 s): it resumes; later, it is a new reset and re-images again."""


def auto_release_time(tags: dict[str, str], now: float | None = None) -> str | None:
    """The AutoReleaseTime for an instance tagged `tags` (UTC, `yyyy-MM-ddTHH:mm:ssZ`), or None where Aliyun
    would refuse it (see the module docstring)."""
    try:
        created, ttl = int(tags[TAG_CREATED]), float(tags[TAG_TTL])
    except (KeyError, ValueError):
        return None
    at = math.ceil((created + ttl) / 60) * 60  # Aliyun rounds seconds down: up, so never before the TTL
    ahead = at - (time.time() if now is None else now)
    if not AUTO_RELEASE_MIN_TTL_S <= ttl <= AUTO_RELEASE_MAX_TTL_S or ahead < 31 * 60:
        return None
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Reset:
    """A replace_root under way, resumed by the provider's retries of it."""

    token: str = field(default_factory=lambda: f"guirl-reimage-{uuid.uuid4().hex}")
    replaced: bool = False
    ended: float = float("inf")
    """When its last attempt ended (inf: one is running)."""


class AliyunCloud:
    """`CloudAPI` over Alibaba Cloud ECS in `region` (see the module docstring).

    `poll_s`: first and longest pause between state polls in `replace_root`; `wait_timeout_s`: how long
    `replace_root` waits for the instance to stop, be re-imaged and run again."""

    name = "aliyun"

    def __init__(
        self,
        cfg: AliyunConfig,
        region: str,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 20.0,
        poll_s: tuple[float, float] = (1.0, 10.0),
        wait_timeout_s: float = 600.0,
    ) -> None:
        missing = [
            f"cloud.aliyun.{f}"
            for f in ("access_key_id", "access_key_secret", "image_id", "vswitch_id", "security_group_id")
            if not getattr(cfg, f)
        ] + ([] if region else ["env.region"])
        if missing:
            raise ValueError(f"the aliyun provider needs {', '.join(missing)}")
        self.region = region
        self.image_id, self.instance_type = cfg.image_id, cfg.instance_type
        self.vswitch_id, self.security_group_id = cfg.vswitch_id, cfg.security_group_id
        self.poll_s, self.wait_timeout_s = poll_s, wait_timeout_s
        self._key_id = cfg.access_key_id  # to mask it in messages; the secret is kept by the SDK client only
        self._client = Client(
            Config(
                access_key_id=cfg.access_key_id,
                access_key_secret=cfg.access_key_secret,
                region_id=region,
                endpoint=cfg.endpoint or None,
                protocol=cfg.protocol,
                connect_timeout=int(connect_timeout_s * 1000),
                read_timeout=int(read_timeout_s * 1000),
            )
        )
        # where the SDK sends the calls (its regional map), for messages
        self.endpoint = (
            getattr(self._client, "_endpoint", None) or cfg.endpoint or f"ecs.{region}.aliyuncs.com"
        )
        self._resets: dict[str, _Reset] = {}
        self._network_ok: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AliyunCloud(region={self.region!r}, endpoint={self.endpoint!r})"

    # -- CloudAPI ---------------------------------------------------------------------------------------

    def launch(self, *, token: str, tags: dict[str, str], user_data: str) -> str:
        request = ecs.RunInstancesRequest(
            region_id=self.region,
            image_id=self.image_id,
            instance_type=self.instance_type,
            v_switch_id=self.vswitch_id,
            security_group_id=self.security_group_id,
            client_token=token,
            tag=[ecs.RunInstancesRequestTag(key=k, value=v) for k, v in tags.items()],
            user_data=base64.b64encode(user_data.encode()).decode(),
            internet_max_bandwidth_out=0,
            instance_charge_type="PostPaid",
            amount=1,
            auto_release_time=auto_release_time(tags),
        )
        body = self._sdk("RunInstances", self._client.run_instances, request)
        ids = (body.get("InstanceIdSets") or {}).get("InstanceIdSet") or []
        if len(ids) != 1:
            raise CloudError(
                f"aliyun RunInstances answered {len(ids)} instance ids for one", code="BadAnswer"
            )
        return ids[0]

    def describe(self, *, ids: list[str] | None = None, tags: dict[str, str] | None = None) -> list[Instance]:
        tag = [
            ecs.DescribeInstancesRequestTag(key=k, value=None if v == "*" else v)
            for k, v in (tags or {}).items()
        ] or None
        if ids is None:
            return list(self._describe(tag=tag))
        unique = list(dict.fromkeys(ids))
        return [
            inst
            for i in range(0, len(unique), 100)
            for inst in self._describe(instance_ids=json.dumps(unique[i : i + 100]), tag=tag)
        ]

    def terminate(self, ids: list[str]) -> None:
        unique = list(dict.fromkeys(ids))
        for i in range(0, len(unique), 100):
            chunk = unique[i : i + 100]
            try:
                self._delete(chunk)
            except CloudError as exc:
                if exc.code != NOT_FOUND:
                    raise
                for one in chunk if len(chunk) > 1 else []:  # delete the others; the unknown one is gone
                    try:
                        self._delete([one])
                    except CloudError as again:
                        if again.code != NOT_FOUND:
                            raise
        with self._lock:
            for instance_id in unique:
                self._resets.pop(instance_id, None)

    def replace_root(self, instance_id: str) -> None:
        """Re-image the system disk from the image; returns once the instance runs again. Each step's
        throttling or passing failure is retried here, within `wait_timeout_s`, keeping the steps done."""
        with self._lock:
            job = self._resets.get(instance_id)
            if job is None or time.monotonic() - job.ended > _RESUME_WITHIN_S:  # not a retry: a new reset
                job = self._resets[instance_id] = _Reset()
        try:
            self._replace_root(instance_id, job)
        finally:
            job.ended = time.monotonic()
        with self._lock:
            self._resets.pop(instance_id, None)

    def _replace_root(self, instance_id: str, job: _Reset) -> None:
        deadline = time.monotonic() + self.wait_timeout_s
        if not job.replaced:
            if self._wait(instance_id, ("Running", "Stopped"), deadline) == "Running":
                # KeepCharging: economical mode would release the compute, and the restart could find no stock
                stop = ecs.StopInstanceRequest(
                    instance_id=instance_id, force_stop=True, stopped_mode="KeepCharging"
                )
                self._step(
                    "StopInstance", self._client.stop_instance, stop, deadline, ("Stopping", "Stopped")
                )
                self._wait(instance_id, ("Stopped",), deadline)
            replace = ecs.ReplaceSystemDiskRequest(
                instance_id=instance_id, image_id=self.image_id, client_token=job.token
            )  # a repeat with the same token replays the first answer: one re-image
            self._step("ReplaceSystemDisk", self._client.replace_system_disk, replace, deadline, ())
            job.replaced = True
        if self._wait(instance_id, ("Running", "Stopped"), deadline) == "Stopped":
            start = ecs.StartInstanceRequest(instance_id=instance_id)
            self._step("StartInstance", self._client.start_instance, start, deadline, ("Starting", "Running"))
        self._wait(instance_id, ("Running",), deadline)

    def check_network(self, cidr: str, port: int) -> None:
        """Refuse a rule opening `port` wider than `cidr`; open it to `cidr` if no rule does. A passed check
        is remembered (a pool's concurrent creates each ask: the group is read until one check passes)."""
        net = ipaddress.ip_network(cidr, strict=False)
        if (str(net), port) in self._network_ok:
            return
        covered = False
        for rule in self._ingress_rules():
            if rule.get("Policy", "Accept").lower() != "accept" or not _opens(rule, port):
                continue
            if rule.get("SourcePrefixListId"):  # its addresses cannot be checked here
                raise _insecure(
                    rule, self.security_group_id, port, f"prefix list {rule['SourcePrefixListId']}", cidr
                )
            for source in (rule.get("SourceCidrIp"), rule.get("Ipv6SourceCidrIp")):
                if not source:
                    continue
                try:
                    src = ipaddress.ip_network(source, strict=False)
                    inside = src.version == net.version and src.subnet_of(net)  # type: ignore[arg-type]
                except ValueError:
                    inside = False
                if not inside:
                    raise _insecure(rule, self.security_group_id, port, source, cidr)
                covered = covered or src == net
        if not covered:
            self._authorize(net, port)
        self._network_ok.add((str(net), port))

    def _authorize(self, net: ipaddress.IPv4Network | ipaddress.IPv6Network, port: int) -> None:
        permission = ecs.AuthorizeSecurityGroupRequestPermissions(
            ip_protocol="TCP",
            port_range=f"{port}/{port}",
            source_cidr_ip=str(net),
            policy="accept",
            priority="1",
            description="guirl: the VM server, from the cluster only",
        )
        request = ecs.AuthorizeSecurityGroupRequest(
            region_id=self.region, security_group_id=self.security_group_id, permissions=[permission]
        )
        self._sdk("AuthorizeSecurityGroup", self._client.authorize_security_group, request)
        log.info("aliyun security group %s: opened tcp %d to %s", self.security_group_id, port, net)

    # -- internals --------------------------------------------------------------------------------------

    def _sdk(self, action: str, call: Callable[[Any], Any], request: Any) -> dict[str, Any]:
        """One SDK call; its body as Aliyun's wire names, or a `CloudError`."""
        try:
            return call(request).body.to_map()
        except Exception as exc:  # noqa: BLE001 - every SDK failure becomes a CloudError
            raise self._error(
                action, exc
            ) from None  # not chained: the SDK's exception holds the signed request

    def _error(self, action: str, exc: Exception) -> CloudError:
        code = getattr(exc, "code", None)
        status = getattr(exc, "status_code", None) or getattr(exc, "statusCode", None)
        data = getattr(exc, "data", None)
        if code and isinstance(status, int):  # Aliyun answered with an error
            data = data if isinstance(data, dict) else {}
            message = data.get("Message") or data.get("message") or ""
            request_id = data.get("RequestId") or getattr(exc, "request_id", "") or "?"
            throttled = code.startswith("Throttling") or type(exc).__name__ == "ThrottlingException"
            return CloudError(
                self._clean(f"aliyun {action}: {code} (HTTP {status}): {message} [request {request_id}]"),
                code=code,
                throttled=throttled,
                retryable=status >= 500 or code in _RETRYABLE,
            )
        inner = getattr(exc, "inner_exception", None)
        if getattr(inner, "name", "") == "RetryError" or type(inner).__name__ == "RetryError":
            reason = getattr(inner, "message", "") or str(inner)
            return CloudError(
                self._clean(f"aliyun {action}: no answer from {self.endpoint}: {reason}"),
                code="NetworkError",
                retryable=True,
            )
        cause = inner if isinstance(inner, BaseException) else exc
        return CloudError(
            self._clean(f"aliyun {action}: {type(cause).__name__}: {cause}"), code=type(cause).__name__
        )

    def _clean(self, text: str) -> str:
        """`text` without the key id or any URL's query (a legacy-signed one would carry it)."""
        text = re.sub(r"\?\S*", "?…", text)
        if self._key_id:
            text = text.replace(self._key_id, "<access key id>")
        return text[:1000]

    def _describe(self, **filters: Any) -> Iterator[Instance]:
        token, seen = "", set()
        while True:
            request = ecs.DescribeInstancesRequest(
                region_id=self.region, max_results=100, next_token=token or None, **filters
            )
            body = self._sdk("DescribeInstances", self._client.describe_instances, request)
            for raw in (body.get("Instances") or {}).get("Instance") or []:
                yield _instance(raw)
            token = body.get("NextToken") or ""
            if not token or token in seen:
                return
            seen.add(token)

    def _delete(self, ids: list[str]) -> None:
        request = ecs.DeleteInstancesRequest(region_id=self.region, instance_id=ids, force=True)
        self._sdk("DeleteInstances", self._client.delete_instances, request)

    def _ingress_rules(self) -> Iterator[dict[str, Any]]:
        token = ""
        while True:
            request = ecs.DescribeSecurityGroupAttributeRequest(
                region_id=self.region,
                security_group_id=self.security_group_id,
                direction="ingress",
                max_results=1000,
                next_token=token or None,
            )
            body = self._sdk(
                "DescribeSecurityGroupAttribute", self._client.describe_security_group_attribute, request
            )
            for rule in (body.get("Permissions") or {}).get("Permission") or []:
                if (rule.get("Direction") or "ingress").lower() == "ingress":
                    yield rule
            token = body.get("NextToken") or ""
            if not token:
                return

    def _status(self, instance_id: str) -> str:
        request = ecs.DescribeInstancesRequest(region_id=self.region, instance_ids=json.dumps([instance_id]))
        body = self._sdk("DescribeInstances", self._client.describe_instances, request)
        found = (body.get("Instances") or {}).get("Instance") or []
        if not found:
            raise CloudError(f"aliyun instance {instance_id} does not exist", code=NOT_FOUND)
        return str(found[0].get("Status", ""))

    def _pauses(self, deadline: float) -> Iterator[None]:
        """Sleeps of a bounded backoff (`poll_s`) until `deadline`."""
        delay = self.poll_s[0]
        while time.monotonic() < deadline:
            yield
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))  # a state poll's backoff
            delay = min(delay * 2, self.poll_s[1])

    def _wait(self, instance_id: str, states: tuple[str, ...], deadline: float) -> str:
        """Poll until the instance's status is one of `states` (throttled polls just poll again)."""
        status = "?"
        for _ in self._pauses(deadline):
            try:
                status = self._status(instance_id)
            except CloudError as exc:
                if not exc.retryable:
                    raise
                continue
            if status in states:
                return status
        raise CloudError(
            f"aliyun instance {instance_id} is {status}, not {' or '.join(states)}, after "
            f"{self.wait_timeout_s:g} s",
            code="WaitTimeout",
        )

    def _step(
        self, action: str, call: Callable[[Any], Any], request: Any, deadline: float, done: tuple[str, ...]
    ) -> None:
        """One step of `replace_root`, again after a pause while it is throttled, fails in passing, or the
        instance is still busy with the previous step; done once the instance is in a status of `done` (an
        earlier try acted, and its answer was lost)."""
        last = CloudError(f"aliyun {action}: no time left", code="WaitTimeout")
        for _ in self._pauses(deadline):
            try:
                self._sdk(action, call, request)
                return
            except CloudError as exc:
                if not (exc.retryable or exc.code.startswith(_BUSY)):
                    raise
                last = exc
            try:
                if done and self._status(request.instance_id) in done:
                    return
            except CloudError as exc:
                if not exc.retryable:
                    raise
        raise CloudError(f"{last} (still, after {self.wait_timeout_s:g} s)", code=last.code)


def _instance(raw: dict[str, Any]) -> Instance:
    vpc = (raw.get("VpcAttributes") or {}).get("PrivateIpAddress") or {}
    ips = vpc.get("IpAddress") or [
        n.get("PrimaryIpAddress", "")
        for n in (raw.get("NetworkInterfaces") or {}).get("NetworkInterface") or []
    ]
    tags = {t.get("TagKey", ""): t.get("TagValue", "") for t in (raw.get("Tags") or {}).get("Tag") or []}
    return Instance(
        id=raw.get("InstanceId", ""),
        state=STATES.get(raw.get("Status", ""), "pending"),
        private_ip=next((ip for ip in ips if ip), ""),
        tags=tags,
    )


def _insecure(rule: dict[str, Any], group: str, port: int, source: str, cidr: str) -> CloudError:
    return CloudError(
        f"aliyun security group {group} (rule {rule.get('SecurityGroupRuleId') or '?'}) opens port {port} to "
        f"{source}, wider than cloud.cluster_cidr {cidr}: the VM server runs any command it is sent; remove "
        f"the rule or narrow it to {cidr}",
        code="InsecureSecurityGroup",
    )


def _opens(rule: dict[str, Any], port: int) -> bool:
    """Whether an ingress rule lets TCP reach `port` (a malformed port range is taken to open everything)."""
    protocol = (rule.get("IpProtocol") or "").upper()
    if protocol not in ("TCP", "ALL"):
        return False
    ports = rule.get("PortRange") or "-1/-1"
    if ports == "-1/-1":
        return True
    start, _, end = ports.partition("/")
    try:
        return int(start) <= port <= int(end or start)
    except ValueError:
        return True
