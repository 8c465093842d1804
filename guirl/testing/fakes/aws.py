"""`FakeAWSFront`: EC2's query API on loopback — moto behind a front that adds what moto lacks (see the
package docstring)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
import uuid
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode
from xml.sax.saxutils import escape

import aiohttp
from aiohttp import web

from guirl.testing.fakes._common import _serve

log = logging.getLogger(__name__)

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
ReplaceHook = Callable[[str], Awaitable[Any] | Any]
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


def _moto_server(host: str) -> Any:
    """moto's threaded server on `host` at a free port, without werkzeug's per-request access log."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class QuietHandler(MotoRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:  # the front counts calls itself
            pass

    class QuietMotoServer(ThreadedMotoServer):
        # ThreadedMotoServer._server_entry with a quiet request handler (its own is hard-wired)
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=QuietHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return QuietMotoServer(ip_address=host, port=0, verbose=False)


@dataclass
class ReplaceTask:
    """One root-volume replacement as EC2 describes it."""

    task_id: str
    instance_id: str
    image_id: str
    snapshot_id: str
    delete_replaced: bool
    token: str
    tags: dict[str, str] = field(default_factory=dict)
    state: str = "pending"
    start_time: str = field(default_factory=lambda: _iso(time.time()))
    complete_time: str = ""


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def _ec2_error(status: int, code: str, message: str) -> web.Response:
    """EC2's error body (what botocore's ec2 parser reads)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
        f"</Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    )
    return web.Response(status=status, text=body, content_type="text/xml")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


class FakeAWSFront:
    """EC2 on `endpoint_url`: a real aiohttp server on loopback forwarding EC2's query API (form POSTs with
    `Action=...`) to a moto server it runs itself, and adding what moto lacks, as EC2 behaves:

    - **RunInstances idempotency by `ClientToken`**: a repeated token is answered with the first call's
      reply (no second instance); the same token with other parameters is `IdempotentParameterMismatch`.
    - **`CreateReplaceRootVolumeTask` / `DescribeReplaceRootVolumeTasks`** with EC2's XML shapes (idempotent
      by `ClientToken`; filter `instance-id`): the task goes pending → in-progress → `replace_result`
      (default succeeded) over `replace_delay_s`, and `on_replace_root(instance_id)` (sync or async) runs
      while it is in progress; a hook that raises fails the task.
    - **Throttling**: `throttle_rate` (0..1) of calls answered `RequestLimitExceeded` (HTTP 503) before they
      reach the cloud; `throttle_after_rate` of the calls that did reach it answered the same way after it
      acted (the client never hears: exercises client tokens). Seeded by `seed`.
    - **Injected errors**: `errors[action] = (status, code, message)` answers every call of `action` so.

    `calls` counts calls by action, `throttled` the throttled ones, `replayed` the RunInstances answered from
    a client token; `requests` records each call's parameters. moto's state is process-global: the front
    resets it when it starts, so one front per process at a time. Forwarded calls go to moto one at a time
    (moto's backends are not thread-safe).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        replace_delay_s: float = 0.2,
        on_replace_root: ReplaceHook | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.replace_delay_s = replace_delay_s
        self.on_replace_root = on_replace_root
        self.replace_result = "succeeded"
        self.throttle_rate = 0.0
        self.throttle_after_rate = 0.0
        self.errors: dict[str, tuple[int, str, str]] = {}
        self.calls: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()
        self.replayed = 0
        self.requests: list[dict[str, str]] = []
        self.replace_tasks: dict[str, ReplaceTask] = {}
        self._rng = random.Random(seed)
        self._launched: dict[str, tuple[tuple, int, bytes, str]] = {}  # token -> (params, status, body, type)
        self._token_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._moto_lock = asyncio.Lock()
        self._replace_tokens: dict[str, str] = {}
        self._progress: set[asyncio.Task] = set()
        self._moto: Any = None
        self._moto_url = ""
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    @property
    def endpoint_url(self) -> str:
        """What boto3 is given as `endpoint_url`."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> FakeAWSFront:
        self._moto = _moto_server(self.host)
        await asyncio.to_thread(self._moto.start)
        moto_host, moto_port = self._moto.get_host_and_port()
        self._moto_url = f"http://{moto_host}:{moto_port}"
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        async with self._session.post(f"{self._moto_url}/moto-api/reset") as reply:  # a clean account
            reply.raise_for_status()
        app = web.Application(client_max_size=16 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self.port = await _serve(self._runner, self.host, self.port)
        return self

    async def close(self) -> None:
        for task in list(self._progress):
            task.cancel()
        await asyncio.gather(*self._progress, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._moto is not None:
            await asyncio.to_thread(self._moto.stop)
            self._moto = None

    async def __aenter__(self) -> FakeAWSFront:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the front ----------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        params = dict(request.query)
        if request.method == "POST" and request.content_type == "application/x-www-form-urlencoded":
            params.update(parse_qsl(body.decode(), keep_blank_values=True))
        action = params.get("Action", "")
        self.calls[action] += 1
        self.requests.append(params)
        if action in self.errors:
            status, code, message = self.errors[action]
            return _ec2_error(status, code, message)
        if self._rng.random() < self.throttle_rate:
            return self._throttle(action)
        match action:
            case "RunInstances":
                reply = await self._run_instances(request, body, params)
            case "CreateReplaceRootVolumeTask":
                reply = await self._create_replace(request, params)
            case "DescribeReplaceRootVolumeTasks":
                reply = self._describe_replace(params)
            case _:
                reply = await self._forward(request, body)
        if reply.status < 300 and self._rng.random() < self.throttle_after_rate:
            return self._throttle(action)  # the cloud acted; the client hears "slow down"
        return reply

    def _throttle(self, action: str) -> web.Response:
        self.throttled[action] += 1
        return _ec2_error(503, "RequestLimitExceeded", "Request limit exceeded.")

    async def _moto_call(self, request: web.Request, body: bytes) -> tuple[int, bytes, str]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with self._moto_lock:
            async with self._session.request(
                request.method, f"{self._moto_url}{request.path_qs}", data=body, headers=headers
            ) as reply:
                return reply.status, await reply.read(), reply.headers.get("Content-Type", "text/xml")

    async def _forward(self, request: web.Request, body: bytes) -> web.Response:
        status, data, ctype = await self._moto_call(request, body)
        return web.Response(status=status, body=data, headers={"Content-Type": ctype})

    async def _run_instances(self, request: web.Request, body: bytes, params: dict[str, str]) -> web.Response:
        token = params.get("ClientToken", "")
        if not token:
            return await self._forward(request, body)
        same = tuple(sorted((k, v) for k, v in params.items() if k != "ClientToken"))
        async with self._token_locks[token]:
            if token in self._launched:
                first, status, data, ctype = self._launched[token]
                if first != same:
                    return _ec2_error(
                        400,
                        "IdempotentParameterMismatch",
                        "The client token you have provided is associated with a resource that is already "
                        "deleted or has different parameters.",
                    )
                self.replayed += 1
                return web.Response(status=status, body=data, headers={"Content-Type": ctype})
            status, data, ctype = await self._moto_call(request, body)
            if status == 200:
                self._launched[token] = (same, status, data, ctype)
            return web.Response(status=status, body=data, headers={"Content-Type": ctype})

    # -- root volume replacement ----------------------------------------------------------------------

    async def _instance_state(self, request: web.Request, params: dict[str, str], instance_id: str) -> str:
        """The instance's EC2 state as moto has it ("" when there is no such instance)."""
        query = urlencode(
            {
                "Action": "DescribeInstances",
                "Version": params.get("Version", "2016-11-15"),
                "Filter.1.Name": "instance-id",
                "Filter.1.Value.1": instance_id,
            }
        ).encode()
        status, data, _ = await self._moto_call(request, query)  # moto reads the scope, not the signature
        if status != 200:
            return ""
        for node in ET.fromstring(data).iter():
            if _local(node.tag) == "instanceState":
                for child in node:
                    if _local(child.tag) == "name":
                        return child.text or ""
        return ""

    async def _create_replace(self, request: web.Request, params: dict[str, str]) -> web.Response:
        instance_id = params.get("InstanceId", "")
        token = params.get("ClientToken", "")
        if token and token in self._replace_tokens:
            return self._task_reply(
                "CreateReplaceRootVolumeTask", [self.replace_tasks[self._replace_tokens[token]]]
            )
        state = await self._instance_state(request, params, instance_id)
        if not state:
            return _ec2_error(
                400, "InvalidInstanceID.NotFound", f"The instance ID '{instance_id}' does not exist"
            )
        if state != "running":
            return _ec2_error(
                400,
                "IncorrectInstanceState",
                f"The instance '{instance_id}' is not in a valid state ({state}).",
            )
        busy = [t for t in self.replace_tasks.values() if t.instance_id == instance_id]
        if any(t.state in ("pending", "in-progress") for t in busy):
            return _ec2_error(
                400, "IncorrectState", f"A root volume replacement task is already running for {instance_id}."
            )
        tags = {}
        n = 1
        while f"TagSpecification.1.Tag.{n}.Key" in params:
            tags[params[f"TagSpecification.1.Tag.{n}.Key"]] = params.get(
                f"TagSpecification.1.Tag.{n}.Value", ""
            )
            n += 1
        task = ReplaceTask(
            task_id=f"replacevol-{uuid.uuid4().hex[:17]}",
            instance_id=instance_id,
            image_id=params.get("ImageId", ""),
            snapshot_id=params.get("SnapshotId", ""),
            delete_replaced=params.get("DeleteReplacedRootVolume", "false").lower() == "true",
            token=token,
            tags=tags,
        )
        self.replace_tasks[task.task_id] = task
        if token:
            self._replace_tokens[token] = task.task_id
        progress = asyncio.create_task(self._replace(task), name=f"replace:{task.task_id}")
        self._progress.add(progress)
        progress.add_done_callback(self._progress.discard)
        return self._task_reply("CreateReplaceRootVolumeTask", [task])

    async def _replace(self, task: ReplaceTask) -> None:
        """The task's course: the new volume is made (pending), swapped in (in-progress: the hook), done."""
        await asyncio.sleep(self.replace_delay_s / 2)  # simulated cloud work, not synchronisation
        task.state = "in-progress"
        try:
            if self.on_replace_root is not None:
                result = self.on_replace_root(task.instance_id)
                if inspect.isawaitable(result):
                    await result
        except Exception as exc:  # noqa: BLE001 - a failed hook is a failed replacement, as EC2 would say
            log.warning("on_replace_root(%s) failed: %r", task.instance_id, exc)
            task.state, task.complete_time = "failed", _iso(time.time())
            return
        await asyncio.sleep(self.replace_delay_s / 2)
        task.state, task.complete_time = self.replace_result, _iso(time.time())

    def _describe_replace(self, params: dict[str, str]) -> web.Response:
        wanted = {v for k, v in params.items() if k.startswith("ReplaceRootVolumeTaskId.")}
        tasks = [t for t in self.replace_tasks.values() if not wanted or t.task_id in wanted]
        n = 1
        while f"Filter.{n}.Name" in params:
            name = params[f"Filter.{n}.Name"]
            values = {v for k, v in params.items() if k.startswith(f"Filter.{n}.Value.")}
            if name != "instance-id":
                return _ec2_error(400, "InvalidParameterValue", f"The filter '{name}' is invalid")
            tasks = [t for t in tasks if t.instance_id in values]
            n += 1
        return self._task_reply("DescribeReplaceRootVolumeTasks", tasks)

    def _task_reply(self, action: str, tasks: list[ReplaceTask]) -> web.Response:
        """EC2's XML for `action` (`replaceRootVolumeTask`, or `replaceRootVolumeTaskSet` of items)."""

        def item(t: ReplaceTask, name: str) -> str:
            tags = "".join(
                f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in t.tags.items()
            )
            parts = [
                f"<replaceRootVolumeTaskId>{t.task_id}</replaceRootVolumeTaskId>",
                f"<instanceId>{escape(t.instance_id)}</instanceId>",
                f"<taskState>{t.state}</taskState>",
                f"<startTime>{t.start_time}</startTime>",
                f"<completeTime>{t.complete_time}</completeTime>" if t.complete_time else "",
                f"<tagSet>{tags}</tagSet>",
                f"<imageId>{escape(t.image_id)}</imageId>" if t.image_id else "",
                f"<snapshotId>{escape(t.snapshot_id)}</snapshotId>" if t.snapshot_id else "",
                f"<deleteReplacedRootVolume>{str(t.delete_replaced).lower()}</deleteReplacedRootVolume>",
            ]
            return f"<{name}>{''.join(parts)}</{name}>"

        if action == "CreateReplaceRootVolumeTask":
            inner = item(tasks[0], "replaceRootVolumeTask")
        else:
            items = "".join(item(t, "item") for t in tasks)
            inner = f"<replaceRootVolumeTaskSet>{items}</replaceRootVolumeTaskSet>"
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{EC2_NS}">'
            f"<requestId>{uuid.uuid4()}</requestId>{inner}</{action}Response>"
        )
        return web.Response(text=body, content_type="text/xml")
