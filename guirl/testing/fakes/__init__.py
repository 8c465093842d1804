"""The one module of protocol fakes: stand-ins for what cannot run here, for tests and debugging (a package:
a file per protocol, everything exported here).

The project's rule: fake only what cannot run on a test machine (a hosted model API, an SGLang server
on a GPU), and fake it as a real server on loopback speaking the real protocol, so the code under test
uses its real client, its real sockets and its real error paths. Faults are switched on through the
fake's attributes, never by patching the client's internals.

Fakes here:

- `FakeOpenAIServer`: an OpenAI-compatible endpoint (`GET /v1/models`, `POST /v1/chat/completions`)
  that validates requests as a real server does, records them, and answers through a responder.
- `FakeSGLangServer`: SGLang's own HTTP server process (its FastAPI app, `TokenizerManager` with Qwen3-VL's
  multimodal processing, its scheduler-side weight-update manager and flush handling), with guirl's stand-in
  only for what needs a GPU: the scheduler's model execution (the tiny Qwen3-VL on the `hf` engine, fed
  SGLang's ids and pixel values, or a latency model for benchmarks). It refuses what SGLang refuses because
  SGLang's code decides. Needs SGLang's wheel (`make setup-test`); run in-process as a handle on a child
  process, or as a process with SGLang's launch flags: `python -m guirl.testing.fakes sglang --model-path
  DIR --port N ...` (the `sglang` backend's launch path, with `inference.sglang.server_command`).
- `FakeAliyunECS`: Alibaba Cloud's ECS OpenAPI (2014-05-26) as `alibabacloud_ecs20140526` speaks it
  (`docs/cloud/aliyun-ecs.md`): ACS3-HMAC-SHA256 (and RPC v1) signatures verified, dispatch on
  `x-acs-action`, instances with their lifecycles, tags, private IPs, ClientToken idempotency,
  AutoReleaseTime, re-imaging and security groups, in memory; throttling before or after acting, 503s and
  a skewed clock as faults. Point the SDK at `fake.endpoint` with `protocol="http"`.
- `FakeVolcengine`: Volcengine's ECS and VPC OpenAPI (2020-04-01) as `volcenginesdkcore` speaks it
  (`docs/cloud/volcengine-ecs.md`): `GET /` with indexed query parameters, HMAC-SHA256 (SignerV4) signatures
  recomputed and verified, the `ResponseMetadata`/`Result` envelope; instances paced through their statuses,
  tags, private IPs from the subnet, ClientToken idempotency, DescribeInstances pagination, stop / replace
  system volume / start, and security groups with their rules, in memory; throttling (429
  `AccountFlowLimitExceeded`) before or after acting, 500s and a skewed clock as faults. Point the SDK at
  `fake.endpoint` with `scheme="http"`.
- `FakeAWSFront`: EC2's query API for boto3 (`endpoint_url`): moto's EC2 server, started by the front, behind
  an aiohttp front that adds what moto lacks, as EC2 behaves: RunInstances idempotent by `ClientToken`,
  `CreateReplaceRootVolumeTask` / `DescribeReplaceRootVolumeTasks` (pending → in-progress → succeeded after
  `replace_delay_s`, with an `on_replace_root(instance_id)` hook: tests reset a local desktop there),
  `RequestLimitExceeded` throttling before (`throttle_rate`) or after (`throttle_after_rate`) the cloud
  acted, and injected errors (`errors`); `calls` counts calls by action. moto's state is process-global:
  one front per process at a time.
"""

from guirl.testing.fakes._common import ReceivedRequest
from guirl.testing.fakes.aliyun import FakeAliyunECS
from guirl.testing.fakes.aws import FakeAWSFront
from guirl.testing.fakes.openai import FakeOpenAIServer
from guirl.testing.fakes.sglang import FakeSGLangServer
from guirl.testing.fakes.volcengine import FakeVolcengine

__all__ = [
    "FakeAliyunECS",
    "FakeAWSFront",
    "FakeOpenAIServer",
    "FakeSGLangServer",
    "FakeVolcengine",
    "ReceivedRequest",
]
