"""`FakeAliyunECS`: Alibaba Cloud's ECS OpenAPI (version 2014-05-26) on loopback, for the real SDK.

It follows `docs/cloud/aliyun-ecs.md`, so that `alibabacloud_ecs20140526` talks to it unmodified
(`Config(endpoint=fake.endpoint, protocol="http")`, with HTTP(S)_PROXY cleared: the SDK sends even loopback
calls to a proxy, whatever NO_PROXY says).

What it implements:

- **The request format** (doc §1): `POST /` (GET too), parameters in the query (merged with a form body),
  dispatch on `x-acs-action` (or the `Action` parameter), `x-acs-version`/`Version` must be 2014-05-26.
- **Signing**, exactly as doc §2: ACS3-HMAC-SHA256 (`Authorization` header; the decoded query re-encoded
  canonically; every header named in `SignedHeaders`, of which host, x-acs-action, x-acs-version, x-acs-date,
  x-acs-signature-nonce and x-acs-content-sha256 are required) and, with no `Authorization` header, RPC v1
  HMAC-SHA1 (`Signature` parameter). Refusals, with the service's codes: unknown key 404
  `InvalidAccessKeyId.NotFound`; wrong signature or body hash 400 `SignatureDoesNotMatch` (the message
  carries the server's string to sign, as the service's does); malformed 400 `IncompleteSignature`; a date
  more than `max_skew_s` (15 min) from the server's clock 400 `InvalidTimeStamp.Expired`; a reused nonce
  400 `SignatureNonceUsed`.
- **Actions**: RunInstances, DescribeInstances, DeleteInstances, StopInstance, StartInstance,
  ReplaceSystemDisk, DescribeSecurityGroupAttribute, AuthorizeSecurityGroup, with the documented parameters,
  response shapes (numbers and booleans as JSON ones) and errors (§3, §4.1). Unknown actions: 404
  `InvalidAction.NotFound`.
- **Lifecycles**, computed from timestamps (no background task): RunInstances → Pending → Starting (after
  half of `boot_delay_s`) → Running; StopInstance → Stopping → Stopped after `stop_delay_s`; StartInstance →
  Starting → Running; ReplaceSystemDisk needs Stopped (403 `IncorrectInstanceStatus`), gives a new DiskId,
  calls `on_replace_root(instance_id)` and keeps the instance locked for `replace_delay_s` (StartInstance
  meanwhile: 403 `IncorrectInstanceStatus`); DeleteInstances without Force needs Stopped. Deleted
  instances vanish from DescribeInstances. Private IPs come from the vswitch's range; a public IP only with
  InternetMaxBandwidthOut > 0. AutoReleaseTime must be ≥ 30 min and ≤ 3 years ahead (400
  `InvalidAutoReleaseTime.Malformed`), is rounded down to the minute, and releases the instance when the
  fake's lifecycle clock (`advance()`) passes it.
- **ClientToken** (§5) on RunInstances, ReplaceSystemDisk, DeleteInstances and AuthorizeSecurityGroup: the
  same token with the same parameters replays the first success (same InstanceIdSets, new RequestId) without
  acting again; with different parameters 400 `IdempotentParameterMismatch`. Tokens are remembered for the
  fake's lifetime.
- **Faults**, settable at any time: `throttle_rate` (answer `throttle_code`, HTTP 400, before acting),
  `throttle_after_rate` (act, then answer the throttling error: the caller cannot tell it acted),
  `unavailable_rate` (503 `ServiceUnavailable` before acting), all drawn from one RNG seeded by `seed` and
  limited to `throttle_actions` when set; `retry_after_ms` adds `x-acs-retry-after` to throttling answers;
  `throttle_max_in_row` bounds the injected faults in a row to one request (the same action and
  parameters; unset: no bound), so that a test's retries, and its runtime, stay bounded;
  `date_skew_s` shifts the clock the signature date is checked against; `page_cap` caps MaxResults/PageSize
  (to exercise paging).
- **Records**: `calls` (Counter of requests by action, refused ones included), `errors` (Counter by error
  code), `requests` (every authenticated request as `(action, params)`), `instances` (id → `FakeInstance`,
  deleted ones kept with `status == "Deleted"`), `security_groups` (id → list of permission dicts, in the
  response's shape).

Where the doc is uncertain, this fake decides:

- Statuses follow the documentation tables (§4.1, §7): throttling 400, unknown key 404.
- A DeleteInstances naming any unknown id fails whole with 404 `InvalidInstanceId.NotFound` and deletes
  nothing; unknown ids in DescribeInstances' InstanceIds are silently absent.
- The throttling code is `Throttling.User` with no `x-acs-retry-after` unless `retry_after_ms` is set.
- `IncorrectInstanceStatus.Initializing` (a just-created instance refusing deletion) is not modelled: a
  forced delete works in every state.
- Response times use the documented minute form (`2030-01-01T00:00Z`).
- The lifecycle clock is `time.time() + clock_offset_s` (moved by `advance`); the signature date is checked
  against the real clock (plus `date_skew_s`), as the SDK's dates are real.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import ipaddress
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote

from aiohttp import web

from guirl.testing.fakes._common import LoopbackServer

VERSION = "2014-05-26"
_REQUIRED_SIGNED = {
    "host",
    "x-acs-action",
    "x-acs-version",
    "x-acs-date",
    "x-acs-signature-nonce",
    "x-acs-content-sha256",
}
_RPC_COMMON = {
    "Action",
    "Version",
    "Format",
    "Timestamp",
    "SignatureNonce",
    "SignatureMethod",
    "SignatureVersion",
    "SignatureType",
    "AccessKeyId",
    "SecurityToken",
    "Signature",
}
_IDEMPOTENT = {"RunInstances", "ReplaceSystemDisk", "DeleteInstances", "AuthorizeSecurityGroup"}
_THROTTLE_MESSAGES = {
    "Throttling": "Request was denied due to request throttling.",
    "Throttling.User": "Request was denied due to user flow control.",
    "Throttling.Api": "Request was denied due to api flow control.",
}
_THREE_YEARS_S = 3 * 365 * 86400


def acs3_signature(
    method: str,
    path: str,
    raw_query: str,
    headers: dict[str, str],
    body: bytes,
    secret: str,
    signed: list[str],
) -> tuple[str, str]:
    """The ACS3-HMAC-SHA256 signature of a request as the server recomputes it (doc §2.1), and the string
    to sign. `headers`: lowercase names → received values; `signed`: the names in SignedHeaders."""
    pairs = sorted(parse_qsl(raw_query, keep_blank_values=True))  # decode first: the wire's + is a space
    canonical_query = "&".join(f"{k}={quote(v, safe='~')}" for k, v in pairs)
    canonical_headers = "".join(f"{h}:{headers.get(h, '').strip()}\n" for h in sorted(signed))
    canonical = "\n".join(
        [method, path or "/", canonical_query, canonical_headers, ";".join(sorted(signed))]
        + [hashlib.sha256(body).hexdigest()]
    )
    to_sign = "ACS3-HMAC-SHA256\n" + hashlib.sha256(canonical.encode()).hexdigest()
    return hmac.new(secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest(), to_sign


def rpc_signature(method: str, params: dict[str, str], secret: str) -> str:
    """The RPC v1 HMAC-SHA1 signature (doc §2.3) of `params` (Signature itself excluded)."""
    enc = lambda s: quote(s, safe="~")  # noqa: E731
    canonical = "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(params.items()) if k != "Signature")
    to_sign = f"{method}&{enc('/')}&{enc(canonical)}"
    digest = hmac.new((secret + "&").encode(), to_sign.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


class AliyunError(Exception):
    """An error answer: HTTP `status`, Aliyun's `code` and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _minute(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%MZ")


@dataclass
class FakeInstance:
    """One instance as the fake keeps it."""

    id: str
    status: str
    private_ip: str
    tags: dict[str, str]
    image_id: str
    instance_type: str
    vswitch_id: str
    security_group_id: str
    created: float
    auto_release: float | None = None
    public_ip: str = ""
    bandwidth_out: int = 0
    disk_id: str = field(default_factory=lambda: "d-" + uuid.uuid4().hex[:20])
    plan: list[tuple[float, str]] = field(default_factory=list)
    """Status changes to come, as (lifecycle time, status)."""
    locked_until: float = 0.0
    """A re-image in progress until then."""


class FakeAliyunECS(LoopbackServer):
    """Aliyun's ECS OpenAPI on `host:port` (0: a free port); see the module docstring."""

    IMAGE = "m-guirl-desktop"
    VSWITCH = "vsw-guirl"
    SECURITY_GROUP = "sg-guirl"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        region: str = "cn-hangzhou",
        access_keys: dict[str, str] | None = None,
        boot_delay_s: float = 0.3,
        stop_delay_s: float = 0.1,
        replace_delay_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.host, self.port, self.region = host, port, region
        self.access_keys = dict(access_keys or {"LTAI5tFakeKeyId": "FakeSecret"})
        self.boot_delay_s, self.stop_delay_s, self.replace_delay_s = (
            boot_delay_s,
            stop_delay_s,
            replace_delay_s,
        )
        self.images = {self.IMAGE}
        self.vswitches = {self.VSWITCH: "10.0.0.0/16"}
        self.security_groups: dict[str, list[dict[str, Any]]] = {self.SECURITY_GROUP: []}
        self.instances: dict[str, FakeInstance] = {}
        self.on_replace_root: Callable[[str], Any] | None = None
        self.throttle_rate = 0.0
        self.throttle_after_rate = 0.0
        self.unavailable_rate = 0.0
        self.throttle_actions: set[str] | None = None
        self.throttle_code = "Throttling.User"
        self.throttle_max_in_row: int | None = None
        self.retry_after_ms: int | None = None
        self.max_skew_s = 900.0
        self.date_skew_s = 0.0
        self.clock_offset_s = 0.0
        self.page_cap: int | None = None
        self.calls: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._rng = random.Random(seed)
        self._nonces: set[str] = set()
        self._in_row: dict[str, int] = {}
        self._tokens: dict[tuple[str, str], tuple[dict[str, str], dict[str, Any]]] = {}
        self._next_ip: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self._actions = {
            "RunInstances": self._run_instances,
            "DescribeInstances": self._describe_instances,
            "DeleteInstances": self._delete_instances,
            "StopInstance": self._stop_instance,
            "StartInstance": self._start_instance,
            "ReplaceSystemDisk": self._replace_system_disk,
            "DescribeSecurityGroupAttribute": self._describe_security_group,
            "AuthorizeSecurityGroup": self._authorize_security_group,
        }

    # -- life -------------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """What `Config.endpoint` takes: `host:port`, no scheme."""
        return f"{self.host}:{self.port}"

    def _routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/", self._handle)

    # -- for tests ----------------------------------------------------------------------------------------

    def now(self) -> float:
        """The lifecycle clock."""
        return time.time() + self.clock_offset_s

    def advance(self, seconds: float) -> None:
        """Move the lifecycle clock on (AutoReleaseTime, boot and stop delays)."""
        self.clock_offset_s += seconds

    def live(self, **tags: str) -> list[FakeInstance]:
        """Instances not deleted, carrying every tag given (`fake.live(**{"guirl:run": "r"})`)."""
        self._settle()
        return [
            i
            for i in self.instances.values()
            if i.status != "Deleted" and all(i.tags.get(k) == v for k, v in tags.items())
        ]

    def add_permission(
        self,
        group_id: str,
        source_cidr: str,
        port_range: str,
        *,
        protocol: str = "TCP",
        policy: str = "Accept",
    ) -> None:
        """An ingress rule in `group_id` (created if new), as if added in the console."""
        self.security_groups.setdefault(group_id, []).append(
            self._permission(protocol.upper(), port_range, source_cidr, policy.capitalize(), 1, "")
        )

    # -- the wire -----------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        request_id = str(uuid.uuid4()).upper()
        body = await request.read()
        raw_query = request.rel_url.raw_query_string
        params = dict(parse_qsl(raw_query, keep_blank_values=True))
        if body and request.content_type == "application/x-www-form-urlencoded":
            params.update(parse_qsl(body.decode(), keep_blank_values=True))
        headers = {k.lower(): v for k, v in request.headers.items()}
        action = headers.get("x-acs-action") or params.get("Action", "")
        self.calls[action] += 1
        try:
            if (headers.get("x-acs-version") or params.get("Version")) != VERSION:
                raise AliyunError(400, "InvalidVersion", "Specified parameter Version is not valid.")
            self._authenticate(request.method, request.path, raw_query, headers, body, params)
            handler = self._actions.get(action)
            if handler is None:
                raise AliyunError(
                    404,
                    "InvalidAction.NotFound",
                    "Specified api is not found, please check your url and method.",
                )
            params = {k: v for k, v in params.items() if k not in _RPC_COMMON}
            self.requests.append((action, params))
            self._settle()
            self._fault("before", action, params)
            result = await self._idempotent(action, params, handler)
            self._fault("after", action, params)
        except AliyunError as exc:
            return self._error(exc, request_id)
        except Exception as exc:  # noqa: BLE001 - a bug here answers as the service's 500 does, with its body
            message = f"The request processing has failed due to some unknown error: {exc!r}"
            return self._error(AliyunError(500, "InternalError", message), request_id)
        return self._json({"RequestId": request_id, **result}, request_id)

    def _json(self, body: dict[str, Any], request_id: str, status: int = 200, **headers: str) -> web.Response:
        return web.Response(
            status=status,
            body=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json;charset=utf-8",
                "x-acs-request-id": request_id,
                **headers,
            },
        )

    def _error(self, exc: AliyunError, request_id: str) -> web.Response:
        self.errors[exc.code] += 1
        body = {
            "RequestId": request_id,
            "HostId": f"ecs.{self.region}.aliyuncs.com",
            "Code": exc.code,
            "Message": exc.message,
            "Recommend": f"https://api.aliyun.com/troubleshoot?q={exc.code}&product=Ecs&requestId={request_id}",
        }
        extra = {}
        if exc.code.startswith("Throttling") and self.retry_after_ms is not None:
            extra["x-acs-retry-after"] = str(self.retry_after_ms)
        return self._json(body, request_id, exc.status, **extra)

    def _authenticate(
        self,
        method: str,
        path: str,
        raw_query: str,
        headers: dict[str, str],
        body: bytes,
        params: dict[str, str],
    ) -> None:
        auth = headers.get("authorization")
        if auth is None:  # RPC v1 (legacy SDK, or signature_algorithm='v2')
            secret = self._secret(params.get("AccessKeyId", ""))
            self._check_date(params.get("Timestamp", ""))
            if not hmac.compare_digest(rpc_signature(method, params, secret), params.get("Signature", "")):
                raise AliyunError(
                    400, "SignatureDoesNotMatch", "Specified signature is not matched with our calculation."
                )
            self._use_nonce(params.get("SignatureNonce", ""))
            return
        algorithm, _, rest = auth.partition(" ")
        fields = dict(part.strip().partition("=")[::2] for part in rest.split(","))
        signed = [h for h in fields.get("SignedHeaders", "").split(";") if h]
        if algorithm != "ACS3-HMAC-SHA256" or not {"Credential", "Signature"} <= fields.keys():
            raise AliyunError(
                400, "IncompleteSignature", "The request signature does not conform to Aliyun standards."
            )
        if not _REQUIRED_SIGNED <= set(signed):
            raise AliyunError(
                400,
                "IncompleteSignature",
                f"SignedHeaders must include {', '.join(sorted(_REQUIRED_SIGNED))}.",
            )
        secret = self._secret(fields["Credential"])
        self._check_date(headers.get("x-acs-date", ""))
        expected, to_sign = acs3_signature(method, path, raw_query, headers, body, secret, signed)
        body_ok = headers.get("x-acs-content-sha256") == hashlib.sha256(body).hexdigest()
        if not body_ok or not hmac.compare_digest(expected, fields["Signature"]):
            raise AliyunError(
                400,
                "SignatureDoesNotMatch",
                "Specified signature does not match our calculation. server string to sign is:" + to_sign,
            )
        self._use_nonce(headers.get("x-acs-signature-nonce", ""))

    def _secret(self, key_id: str) -> str:
        secret = self.access_keys.get(key_id)
        if secret is None:
            raise AliyunError(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        return secret

    def _check_date(self, stamp: str) -> None:
        try:
            when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise AliyunError(
                400, "InvalidTimeStamp.Format", "Specified time stamp or date value is not well formatted."
            ) from None
        if abs(time.time() + self.date_skew_s - when) > self.max_skew_s:
            raise AliyunError(
                400, "InvalidTimeStamp.Expired", "Specified time stamp or date value is expired."
            )

    def _use_nonce(self, nonce: str) -> None:
        if nonce in self._nonces:
            raise AliyunError(400, "SignatureNonceUsed", "Specified signature nonce was used already.")
        self._nonces.add(nonce)

    def _fault(self, when: str, action: str, params: dict[str, str]) -> None:
        """A fault drawn for this request `before` or `after` acting (AliyunError), or nothing."""
        if self.throttle_actions is not None and action not in self.throttle_actions:
            return
        key = json.dumps([action, sorted(params.items())])
        in_row = self._in_row.pop(key, 0)
        unavailable = when == "before" and self._rng.random() < self.unavailable_rate
        throttled = self._rng.random() < (
            self.throttle_rate if when == "before" else self.throttle_after_rate
        )
        if self.throttle_max_in_row is not None and in_row >= self.throttle_max_in_row:
            if when == "before":
                self._in_row[key] = in_row  # and through after acting too
            return
        if unavailable:
            self._in_row[key] = in_row + 1
            raise AliyunError(
                503, "ServiceUnavailable", "The request has failed due to a temporary failure of the server."
            )
        if throttled:
            self._in_row[key] = in_row + 1
            raise AliyunError(
                400, self.throttle_code, _THROTTLE_MESSAGES.get(self.throttle_code, "Throttled.")
            )
        if when == "before" and in_row:
            self._in_row[key] = in_row  # the answer after acting may still be a throttling one

    async def _idempotent(self, action: str, params: dict[str, str], handler: Callable[..., Any]) -> dict:
        token = params.get("ClientToken")
        if action not in _IDEMPOTENT or not token:
            return await _maybe_await(handler(params))
        if len(token) > 64 or not token.isascii():
            raise AliyunError(400, "InvalidClientToken.Malformed", "The specified ClientToken is not valid.")
        rest = {k: v for k, v in params.items() if k != "ClientToken"}
        seen = self._tokens.get((action, token))
        if seen is not None:
            if seen[0] != rest:
                raise AliyunError(
                    400,
                    "IdempotentParameterMismatch",
                    "Request uses a client token in a previous request but is not identical to that request.",
                )
            return dict(seen[1])
        result = await _maybe_await(handler(params))
        self._tokens[(action, token)] = (rest, dict(result))
        return result

    # -- the model ------------------------------------------------------------------------------------

    def _settle(self) -> None:
        """Apply the status changes and auto-releases due by now."""
        now = self.now()
        for inst in self.instances.values():
            if inst.status == "Deleted":
                continue
            while inst.plan and inst.plan[0][0] <= now:
                inst.status = inst.plan.pop(0)[1]
            if inst.auto_release is not None and now >= inst.auto_release:
                inst.status, inst.plan = "Deleted", []

    def _instance(self, instance_id: str) -> FakeInstance:
        inst = self.instances.get(instance_id)
        if inst is None or inst.status == "Deleted":
            raise AliyunError(404, "InvalidInstanceId.NotFound", "The specified InstanceId does not exist.")
        return inst

    def _allocate_ip(self, vswitch: str) -> str:
        net = ipaddress.ip_network(self.vswitches[vswitch])
        n = self._next_ip.get(vswitch, 10)  # the first addresses are the gateway's and reserved
        self._next_ip[vswitch] = n + 1
        return str(net[n])

    def _run_instances(self, p: dict[str, str]) -> dict[str, Any]:
        self._region(p)
        image = _required(p, "ImageId")
        if image not in self.images:
            raise AliyunError(404, "InvalidImageId.NotFound", "The specified ImageId does not exist.")
        instance_type = _required(p, "InstanceType")
        vswitch = _required(p, "VSwitchId")
        if vswitch not in self.vswitches:
            raise AliyunError(404, "InvalidVSwitchId.NotFound", "The specified VSwitchId does not exist.")
        group = p.get("SecurityGroupId") or p.get("SecurityGroupIds.1") or ""
        if group not in self.security_groups:
            raise AliyunError(
                404, "InvalidSecurityGroupId.NotFound", "The specified SecurityGroupId does not exist."
            )
        amount = _int(p, "Amount", 1, 1, 100)
        bandwidth = _int(p, "InternetMaxBandwidthOut", 0, 0, 100)
        try:
            script = base64.b64decode(p.get("UserData", ""), validate=True)
        except (binascii.Error, ValueError):
            raise AliyunError(
                400, "InvalidUserData.Base64FormatInvalid", "The UserData is not base64."
            ) from None
        if len(script) > 32 * 1024:
            raise AliyunError(400, "InvalidUserData.SizeExceeded", "The UserData exceeds 32 KB.")
        tags = _tags(p)
        release = self._auto_release(p)
        if _bool(p.get("DryRun", "false")):
            raise AliyunError(
                400, "DryRunOperation", "Request validation has been passed with DryRun flag set."
            )
        ids = []
        now = self.now()
        for _ in range(amount):
            inst = FakeInstance(
                id="i-" + uuid.uuid4().hex[:20],
                status="Pending",
                private_ip=self._allocate_ip(vswitch),
                tags=dict(tags),
                image_id=image,
                instance_type=instance_type,
                vswitch_id=vswitch,
                security_group_id=group,
                created=now,
                auto_release=release,
                bandwidth_out=bandwidth,
                public_ip=f"47.96.{len(self.instances) // 250}.{len(self.instances) % 250 + 1}"
                if bandwidth
                else "",
                plan=[(now + self.boot_delay_s / 2, "Starting"), (now + self.boot_delay_s, "Running")],
            )
            self.instances[inst.id] = inst
            ids.append(inst.id)
        return {"OrderId": "", "TradePrice": 0.0, "InstanceIdSets": {"InstanceIdSet": ids}}

    def _auto_release(self, p: dict[str, str]) -> float | None:
        stamp = p.get("AutoReleaseTime")
        if not stamp:
            return None
        if p.get("InstanceChargeType", "PostPaid") != "PostPaid":
            raise AliyunError(400, "InvalidParameter", "AutoReleaseTime is for pay-as-you-go instances only.")
        try:
            when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise AliyunError(
                400, "InvalidAutoReleaseTime.Malformed", "The specified AutoReleaseTime is malformed."
            ) from None
        when -= when % 60  # seconds other than 00 are rounded down to the minute
        now = self.now()
        if not now + 1800 <= when <= now + _THREE_YEARS_S:
            raise AliyunError(
                400,
                "InvalidAutoReleaseTime.Malformed",
                "The specified AutoReleaseTime must be at least 30 minutes and at most 3 years later.",
            )
        return when

    def _describe_instances(self, p: dict[str, str]) -> dict[str, Any]:
        self._region(p)
        found = [i for i in self.instances.values() if i.status != "Deleted"]
        if p.get("InstanceIds"):
            try:
                wanted = json.loads(p["InstanceIds"])
            except ValueError:
                wanted = [s.strip() for s in p["InstanceIds"].split(",")]
            if not isinstance(wanted, list) or len(wanted) > 100:
                raise AliyunError(
                    400, "InvalidInstanceIds.Malformed", "The specified InstanceIds are not valid."
                )
            found = [i for i in found if i.id in set(wanted)]
        for key, value in _tags(p):
            found = [i for i in found if key in i.tags and (value is None or i.tags[key] == value)]
        if p.get("Status"):
            found = [i for i in found if i.status == p["Status"]]
        cap = self.page_cap or 100
        if "NextToken" in p or "MaxResults" in p:
            size = min(max(10, _int(p, "MaxResults", 10, 1, 100)), cap)
            start = _offset(p.get("NextToken", ""))
            page = found[start : start + size]
            more = start + size < len(found)
            token = base64.urlsafe_b64encode(f"o{start + size}".encode()).decode() if more else ""
            return {
                "TotalCount": len(found),
                "NextToken": token,
                "Instances": {"Instance": self._shapes(page)},
            }
        size = min(_int(p, "PageSize", 10, 1, 100), cap)
        number = _int(p, "PageNumber", 1, 1, 10**9)
        page = found[(number - 1) * size : number * size]
        return {
            "TotalCount": len(found),
            "PageNumber": number,
            "PageSize": size,
            "NextToken": "",
            "Instances": {"Instance": self._shapes(page)},
        }

    def _shapes(self, instances: list[FakeInstance]) -> list[dict[str, Any]]:
        return [
            {
                "InstanceId": i.id,
                "InstanceName": i.id,
                "HostName": i.id,
                "Status": i.status,
                "RegionId": self.region,
                "ZoneId": f"{self.region}-k",
                "InstanceType": i.instance_type,
                "ImageId": i.image_id,
                "InstanceChargeType": "PostPaid",
                "CreationTime": _minute(i.created),
                "StartTime": _minute(i.created),
                "ExpiredTime": "2099-12-31T15:59Z",
                "AutoReleaseTime": _minute(i.auto_release) if i.auto_release else "",
                "StoppedMode": "Not-applicable",
                "DeletionProtection": False,
                "InstanceNetworkType": "vpc",
                "InternetMaxBandwidthOut": i.bandwidth_out,
                "VpcAttributes": {
                    "VpcId": "vpc-guirl",
                    "VSwitchId": i.vswitch_id,
                    "NatIpAddress": "",
                    "PrivateIpAddress": {"IpAddress": [i.private_ip]},
                },
                "PublicIpAddress": {"IpAddress": [i.public_ip] if i.public_ip else []},
                "InnerIpAddress": {"IpAddress": []},
                "EipAddress": {"AllocationId": "", "IpAddress": "", "InternetChargeType": ""},
                "SecurityGroupIds": {"SecurityGroupId": [i.security_group_id]},
                "NetworkInterfaces": {
                    "NetworkInterface": [
                        {
                            "NetworkInterfaceId": "eni-" + i.id[2:],
                            "Type": "Primary",
                            "PrimaryIpAddress": i.private_ip,
                            "PrivateIpSets": {
                                "PrivateIpSet": [{"PrivateIpAddress": i.private_ip, "Primary": True}]
                            },
                        }
                    ]
                },
                "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in i.tags.items()]},
                "OperationLocks": {"LockReason": []},
            }
            for i in instances
        ]

    def _delete_instances(self, p: dict[str, str]) -> dict[str, Any]:
        self._region(p)
        ids = _list(p, "InstanceId")
        if not 1 <= len(ids) <= 100:
            raise _missing("InstanceId")
        doomed = [self._instance(i) for i in ids]  # any unknown id fails the whole call
        if not _bool(p.get("Force", "false")) and any(i.status != "Stopped" for i in doomed):
            raise AliyunError(
                403,
                "IncorrectInstanceStatus",
                "The current status of the resource does not support this operation.",
            )
        for inst in doomed:
            inst.status, inst.plan = "Deleted", []
        return {}

    def _stop_instance(self, p: dict[str, str]) -> dict[str, Any]:
        inst = self._instance(_required(p, "InstanceId"))
        _expect(inst, "Running")
        inst.status, inst.plan = "Stopping", [(self.now() + self.stop_delay_s, "Stopped")]
        return {}

    def _start_instance(self, p: dict[str, str]) -> dict[str, Any]:
        inst = self._instance(_required(p, "InstanceId"))
        _expect(inst, "Stopped")
        if self.now() < inst.locked_until:
            raise AliyunError(
                403,
                "IncorrectInstanceStatus",
                "The current status of the resource does not support this operation.",
            )
        inst.status, inst.plan = "Starting", [(self.now() + self.boot_delay_s, "Running")]
        return {}

    async def _replace_system_disk(self, p: dict[str, str]) -> dict[str, Any]:
        inst = self._instance(_required(p, "InstanceId"))
        image = _required(p, "ImageId")
        if image not in self.images:
            raise AliyunError(404, "InvalidImageId.NotFound", "The specified ImageId does not exist.")
        _expect(inst, "Stopped")
        if self.now() < inst.locked_until:
            raise AliyunError(
                403,
                "IncorrectInstanceStatus",
                "The current status of the resource does not support this operation.",
            )
        inst.image_id, inst.disk_id = image, "d-" + uuid.uuid4().hex[:20]
        inst.locked_until = self.now() + self.replace_delay_s
        if self.on_replace_root is not None:
            await _maybe_await(self.on_replace_root(inst.id))
        return {"DiskId": inst.disk_id}

    def _group(self, p: dict[str, str]) -> tuple[str, list[dict[str, Any]]]:
        self._region(p)
        group = _required(p, "SecurityGroupId")
        if group not in self.security_groups:
            raise AliyunError(
                404, "InvalidSecurityGroupId.NotFound", "The specified SecurityGroupId does not exist."
            )
        return group, self.security_groups[group]

    def _describe_security_group(self, p: dict[str, str]) -> dict[str, Any]:
        group, rules = self._group(p)
        direction = p.get("Direction", "all").lower()
        rules = [r for r in rules if direction == "all" or r["Direction"] == direction]
        size = min(_int(p, "MaxResults", 500, 10, 1000), self.page_cap or 1000)
        start = _offset(p.get("NextToken", ""))
        more = start + size < len(rules)
        return {
            "RegionId": self.region,
            "SecurityGroupId": group,
            "SecurityGroupName": group,
            "VpcId": "vpc-guirl",
            "Description": "",
            "InnerAccessPolicy": "Accept",
            "NextToken": base64.urlsafe_b64encode(f"o{start + size}".encode()).decode() if more else "",
            "Permissions": {"Permission": rules[start : start + size]},
        }

    def _authorize_security_group(self, p: dict[str, str]) -> dict[str, Any]:
        _, rules = self._group(p)
        flat = {
            k for k in ("IpProtocol", "PortRange", "SourceCidrIp", "Policy", "Priority", "NicType") if k in p
        }
        n = 1
        asked = []
        while f"Permissions.{n}.IpProtocol" in p or f"Permissions.{n}.PortRange" in p:
            asked.append({k.split(".", 2)[2]: v for k, v in p.items() if k.startswith(f"Permissions.{n}.")})
            n += 1
        if flat and asked:
            raise AliyunError(
                400,
                "InvalidParameter",
                "Permissions.N and the deprecated flat parameters cannot be combined.",
            )
        if flat:
            asked = [{k: p[k] for k in flat}]
        if not asked:
            raise _missing("Permissions")
        for perm in asked:
            protocol = perm.get("IpProtocol", "").upper()
            if protocol not in ("TCP", "UDP", "ICMP", "GRE", "ALL"):
                raise AliyunError(
                    400, "InvalidIpProtocol.Malformed", "The specified IpProtocol is not valid."
                )
            ports = perm.get("PortRange", "")
            if not _port_range_ok(protocol, ports):
                raise AliyunError(
                    400, "InvalidIpPortRange.Malformed", "The specified PortRange is not valid."
                )
            source = perm.get("SourceCidrIp", "")
            try:
                source = str(ipaddress.ip_network(source, strict=False)) if source else ""
            except ValueError:
                raise AliyunError(
                    400, "InvalidSourceCidrIp.Malformed", "The specified SourceCidrIp is not valid."
                ) from None
            policy = perm.get("Policy", "accept").lower()
            if policy not in ("accept", "drop"):
                raise AliyunError(400, "InvalidPolicy.Malformed", "The specified Policy is not valid.")
            priority = _int(perm, "Priority", 1, 1, 100)
            rule = self._permission(
                protocol, ports, source, policy.capitalize(), priority, perm.get("Description", "")
            )
            same = ("IpProtocol", "PortRange", "SourceCidrIp", "Policy", "Priority", "Direction")
            if not any(all(r[k] == rule[k] for k in same) for r in rules):  # an existing rule: nothing added
                rules.append(rule)
        return {}

    @staticmethod
    def _permission(
        protocol: str, ports: str, source: str, policy: str, priority: int, description: str
    ) -> dict:
        return {
            "SecurityGroupRuleId": "sgr-" + uuid.uuid4().hex[:20],
            "Direction": "ingress",
            "IpProtocol": protocol,
            "PortRange": ports,
            "SourceCidrIp": source,
            "Ipv6SourceCidrIp": "",
            "SourceGroupId": "",
            "SourcePrefixListId": "",
            "Policy": policy,
            "Priority": priority,
            "NicType": "intranet",
            "CreateTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "Description": description,
        }

    def _region(self, p: dict[str, str]) -> None:
        if _required(p, "RegionId") != self.region:
            raise AliyunError(404, "InvalidRegionId.NotFound", "The specified RegionId does not exist.")


# -- parameters -----------------------------------------------------------------------------------------


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _missing(name: str) -> AliyunError:
    return AliyunError(
        400,
        "MissingParameter",
        f'The input parameter "{name}" that is mandatory for processing this request is not supplied.',
    )


def _required(p: dict[str, str], name: str) -> str:
    if not p.get(name):
        raise _missing(name)
    return p[name]


def _int(p: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    try:
        value = int(p.get(name, default))
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise AliyunError(400, "InvalidParameter", f"The specified parameter {name} is not valid.")
    return value


def _bool(value: str) -> bool:
    return value.lower() == "true"


def _list(p: dict[str, str], name: str) -> list[str]:
    """`Name.1`, `Name.2`, … in order of N."""
    found = []
    for key, value in p.items():
        head, _, n = key.rpartition(".")
        if head == name and n.isdigit():
            found.append((int(n), value))
    return [v for _, v in sorted(found)]


def _tags(p: dict[str, str]) -> list[tuple[str, str | None]]:
    """`Tag.N.Key` / `Tag.N.Value` in order of N (the value None when absent: any value)."""
    ns = sorted({int(k.split(".")[1]) for k in p if k.startswith("Tag.") and k.split(".")[1].isdigit()})
    tags = []
    for n in ns:
        key, value = p.get(f"Tag.{n}.Key", ""), p.get(f"Tag.{n}.Value")
        if (
            not key
            or len(key) > 128
            or key.startswith(("aliyun", "acs:"))
            or "http://" in key
            or "https://" in key
        ):
            raise AliyunError(400, "InvalidTagKey.Malformed", "The specified Tag.n.Key is not valid.")
        if value is not None and len(value) > 128:
            raise AliyunError(400, "InvalidTagValue.Malformed", "The specified Tag.n.Value is not valid.")
        tags.append((key, value))
    if len(tags) > 20:
        raise AliyunError(400, "InvalidTagCount", "The number of tags exceeds 20.")
    return tags


def _offset(token: str) -> int:
    if not token:
        return 0
    try:
        return int(base64.urlsafe_b64decode(token.encode()).decode()[1:])
    except (ValueError, binascii.Error):
        raise AliyunError(
            400, "InvalidNextToken.Malformed", "The specified NextToken is not valid."
        ) from None


def _expect(inst: FakeInstance, status: str) -> None:
    if inst.status != status:
        raise AliyunError(
            403,
            "IncorrectInstanceStatus",
            "The current status of the resource does not support this operation.",
        )


def _port_range_ok(protocol: str, ports: str) -> bool:
    if protocol in ("ICMP", "GRE", "ALL"):
        return ports == "-1/-1"
    start, _, end = ports.partition("/")
    try:
        return 1 <= int(start) <= int(end) <= 65535
    except ValueError:
        return False
