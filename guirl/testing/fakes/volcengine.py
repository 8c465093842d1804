"""`FakeVolcengine`: Volcengine's ECS and VPC OpenAPI (version 2020-04-01) on loopback, spoken as the official
SDK speaks it (`docs/cloud/volcengine-ecs.md` is the reference), so that `volcenginesdkcore` talks to it
unmodified at `host="127.0.0.1:PORT", scheme="http"`.

What it implements:

- **Wire format**: `GET /` with every parameter in the query, indexed lists (`Tags.1.Key`,
  `TagFilters.1.Values.1`) decoded back into lists; one port for both services, told apart by the service
  of the credential scope. Replies are the `{"ResponseMetadata": {RequestId, Action, Version, Service,
  Region[, Error{Code, Message}]}, "Result": ...}` envelope, errors with a non-2xx status (doc §4).
- **Signing** (doc §3.2): the signature is recomputed from the request as received (canonical query from
  the raw query string, the headers named in `SignedHeaders`, the body's hash) with the secret of the
  access key; unknown key: 401 `InvalidAccessKey`; wrong signature: 401 `SignatureDoesNotMatch`; missing
  header: 401 `MissingAuthenticationToken`; `X-Date` more than 15 minutes off the fake's clock
  (`clock_skew_s` moves it): 400 `InvalidTimestamp`. The scope's region must be the fake's (else 404
  `ServiceNotFound`, the fake's choice) and its service the action's (else 404 `InvalidActionOrVersion`).
- **ECS**: RunInstances (private IPs from the subnet's range, tags at creation, base64 UserData, `Count`),
  DescribeInstances (`InstanceIds`, `TagFilters` (a filter without values: the key is present), `Status`,
  `MaxResults` 1..100 (default 10) and `NextToken`; unknown ids are simply absent), DeleteInstance(s)
  (`OperationDetails` per id), StopInstance, StartInstance, ReplaceSystemVolume. Status changes take
  time: `CREATING → RUNNING` after `boot_delay_s`, `RUNNING → STOPPING → STOPPED` and
  `STOPPED → STARTING → RUNNING` after `stop_delay_s`, `STOPPED → REBUILDING → RUNNING` after
  `rebuild_delay_s` (`STOPPED` instead with `rebuild_leaves_stopped`), `DELETING → gone` after
  `delete_delay_s`; they are applied when the fake is next asked, no background task.
- **VPC**: DescribeSubnetAttributes, DescribeSecurityGroupAttributes, AuthorizeSecurityGroupIngress (and
  RevokeSecurityGroupIngress); `allow()` adds a rule directly.
- **ClientToken** per action: the same token with the same parameters answers the first successful result
  again without acting; with other parameters 400 `IdempotentParameterMismatch`; over 64 characters or
  not ASCII 400 `InvalidClientToken.Malformed`. Only successes are remembered.

Where the doc is uncertain, the fake chooses (and the adapter must cope either way):

- throttling is HTTP **429** `AccountFlowLimitExceeded` (§8: the status is unverified; `throttle_status`
  answers it with another, e.g. 400, or 200 with the `Error` in `ResponseMetadata`);
- ReplaceSystemVolume **requires STOPPED** (400 `InvalidInstanceStatus` otherwise; the docs only warn)
  and comes back `RUNNING` by itself (Terraform's expectation);
- DeleteInstance(s) of an instance already `DELETING` succeeds, of one `CREATING` too;
  StopInstance needs `RUNNING`, StartInstance `STOPPED`;
- a duplicate ingress rule is 400 `InvalidSecurityRule.Conflict` (the code is invented: unverified);
  not-found codes follow `Invalid<Resource>.NotFound` with 404;
- the fake answers at most `page_limit` instances per page (when set), whatever `MaxResults` says, so that a
  client must follow `NextToken`.

Fault switches, settable at any time: `throttle_rate` (answer the throttling error before acting),
`throttle_after_rate` (act, then answer the throttling error), `error_rate` (500 `InternalError` before
acting) — drawn from a generator seeded by `seed`, the action and its call count, so a run's faults do
not depend on how threads interleave; `throttle_status`; `clock_skew_s`; `rebuild_leaves_stopped`;
`page_limit`. Records: `calls` and `throttled` (Counters by action), `replaced` (Counter by instance id),
`on_replace_root(instance_id)` (called when a ReplaceSystemVolume is accepted).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import ipaddress
import itertools
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote

from aiohttp import web

from guirl.testing.fakes._common import LoopbackServer

VERSION = "2020-04-01"
THROTTLE = ("AccountFlowLimitExceeded", "Request was denied due to account flow control.")
MAX_SKEW_S = 900.0
ECS_ACTIONS = {
    "RunInstances",
    "DescribeInstances",
    "DeleteInstance",
    "DeleteInstances",
    "StopInstance",
    "StartInstance",
    "ReplaceSystemVolume",
}
VPC_ACTIONS = {
    "DescribeSubnetAttributes",
    "DescribeSecurityGroupAttributes",
    "AuthorizeSecurityGroupIngress",
    "RevokeSecurityGroupIngress",
}
_PROTOCOLS = ("tcp", "udp", "icmp", "icmpv6", "all")


class _Fail(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _not_found(kind: str, rid: str) -> _Fail:
    return _Fail(404, f"Invalid{kind}.NotFound", f"The specified {kind.lower()} {rid} does not exist.")


def _bad_status(iid: str, status: str) -> _Fail:
    return _Fail(
        400,
        "InvalidInstanceStatus",
        f"The status of the specified instance {iid} ({status}) does not support this request.",
    )


@dataclass
class FakeSubnet:
    """A subnet: its range (instances' private IPs), zone and VPC."""

    cidr: str
    zone: str
    vpc: str


@dataclass
class FakeInstance:
    """One ECS instance as the fake keeps it."""

    id: str
    name: str
    status: str
    zone: str
    image: str
    type: str
    subnet: str
    vpc: str
    security_groups: list[str]
    ip: str
    tags: dict[str, str]
    user_data: str
    created: float
    eip: bool = False
    seq: int = 0
    change: tuple[float, str] | None = None
    """(when, the status it takes then; "" = gone)"""


@dataclass
class _Job:
    action: str
    service: str
    region: str
    params: dict[str, Any] = field(default_factory=dict)


def _q(s: str) -> str:
    return quote(s, safe="-_.~")


def signature(
    secret: str,
    region: str,
    service: str,
    method: str,
    path: str,
    raw_query: str,
    headers: dict[str, str],
    signed: list[str],
    body: bytes,
) -> str:
    """The HMAC-SHA256 signature of a request as received (doc §3.1-3.2): the canonical query rebuilt from the
    raw query string, the `signed` headers (lower-case names in `headers`) with their values as received
    (port 80/443 dropped from `host`), the body's hash; the key derived from `secret` down the scope."""
    lines = ""
    for name in signed:
        value = headers[name]
        if name == "host" and value.rsplit(":", 1)[-1] in ("80", "443"):
            value = value.rsplit(":", 1)[0]
        lines += f"{name}:{value}\n"
    query = dict(parse_qsl(raw_query, keep_blank_values=True))  # a repeated key: the last one wins
    canonical_query = "&".join(f"{k}={v}" for k, v in sorted((_q(k), _q(v)) for k, v in query.items()))
    body_hash = hashlib.sha256(body).hexdigest()
    canonical = "\n".join([method, path or "/", canonical_query, lines, ";".join(signed), body_hash])
    x_date = headers["x-date"]
    scope = f"{x_date[:8]}/{region}/{service}/request"
    to_sign = f"HMAC-SHA256\n{x_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = secret.encode()
    for part in (x_date[:8], region, service, "request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _unflatten(pairs: dict[str, str]) -> dict[str, Any]:
    """`Tags.1.Key=a` → `{"Tags": [{"Key": "a"}]}`: indexed parameters back into lists, ordered by index."""
    root: dict[Any, Any] = {}
    for key, value in pairs.items():
        parts = [int(p) if p.isdigit() else p for p in key.split(".")]
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise _Fail(400, "InvalidParameter", f"The parameter {key} is malformed.")
        node[parts[-1]] = value

    def lists(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if node and all(isinstance(k, int) for k in node):
            return [lists(node[k]) for k in sorted(node)]
        return {k: lists(v) for k, v in node.items()}

    return lists(root)


def _int(params: dict[str, Any], name: str, default: int | None = None) -> int:
    if name not in params:
        if default is None:
            raise _Fail(400, f"MissingParameter.{name}", f"The parameter {name} is required.")
        return default
    try:
        return int(params[name])
    except (TypeError, ValueError):
        raise _Fail(400, "InvalidParameter", f"The parameter {name} must be an integer.") from None


def _str(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise _Fail(400, f"MissingParameter.{name}", f"The parameter {name} is required.")
    return value


def _user_data(params: dict[str, Any]) -> str:
    try:
        return base64.b64decode(params.get("UserData", ""), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, TypeError):
        raise _Fail(400, "InvalidParameter", "The UserData must be base64.") from None


def _strings(params: dict[str, Any], name: str) -> list[str]:
    value = params.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Fail(400, "InvalidParameter", f"The parameter {name} must be a list ({name}.N).")
    return value


class FakeVolcengine(LoopbackServer):
    """Volcengine's ECS + VPC OpenAPI on `host:port` (0: a free port); see the module docstring.

    `credentials`: access key → secret key. One subnet (`subnet_id`, `subnet_cidr`, zone `zone_id`, VPC
    `vpc_id`), one security group (`security_group_id`, no ingress rule, all egress) and one image
    (`image_id`) exist at the start; `subnets`, `security_groups` (id → rule dicts as
    DescribeSecurityGroupAttributes answers them) and `images` may be changed at any time."""

    def __init__(
        self,
        *,
        credentials: dict[str, str] | None = None,
        region: str = "cn-beijing",
        host: str = "127.0.0.1",
        port: int = 0,
        image_id: str = "image-guirl-desktop",
        subnet_id: str = "subnet-guirl",
        subnet_cidr: str = "10.0.1.0/24",
        zone_id: str = "cn-beijing-a",
        vpc_id: str = "vpc-guirl",
        security_group_id: str = "sg-guirl",
        boot_delay_s: float = 0.2,
        stop_delay_s: float = 0.1,
        rebuild_delay_s: float = 0.2,
        delete_delay_s: float = 0.1,
        seed: int = 0,
    ) -> None:
        self.credentials = dict(credentials or {"AKLTFAKEVOLCACCESSKEY": "FAKEVOLCSECRETKEY"})
        self.region, self.host, self.port = region, host, port
        self.images = {image_id}
        self.subnets = {subnet_id: FakeSubnet(subnet_cidr, zone_id, vpc_id)}
        self.security_groups: dict[str, list[dict[str, Any]]] = {
            security_group_id: [self._rule("egress", "all", -1, -1, "0.0.0.0/0")]
        }
        self.sg_vpc = {security_group_id: vpc_id}
        self.boot_delay_s, self.stop_delay_s = boot_delay_s, stop_delay_s
        self.rebuild_delay_s, self.delete_delay_s = rebuild_delay_s, delete_delay_s
        self.seed = seed
        self.throttle_rate = 0.0
        self.throttle_after_rate = 0.0
        self.throttle_status = 429
        self.error_rate = 0.0
        self.clock_skew_s = 0.0
        self.rebuild_leaves_stopped = False
        self.page_limit: int | None = None
        self.on_replace_root: Callable[[str], None] | None = None
        self.instances: dict[str, FakeInstance] = {}
        self.calls: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()
        self.replaced: Counter[str] = Counter()
        self._tokens: dict[tuple[str, str], tuple[str, Any]] = {}
        self._nth: Counter[str] = Counter()
        self._seq = itertools.count(1)
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        """What the SDK's `Configuration.host` takes (with `scheme = "http"`)."""
        return f"{self.host}:{self.port}"

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/", self._handle)

    # -- what tests look at and set up ------------------------------------------------------------------

    def live(self) -> list[FakeInstance]:
        """Instances that exist now (DELETING ones included until they are gone)."""
        self._advance(time.time())
        return list(self.instances.values())

    def allow(self, protocol: str, port_start: int, port_end: int, cidr: str, sg: str = "") -> None:
        """Add an ingress rule to security group `sg` (default: the first one) as a console user would."""
        sg = sg or next(iter(self.security_groups))
        self.security_groups[sg].append(self._rule("ingress", protocol, port_start, port_end, cidr))

    @staticmethod
    def _rule(direction: str, protocol: str, start: int, end: int, cidr: str, **extra: Any) -> dict[str, Any]:
        return {
            "Direction": direction,
            "Protocol": protocol,
            "PortStart": start,
            "PortEnd": end,
            "CidrIp": cidr,
            "SourceGroupId": extra.get("SourceGroupId", ""),
            "PrefixListId": extra.get("PrefixListId", ""),
            "Policy": extra.get("Policy", "accept"),
            "Priority": extra.get("Priority", 1),
            "Description": extra.get("Description", ""),
            "SecurityGroupRuleId": f"sgr-{uuid.uuid4().hex[:16]}",
            "CreationTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    # -- the envelope -----------------------------------------------------------------------------------

    def _reply(
        self, job: _Job, status: int = 200, result: Any = None, error: _Fail | None = None
    ) -> web.Response:
        rid = dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S") + uuid.uuid4().hex[:18].upper()
        meta: dict[str, Any] = {
            "RequestId": rid,
            "Action": job.action,
            "Version": VERSION,
            "Service": job.service,
            "Region": job.region,
        }
        body: dict[str, Any] = {"ResponseMetadata": meta}
        if error is not None:
            meta["Error"] = {"Code": error.code, "Message": error.message}
        else:
            body["Result"] = result if result is not None else {}
        return web.Response(status=status, body=json.dumps(body), content_type="application/json")

    async def _handle(self, request: web.Request) -> web.Response:
        raw = request.rel_url.raw_query_string
        pairs = dict(parse_qsl(raw, keep_blank_values=True))
        job = _Job(pairs.pop("Action", ""), "", self.region)
        if job.action:
            self.calls[job.action] += 1
        try:
            self._authenticate(job, request, raw, await request.read())
            if pairs.pop("Version", "") != VERSION or job.action not in ECS_ACTIONS | VPC_ACTIONS:
                raise _Fail(404, "InvalidActionOrVersion", f"Could not find operation {job.action}.")
            if job.service != ("ecs" if job.action in ECS_ACTIONS else "vpc"):
                raise _Fail(404, "InvalidActionOrVersion", f"{job.action} is not a {job.service} action.")
            job.params = _unflatten(pairs)
            n = self._nth[job.action]
            self._nth[job.action] += 1
            draw = random.Random(f"{self.seed}/{job.action}/{n}")
            before, error, after = draw.random(), draw.random(), draw.random()
            if before < self.throttle_rate:
                self.throttled[job.action] += 1
                raise _Fail(self.throttle_status, *THROTTLE)
            if error < self.error_rate:
                raise _Fail(
                    500, "InternalError", "The request processing has failed due to some unknown error."
                )
            result = self._idempotent(job)
            if after < self.throttle_after_rate:
                self.throttled[job.action] += 1
                raise _Fail(self.throttle_status, *THROTTLE)
            return self._reply(job, result=result)
        except _Fail as exc:
            return self._reply(job, exc.status, error=exc)

    def _authenticate(self, job: _Job, request: web.Request, raw_query: str, body: bytes) -> None:
        """Doc §3.2: the signature recomputed from the request as received; `job` gets its scope's service
        and region."""
        auth = request.headers.get("Authorization", "")
        if not auth:
            raise _Fail(401, "MissingAuthenticationToken", "The request must carry an Authorization header.")
        try:
            algo, rest = auth.split(" ", 1)
            fields = dict(p.strip().split("=", 1) for p in rest.split(","))
            ak, date, region, service, term = fields["Credential"].split("/")
            signed = fields["SignedHeaders"].split(";")
            given = fields["Signature"]
        except (ValueError, KeyError):
            raise _Fail(401, "MissingSignature", "The Authorization header is malformed.") from None
        job.service, job.region = service, region
        if algo != "HMAC-SHA256" or term != "request":
            raise _Fail(401, "SignatureDoesNotMatch", "The signature algorithm or scope is not supported.")
        secret = self.credentials.get(ak)
        if secret is None:
            raise _Fail(401, "InvalidAccessKey", "The specified access key is not valid.")
        x_date = request.headers.get("X-Date", "")
        try:
            stamp = dt.datetime.strptime(x_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC).timestamp()
        except ValueError:
            raise _Fail(400, "InvalidTimestamp", "The X-Date header is missing or malformed.") from None
        if abs(time.time() + self.clock_skew_s - stamp) > MAX_SKEW_S or date != x_date[:8]:
            raise _Fail(400, "InvalidTimestamp", "The request has expired (X-Date is too far from now).")
        headers = {k.lower(): v for k, v in request.headers.items()}
        missing = [name for name in signed if name not in headers]
        if missing:
            raise _Fail(401, "SignatureDoesNotMatch", f"The signed header {missing[0]} is missing.")
        expected = signature(secret, region, service, "GET", request.path, raw_query, headers, signed, body)
        if not hmac.compare_digest(expected, given):
            raise _Fail(401, "SignatureDoesNotMatch", "The request signature we calculated does not match.")
        if region != self.region:
            raise _Fail(404, "ServiceNotFound", f"The service is not available in region {region}.")

    def _idempotent(self, job: _Job) -> Any:
        token = job.params.get("ClientToken")
        if not token:
            return self._act(job)
        if not isinstance(token, str) or len(token) > 64 or not token.isascii():
            raise _Fail(400, "InvalidClientToken.Malformed", "The ClientToken is malformed.")
        args = json.dumps({k: v for k, v in job.params.items() if k != "ClientToken"}, sort_keys=True)
        remembered = self._tokens.get((job.action, token))
        if remembered is not None:
            if remembered[0] != args:
                raise _Fail(
                    400, "IdempotentParameterMismatch", "The ClientToken was used with other arguments."
                )
            return remembered[1]
        result = self._act(job)
        self._tokens[(job.action, token)] = (args, result)
        return result

    def _act(self, job: _Job) -> Any:
        now = time.time()
        self._advance(now)
        return getattr(self, f"_{job.action}")(job.params, now)

    # -- instances --------------------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        for inst in list(self.instances.values()):
            if inst.change is not None and now >= inst.change[0]:
                inst.status, inst.change = inst.change[1], None
                if not inst.status:
                    del self.instances[inst.id]

    def _instance(self, iid: str) -> FakeInstance:
        inst = self.instances.get(iid)
        if inst is None:
            raise _not_found("Instance", iid)
        return inst

    def _free_ip(self, subnet: FakeSubnet) -> str:
        used = {i.ip for i in self.instances.values()}
        hosts = ipaddress.ip_network(subnet.cidr).hosts()
        for ip in itertools.islice(hosts, 3, None):  # the first addresses: the gateway and reserved ones
            if str(ip) not in used:
                return str(ip)
        raise _Fail(400, "InsufficientIpAddress", f"The subnet {subnet.cidr} has no free address.")

    def _RunInstances(self, p: dict[str, Any], now: float) -> Any:
        image, zone, name = _str(p, "ImageId"), _str(p, "ZoneId"), _str(p, "InstanceName")
        itype = _str(p, "InstanceTypeId") if "InstanceType" not in p else _str(p, "InstanceType")
        if image not in self.images:
            raise _not_found("Image", image)
        nics = p.get("NetworkInterfaces")
        if not isinstance(nics, list) or not nics or not isinstance(nics[0], dict):
            raise _Fail(
                400, "MissingParameter.NetworkInterfaces", "The primary network interface is required."
            )
        subnet_id = _str(nics[0], "SubnetId")
        subnet = self.subnets.get(subnet_id)
        if subnet is None:
            raise _not_found("Subnet", subnet_id)
        if zone != subnet.zone:
            raise _Fail(400, "InvalidParameter", f"The subnet {subnet_id} is not in zone {zone}.")
        groups = _strings(nics[0], "SecurityGroupIds")
        for sg in groups or ["(none)"]:
            if sg not in self.security_groups:
                raise _not_found("SecurityGroup", sg)
        tags: dict[str, str] = {}
        for tag in p.get("Tags", []):
            key = tag.get("Key", "") if isinstance(tag, dict) else ""
            if not key or key.startswith(("volc:", "sys:")) or key in tags:
                raise _Fail(400, "InvalidParameter", f"The tag key {key!r} is not valid.")
            tags[key] = tag.get("Value", "")
        if len(tags) > 50:
            raise _Fail(400, "InvalidParameter", "An instance may carry at most 50 tags.")
        user_data = _user_data(p)
        count = _int(p, "Count", 1)
        if not 1 <= count <= 100:
            raise _Fail(400, "InvalidParameter", "The Count must be 1..100.")
        ids = []
        for _ in range(count):
            iid = f"i-{uuid.uuid4().hex[:20]}"
            self.instances[iid] = FakeInstance(
                iid, name, "CREATING", zone, image, itype, subnet_id, subnet.vpc, groups,
                self._free_ip(subnet), dict(tags), user_data, now,
                eip=any(k.startswith("EipAddress") for k in p), seq=next(self._seq),
                change=(now + self.boot_delay_s, "RUNNING"),
            )  # fmt: skip
            ids.append(iid)
        return {"InstanceIds": ids}

    def _DescribeInstances(self, p: dict[str, Any], now: float) -> Any:
        limit = _int(p, "MaxResults", 10)
        if not 1 <= limit <= 100:
            raise _Fail(400, "InvalidParameter", "The MaxResults must be 1..100.")
        ids = set(_strings(p, "InstanceIds"))
        if len(ids) > 100:
            raise _Fail(400, "InvalidParameter", "At most 100 InstanceIds.")
        token = p.get("NextToken", "")
        try:
            after = int(base64.urlsafe_b64decode(token.encode()).decode()) if token else 0
        except (ValueError, binascii.Error):
            raise _Fail(400, "InvalidParameter", "The NextToken is not valid.") from None
        filters = [
            (f.get("Key", ""), f.get("Values", [])) for f in p.get("TagFilters", []) if isinstance(f, dict)
        ]
        found = [
            i
            for i in sorted(self.instances.values(), key=lambda i: i.seq)
            if i.seq > after
            and (not ids or i.id in ids)
            and (not p.get("Status") or i.status == p["Status"])
            and all(k in i.tags and (not vs or i.tags[k] in vs) for k, vs in filters)
        ]
        page = found[: min(limit, self.page_limit or limit)]
        more = len(found) > len(page)
        return {
            "Instances": [self._describe(i) for i in page],
            "NextToken": base64.urlsafe_b64encode(str(page[-1].seq).encode()).decode() if more else "",
            "TotalCount": len(found),
        }

    def _describe(self, i: FakeInstance) -> dict[str, Any]:
        stamp = dt.datetime.fromtimestamp(i.created, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        nic = {
            "NetworkInterfaceId": f"eni-{i.id[2:]}",
            "Type": "primary",
            "PrimaryIpAddress": i.ip,
            "SubnetId": i.subnet,
            "VpcId": i.vpc,
            "SecurityGroupIds": i.security_groups,
            "MacAddress": "00:16:3e:" + ":".join(i.id[2:8][k : k + 2] for k in (0, 2, 4)),
        }
        return {
            "InstanceId": i.id,
            "InstanceName": i.name,
            "Hostname": i.name,
            "Status": i.status,
            "ZoneId": i.zone,
            "VpcId": i.vpc,
            "InstanceTypeId": i.type,
            "ImageId": i.image,
            "InstanceChargeType": "PostPaid",
            "DeletionProtection": False,
            "CreatedAt": stamp,
            "UpdatedAt": stamp,
            "NetworkInterfaces": [nic],
            "EipAddress": {"AllocationId": "", "IpAddress": "203.0.113.7" if i.eip else ""},
            "Tags": [{"Key": k, "Value": v} for k, v in i.tags.items()],
        }

    def _delete(self, iid: str, now: float) -> None:
        inst = self._instance(iid)
        if inst.status != "DELETING":
            inst.status, inst.change = "DELETING", (now + self.delete_delay_s, "")

    def _DeleteInstance(self, p: dict[str, Any], now: float) -> Any:
        self._delete(_str(p, "InstanceId"), now)
        return {}

    def _DeleteInstances(self, p: dict[str, Any], now: float) -> Any:
        ids = _strings(p, "InstanceIds")
        if not ids or len(ids) > 100:
            raise _Fail(400, "InvalidParameter", "InstanceIds.N must name 1..100 instances.")
        details: list[dict[str, Any]] = []
        for iid in ids:
            try:
                self._delete(iid, now)
                details.append({"InstanceId": iid})
            except _Fail as exc:
                details.append({"InstanceId": iid, "Error": {"Code": exc.code, "Message": exc.message}})
        return {"OperationDetails": details}

    def _StopInstance(self, p: dict[str, Any], now: float) -> Any:
        inst = self._instance(_str(p, "InstanceId"))
        if inst.status != "RUNNING":
            raise _bad_status(inst.id, inst.status)
        inst.status, inst.change = "STOPPING", (now + self.stop_delay_s, "STOPPED")
        return {}

    def _StartInstance(self, p: dict[str, Any], now: float) -> Any:
        inst = self._instance(_str(p, "InstanceId"))
        if inst.status != "STOPPED":
            raise _bad_status(inst.id, inst.status)
        inst.status, inst.change = "STARTING", (now + self.stop_delay_s, "RUNNING")
        return {}

    def _ReplaceSystemVolume(self, p: dict[str, Any], now: float) -> Any:
        inst, image = self._instance(_str(p, "InstanceId")), _str(p, "ImageId")
        if image not in self.images:
            raise _not_found("Image", image)
        if inst.status != "STOPPED":
            raise _bad_status(inst.id, inst.status)
        after = "STOPPED" if self.rebuild_leaves_stopped else "RUNNING"
        inst.status, inst.change, inst.image = "REBUILDING", (now + self.rebuild_delay_s, after), image
        if "UserData" in p:  # a new boot script for the new disk
            inst.user_data = _user_data(p)
        self.replaced[inst.id] += 1
        if self.on_replace_root is not None:
            self.on_replace_root(inst.id)
        return {}

    # -- VPC --------------------------------------------------------------------------------------------

    def _DescribeSubnetAttributes(self, p: dict[str, Any], now: float) -> Any:
        sid = _str(p, "SubnetId")
        subnet = self.subnets.get(sid)
        if subnet is None:
            raise _not_found("Subnet", sid)
        net = ipaddress.ip_network(subnet.cidr)
        return {
            "SubnetId": sid,
            "SubnetName": sid,
            "ZoneId": subnet.zone,
            "VpcId": subnet.vpc,
            "CidrBlock": subnet.cidr,
            "Status": "Available",
            "TotalIpv4Count": net.num_addresses,
            "AvailableIpAddressCount": net.num_addresses - 3 - len(self.instances),
        }

    def _group(self, p: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        sg = _str(p, "SecurityGroupId")
        if sg not in self.security_groups:
            raise _not_found("SecurityGroup", sg)
        return sg, self.security_groups[sg]

    def _DescribeSecurityGroupAttributes(self, p: dict[str, Any], now: float) -> Any:
        sg, rules = self._group(p)
        wanted = {k: p[k] for k in ("Direction", "Protocol", "CidrIp") if p.get(k)}
        return {
            "SecurityGroupId": sg,
            "SecurityGroupName": sg,
            "VpcId": self.sg_vpc.get(sg, ""),
            "Status": "Available",
            "Type": "default",
            "Permissions": [r for r in rules if all(r.get(k) == v for k, v in wanted.items())],
        }

    def _ingress(self, p: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        _, rules = self._group(p)
        protocol = _str(p, "Protocol").lower()
        start, end = _int(p, "PortStart"), _int(p, "PortEnd")
        if protocol not in _PROTOCOLS:
            raise _Fail(400, "InvalidParameter", f"The Protocol {protocol} is not valid.")
        ports_ok = 1 <= start <= end <= 65535 if protocol in ("tcp", "udp") else start == end == -1
        if not ports_ok:
            raise _Fail(400, "InvalidParameter", f"The port range {start}/{end} is not valid for {protocol}.")
        source = {k: p.get(k, "") for k in ("CidrIp", "SourceGroupId", "PrefixListId")}
        if not any(source.values()):
            raise _Fail(
                400, "MissingParameter.CidrIp", "One of CidrIp, SourceGroupId, PrefixListId is required."
            )
        if source["CidrIp"]:
            try:
                ipaddress.ip_network(source["CidrIp"], strict=False)
            except ValueError:
                raise _Fail(400, "InvalidParameter", f"The CidrIp {source['CidrIp']} is not valid.") from None
        priority = _int(p, "Priority", 1)
        policy = p.get("Policy", "accept") or "accept"
        if not 1 <= priority <= 100 or policy not in ("accept", "drop"):
            raise _Fail(400, "InvalidParameter", "The Priority must be 1..100 and the Policy accept or drop.")
        rule = self._rule(
            "ingress", protocol, start, end, source["CidrIp"], SourceGroupId=source["SourceGroupId"],
            PrefixListId=source["PrefixListId"], Policy=policy, Priority=priority,
            Description=p.get("Description", ""),
        )  # fmt: skip
        return rules, rule

    @staticmethod
    def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
        keys = (
            "Direction",
            "Protocol",
            "PortStart",
            "PortEnd",
            "CidrIp",
            "SourceGroupId",
            "PrefixListId",
            "Policy",
        )
        return all(a.get(k) == b.get(k) for k in keys)

    def _AuthorizeSecurityGroupIngress(self, p: dict[str, Any], now: float) -> Any:
        rules, rule = self._ingress(p)
        if any(self._same(r, rule) for r in rules):
            raise _Fail(400, "InvalidSecurityRule.Conflict", "The same security group rule already exists.")
        rules.append(rule)
        return {}

    def _RevokeSecurityGroupIngress(self, p: dict[str, Any], now: float) -> Any:
        rules, rule = self._ingress(p)
        rules[:] = [r for r in rules if not self._same(r, rule)]
        return {}
