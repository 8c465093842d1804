"""Volcengine ECS desktops: the `CloudAPI` adapter over the official SDK (the lifecycle is
`guirl/vmpool/cloud.py`'s; `docs/cloud/volcengine-ecs.md` is the reference for every call made here).

- **Retries are guirl's, not the SDK's.** The SDK's own retry (`auto_retry`) is off: a throttled call
  (HTTP 429, or `AccountFlowLimitExceeded` / `FlowLimitExceeded` whatever the status) becomes
  `CloudError(throttled=True)`, a 5xx or a failed connection `CloudError(retryable=True)`, and
  `CloudProvider` backs off and retries them (jittered, up to `cloud.api_attempts`, counted in its
  metrics). Two layers would multiply the attempts (4 x 8) and hide throttling from the metrics, and the
  SDK would not retry a throttling code that came with any status but 429 anyway (doc §4.3, §8).
- **Idempotent launches.** The provider's client token goes to RunInstances as `ClientToken` (hashed to a
  deterministic 64-character one when longer): a launch retried after the cloud acted returns the first
  instance. Instances get tags at creation, base64 user data, no public IP (no `EipAddress`), PostPaid
  billing (a PrePaid instance cannot be deleted early) and no deletion protection.
- **Resets** stop the instance (forced: its disk is about to be replaced), replace the system volume from
  `image_id` once it is STOPPED (the docs ask for it; Terraform does the same), and wait until it runs again,
  starting it if the rebuild left it stopped. The new disk gets the boot script again with its shutdown
  timer at what is left of the instance's TTL (tags `guirl:created` + `guirl:ttl`), not a fresh TTL. A
  reset is resumable: a retry after a failure picks up where the last attempt stopped, with the same client
  tokens, so no step is done twice.
- **Credentials** live in this adapter's own `Configuration` and `ApiClient` (the SDK's global default
  configuration is never set). The SDK logs request headers (the `Authorization` line names the access key)
  only at debug level, which stays off; any error text is scrubbed of both keys before it becomes a
  `CloudError`, and no SDK exception is chained to one.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import ipaddress
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
import volcenginesdkcore
import volcenginesdkecs as ecs
import volcenginesdkvpc as vpc
from volcenginesdkcore.rest import ApiException

from guirl.vmpool.cloud import TAG_CREATED, TAG_POOL, TAG_RUN, TAG_TTL, CloudError, Instance
from guirl.vmpool.cloud import user_data as ttl_script

THROTTLE_CODES = frozenset({"AccountFlowLimitExceeded", "FlowLimitExceeded"})
"""Volcengine's "slow down" codes (API-level and account-level flow control)."""
TRANSIENT_CODES = frozenset({"InternalError", "InternalServiceError", "ServiceUnavailableTemp"})
"""Codes of a call that failed in passing."""
NOT_FOUND = "InvalidInstance.NotFound"
STATES = {
    "CREATING": "pending",
    "STARTING": "pending",
    "REBOOTING": "pending",
    "REBUILDING": "pending",
    "RESIZING": "pending",
    "RUNNING": "running",
    "STOPPING": "stopping",
    "STOPPED": "stopped",
    "DELETING": "terminating",
    "ERROR": "error",
}
"""Volcengine's instance statuses → the provider's; an unknown one counts as pending (still live)."""
_BATCH = 100  # DescribeInstances / DeleteInstances take at most 100 ids


@dataclass
class _Reset:
    """A reset under way: its client tokens, and the step a retry resumes at."""

    token: str
    step: str = "stop"  # stop | replace | wait
    user_data: str | None = None


class VolcengineCloud:
    """Volcengine ECS through `volcengine-python-sdk` for `CloudProvider` (see `CloudAPI` and the module
    docstring): instances in `cfg.subnet_id` behind `cfg.security_group_id`, from `cfg.image_id`.

    `wait_s` bounds one root-volume replacement; `poll_s` is the first interval between its status polls
    (then backing off to 5 s); `start_grace_s`: how long an instance may stay STOPPED after
    ReplaceSystemVolume, no rebuild seen, before it is started; `page_size` is DescribeInstances'
    MaxResults; `connect_timeout_s` and `read_timeout_s` bound every HTTP request."""

    name = "volcengine"

    def __init__(
        self,
        cfg: Any,
        region: str,
        *,
        wait_s: float = 900.0,
        poll_s: float = 0.5,
        start_grace_s: float = 30.0,
        page_size: int = 100,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 30.0,
    ) -> None:
        missing = [
            f"cloud.volcengine.{k}"
            for k in ("access_key", "secret_key", "image_id", "subnet_id", "security_group_id")
            if not getattr(cfg, k)
        ]
        if not region:
            missing.append("env.region")
        if missing:
            raise ValueError(f"the volcengine provider needs {', '.join(missing)}")
        self.cfg, self.region = cfg, region
        self.wait_s, self.poll_s, self.page_size = wait_s, poll_s, page_size
        self.start_grace_s = start_grace_s
        self._secrets = [s for s in (cfg.access_key, cfg.secret_key) if s]
        conf = volcenginesdkcore.Configuration()  # a copy of the SDK's default: ours alone from here
        conf.ak, conf.sk, conf.session_token, conf.region = cfg.access_key, cfg.secret_key, "", region
        conf.credential_provider = None
        conf.host = cfg.host or None  # None: the SDK's endpoint for the region (open.volcengineapi.com)
        conf.scheme = cfg.scheme
        conf.connect_timeout, conf.read_timeout = connect_timeout_s, read_timeout_s
        conf.auto_retry, conf.num_max_retries = False, 0  # CloudProvider retries (module docstring)
        conf.debug = False  # at debug level the SDK logs every request header
        self._conf = conf
        client = volcenginesdkcore.ApiClient(conf)
        self._ecs, self._vpc = ecs.ECSApi(client), vpc.VPCApi(client)
        self._zone = cfg.zone_id
        self._resets: dict[str, _Reset] = {}
        self._lock = threading.Lock()

    # -- calls and their errors -------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _send(self, call: Callable[..., Any], model: type, **fields: Any) -> Any:
        """One SDK call with a request model built from `fields`; every failure a `CloudError`."""
        action = "".join(w.title() for w in call.__name__.split("_"))
        try:
            return call(model(**fields, _configuration=self._conf))
        except ApiException as exc:
            error = _api_error(exc)
            status = exc.status or 0
            code = str(error.get("Code") or (f"HTTP{status}" if status else "TransportError"))
            message = str(error.get("Message") or exc.reason or "")
            throttled = status == 429 or code in THROTTLE_CODES
            retryable = throttled or status >= 500 or code in TRANSIENT_CODES
            text = f"volcengine {action}: {code} (HTTP {status}): {message}"
            raise CloudError(self._scrub(text), code=code, throttled=throttled, retryable=retryable) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # the connection failed or timed out
            text = f"volcengine {action}: {type(exc).__name__}: {exc}"
            raise CloudError(self._scrub(text), code="ConnectionError", retryable=True) from None
        except ValueError as exc:  # the SDK's client-side validation
            raise CloudError(self._scrub(f"volcengine {action}: {exc}"), code="InvalidParameter") from None

    # -- CloudAPI -------------------------------------------------------------------------------------

    def launch(self, *, token: str, tags: dict[str, str], user_data: str) -> str:
        if len(token) > 64 or not token.isascii():  # Volcengine's ClientToken: ASCII, at most 64 characters
            token = "guirl-" + hashlib.sha256(token.encode()).hexdigest()[:58]
        name = re.sub(r"[^A-Za-z0-9._-]", "-", f"guirl-{tags.get(TAG_RUN, '')}-{tags.get(TAG_POOL, '')}")
        nic = ecs.NetworkInterfaceForRunInstancesInput(
            subnet_id=self.cfg.subnet_id,
            security_group_ids=[self.cfg.security_group_id],
            _configuration=self._conf,
        )
        result = self._send(
            self._ecs.run_instances,
            ecs.RunInstancesRequest,
            client_token=token,
            count=1,
            image_id=self.cfg.image_id,
            instance_type_id=self.cfg.instance_type,
            zone_id=self._zone_id(),
            instance_name=name[:128],
            instance_charge_type="PostPaid",
            deletion_protection=False,
            network_interfaces=[nic],
            tags=[
                ecs.TagForRunInstancesInput(key=k, value=v, _configuration=self._conf)
                for k, v in tags.items()
            ],
            user_data=base64.b64encode(user_data.encode()).decode(),
        )
        ids = list(result.instance_ids or [])
        if len(ids) != 1:
            raise CloudError(
                f"volcengine RunInstances answered {len(ids)} instance ids for one", code="Unexpected"
            )
        return ids[0]

    def _zone_id(self) -> str:
        """The configured zone, else the subnet's (RunInstances needs one; asked once)."""
        if not self._zone:
            subnet = self._send(
                self._vpc.describe_subnet_attributes,
                vpc.DescribeSubnetAttributesRequest,
                subnet_id=self.cfg.subnet_id,
            )
            self._zone = subnet.zone_id or ""
        return self._zone

    def describe(self, *, ids: list[str] | None = None, tags: dict[str, str] | None = None) -> list[Instance]:
        if ids is not None:
            found: list[Instance] = []
            for start in range(0, len(ids), _BATCH):
                found += self._describe_ids(ids[start : start + _BATCH])
            return found
        filters = [
            ecs.TagFilterForDescribeInstancesInput(
                key=k, values=None if v == "*" else [v], _configuration=self._conf
            )
            for k, v in (tags or {}).items()
        ]
        found = list(self._pages(tag_filters=filters or None))
        # the same filter again here, in case the cloud reads a key-only filter otherwise (doc §5.2)
        return [
            i for i in found if all(k in i.tags and v in ("*", i.tags[k]) for k, v in (tags or {}).items())
        ]

    def _describe_ids(self, ids: list[str]) -> list[Instance]:
        return [_instance(raw) for raw in self._raw_ids(ids)]

    def _raw_ids(self, ids: list[str]) -> list[Any]:
        if not ids:
            return []
        try:
            return list(self._raw_pages(instance_ids=ids))
        except CloudError as exc:  # unknown ids are expected to be left out, not refused (doc §5.2, §8)
            if exc.code != NOT_FOUND:
                raise
            return [] if len(ids) == 1 else [i for one in ids for i in self._raw_ids([one])]

    def _pages(self, **filters: Any) -> Iterator[Instance]:
        return (_instance(raw) for raw in self._raw_pages(**filters))

    def _raw_pages(self, **filters: Any) -> Iterator[Any]:
        token, seen = None, set()
        while True:
            page = self._send(
                self._ecs.describe_instances,
                ecs.DescribeInstancesRequest,
                max_results=self.page_size,
                next_token=token,
                **filters,
            )
            yield from page.instances or []
            token = page.next_token
            if not token or token in seen:
                return
            seen.add(token)

    def terminate(self, ids: list[str]) -> None:
        with self._lock:  # a reset of an instance that goes is over
            for iid in ids:
                self._resets.pop(iid, None)
        failed: dict[str, str] = {}
        for start in range(0, len(ids), _BATCH):
            batch = ids[start : start + _BATCH]
            try:
                result = self._send(
                    self._ecs.delete_instances, ecs.DeleteInstancesRequest, instance_ids=batch
                )
            except CloudError as exc:
                if exc.code != NOT_FOUND:
                    raise
                for one in batch:  # the whole call refused for an unknown id: one at a time
                    try:
                        self._send(self._ecs.delete_instance, ecs.DeleteInstanceRequest, instance_id=one)
                    except CloudError as single:
                        if single.code != NOT_FOUND:
                            failed[one] = single.code
                continue
            for item in result.operation_details or []:
                code = item.error.code if item.error is not None else ""
                if code and code != NOT_FOUND:
                    failed[item.instance_id] = code
        if failed:  # refused (e.g. a status that cannot be deleted yet): fine if it is going anyway
            left = [
                i for i in self.describe(ids=list(failed)) if i.state not in ("terminating", "terminated")
            ]
            if left:
                codes = sorted({failed[i.id] for i in left})
                raise CloudError(
                    f"volcengine DeleteInstances refused {[i.id for i in left]}: {', '.join(codes)}",
                    code=codes[0],
                    retryable=True,  # an instance still being created or stopped can be deleted later
                )

    def replace_root(self, instance_id: str) -> None:
        """Stop, ReplaceSystemVolume, wait until it runs again (blocking; resumable: the module docstring)."""
        with self._lock:
            job = self._resets.setdefault(instance_id, _Reset(token=uuid.uuid4().hex[:24]))
        try:
            self._reset(instance_id, job)
        except CloudError as exc:
            if exc.retryable:
                raise  # the provider retries: this reset resumes where it stopped
            with self._lock:
                self._resets.pop(instance_id, None)
            raise
        with self._lock:
            self._resets.pop(instance_id, None)

    def _reset(self, instance_id: str, job: _Reset) -> None:
        deadline = time.monotonic() + self.wait_s
        if job.step == "stop":
            stop = self._step(
                self._ecs.stop_instance, ecs.StopInstanceRequest, instance_id, job, "stop", force_stop=True
            )
            stopped = self._wait(instance_id, deadline, "STOPPED", {"RUNNING": stop})
            job.user_data = _boot_script(stopped)  # fixed now: a retry must send the same parameters
            job.step = "replace"
        if job.step == "replace":
            self._send(
                self._ecs.replace_system_volume,
                ecs.ReplaceSystemVolumeRequest,
                instance_id=instance_id,
                image_id=self.cfg.image_id,
                user_data=job.user_data,
                client_token=f"{job.token}-rsv",
            )
            job.step = "wait"
        start = self._step(self._ecs.start_instance, ecs.StartInstanceRequest, instance_id, job, "start")
        since, rebuilt = time.monotonic(), [False]

        def start_once_rebuilt(status: str) -> None:
            # STOPPED right after the call may be the rebuild not begun yet; after REBUILDING (or a while) it
            # is a rebuild that left the instance stopped
            rebuilt[0] = rebuilt[0] or status == "REBUILDING"
            if status == "STOPPED" and (rebuilt[0] or time.monotonic() - since > self.start_grace_s):
                start()

        act = {"REBUILDING": start_once_rebuilt, "STOPPED": start_once_rebuilt}
        self._wait(instance_id, deadline, "RUNNING", act)

    def _step(
        self, call: Callable[..., Any], model: type, iid: str, job: _Reset, what: str, **extra: Any
    ) -> Callable[..., None]:
        """A step of a reset, sent whenever the instance is seen in the status it acts on."""

        def send(*_: Any) -> None:
            try:  # the same token every time: a replay of a step the cloud already did does nothing
                self._send(call, model, instance_id=iid, client_token=f"{job.token}-{what}", **extra)
            except CloudError as exc:
                if exc.code != "InvalidInstanceStatus" and not exc.retryable:
                    raise  # the status moved on meanwhile, or a passing failure: the next poll decides

        return send

    def _wait(self, iid: str, deadline: float, want: str, act: dict[str, Callable[[str], None]]) -> Any:
        """Poll the instance's status (backing off from `poll_s` to 5 s) until it is `want` (its description
        then), calling `act[status](status)` on the way; a passing failure of a poll is only waited out."""
        delay = self.poll_s
        while True:
            try:
                found = self._raw_ids([iid])
                if not found:
                    raise CloudError(f"volcengine instance {iid} is gone during its reset", code=NOT_FOUND)
                status = (found[0].status or "").upper()
                if status == want:
                    return found[0]
                if status in ("ERROR", "DELETING"):
                    raise CloudError(f"volcengine instance {iid} is {status} during its reset", code=status)
                if status in act:
                    act[status](status)
            except CloudError as exc:
                if not exc.retryable:
                    raise
            if time.monotonic() > deadline:
                raise CloudError(
                    f"volcengine instance {iid} not {want} within {self.wait_s:g} s of its reset",
                    code="Timeout",
                )
            time.sleep(delay)  # a status poll's backoff
            delay = min(delay * 1.5, 5.0)

    def check_network(self, cidr: str, port: int) -> None:
        """Refuse a rule opening `port` wider than `cidr`; add one for `cidr` when no rule lets it in."""
        cluster = ipaddress.ip_network(cidr, strict=False)
        sg = self.cfg.security_group_id
        if self._reaches(sg, cluster, port):
            return
        try:
            self._send(
                self._vpc.authorize_security_group_ingress,
                vpc.AuthorizeSecurityGroupIngressRequest,
                security_group_id=sg,
                protocol="tcp",
                port_start=port,
                port_end=port,
                cidr_ip=str(cluster),
                policy="accept",
                priority=1,
                description="guirl: the VM server, from the cluster only",
                client_token=f"guirl-sg-{uuid.uuid4().hex}",
            )
        except CloudError as exc:  # a duplicate (another process added it meanwhile) is fine
            if exc.retryable or not self._reaches(sg, cluster, port):
                raise

    def _reaches(self, sg: str, cluster: ipaddress.IPv4Network | ipaddress.IPv6Network, port: int) -> bool:
        """Whether an ingress rule of `sg` lets `cluster` reach `port`; CloudError if one opens it wider."""
        group = self._send(
            self._vpc.describe_security_group_attributes,
            vpc.DescribeSecurityGroupAttributesRequest,
            security_group_id=sg,
        )
        reaches, wide = False, []
        for rule in group.permissions or []:
            if (rule.direction or "").lower() != "ingress" or (rule.policy or "accept").lower() != "accept":
                continue
            if not _covers(rule.protocol, rule.port_start, rule.port_end, port):
                continue
            if rule.cidr_ip:
                sources = [rule.cidr_ip]
            elif rule.prefix_list_id:  # a prefix list's ranges, when the cloud says them
                sources = list(rule.prefix_list_cidrs or []) or [f"prefix list {rule.prefix_list_id}"]
            else:
                continue  # another security group's instances: no address range
            for source in sources:
                try:
                    net = ipaddress.ip_network(source, strict=False)
                except ValueError:
                    wide.append(source)
                    continue
                if net.version != cluster.version or not net.subnet_of(cluster):  # type: ignore[arg-type]
                    wide.append(source)
                elif net == cluster:
                    reaches = True
        if wide:
            raise CloudError(
                f"volcengine security group {sg} opens port {port} (the VM server, which runs any command it "
                f"is sent) to {', '.join(wide)}, wider than cluster_cidr {cluster}: remove that ingress rule",
                code="InsecureSecurityGroup",
            )
        return reaches


def _covers(protocol: str | None, start: int | None, end: int | None, port: int) -> bool:
    if (protocol or "").lower() not in ("tcp", "all"):
        return False
    if start in (None, -1) or end in (None, -1):
        return True  # -1/-1: every port
    return start <= port <= end  # type: ignore[operator]


def _api_error(exc: ApiException) -> dict[str, Any]:
    """The `Error` of a refused call: from the body of a non-2xx reply, or the repr the SDK puts in
    `reason` for a 2xx reply carrying one (doc §4.2)."""
    try:
        if exc.body:
            body = exc.body.decode() if isinstance(exc.body, bytes) else exc.body
            return json.loads(body).get("ResponseMetadata", {}).get("Error") or {}
        if exc.reason and str(exc.reason).startswith("{"):
            error = ast.literal_eval(str(exc.reason))
            return error if isinstance(error, dict) else {}
    except (ValueError, SyntaxError, AttributeError):
        pass
    return {}


def _boot_script(raw: Any) -> str | None:
    """The boot script for a new system volume, its shutdown timer at what is left of the instance's TTL (a
    fresh disk runs its user data again: the full TTL would outlive the instance's), base64; None without
    the tags to tell."""
    tags = {t.key: t.value for t in raw.tags or []}
    try:
        expires = float(tags[TAG_CREATED]) + float(tags[TAG_TTL])
    except (KeyError, TypeError, ValueError):
        return None
    return base64.b64encode(ttl_script(max(60.0, expires - time.time())).encode()).decode()


def _instance(raw: Any) -> Instance:
    """A DescribeInstances entry as the provider sees it (the private IP: the primary interface's)."""
    nics = list(raw.network_interfaces or [])
    primary = next((n for n in nics if (n.type or "").lower() == "primary"), nics[0] if nics else None)
    return Instance(
        id=raw.instance_id,
        state=STATES.get((raw.status or "").upper(), "pending"),
        private_ip=(primary.primary_ip_address or "") if primary is not None else "",
        tags={t.key: t.value or "" for t in raw.tags or [] if t.key},
    )
