"""The one module of protocol fakes: stand-ins for what cannot run here, for tests and debugging (a package:
a file per protocol, everything exported here).

The project's rule: fake only what cannot run on a test machine (a hosted model API, an SGLang server
on a GPU), and fake it as a real server on loopback speaking the real protocol, so the code under test
uses its real client, its real sockets and its real error paths. Faults are switched on through the
fake's attributes, never by patching the client's internals.

Fakes here:

- `FakeOpenAIServer`: an OpenAI-compatible endpoint (`GET /v1/models`, `POST /v1/chat/completions`)
  that validates requests as a real server does, records them, and answers through a responder.
- `FakeSGLangServer`: SGLang's native HTTP API (`/generate` with `input_ids` + `image_data`,
  `/health_generate`, `/server_info`, `/init_weights_update_group`, `/update_weights_from_distributed`,
  `/update_weights_from_disk`, `/flush_cache`, `/pause_generation`, `/continue_generation`) with SGLang's
  request and reply shapes, backed by the `hf` engine (a real model, real log-probs) and joining the
  learner's weight group over gloo with SGLang's store keys. Run in-process, or as a process with
  SGLang's launch flags: `python -m guirl.testing.fakes sglang --model-path DIR --port N ...` (the
  `sglang` backend's launch path, with `inference.sglang.server_command`).
"""

from guirl.testing.fakes._common import ReceivedRequest
from guirl.testing.fakes.openai import FakeOpenAIServer
from guirl.testing.fakes.sglang import FakeSGLangServer

__all__ = ["FakeOpenAIServer", "FakeSGLangServer", "ReceivedRequest"]
