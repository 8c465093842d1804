"""SGLang's own code, run on a machine without a GPU: for tests/contract and the SGLang stand-in.

SGLang's wheel is Python (plus Rust extensions it loads lazily), installable without its dependencies
(`pip install --no-deps sglang==X`, then the light packages of `scripts/sglang-contract.txt`). Its modules
import two packages that cannot be here at the top: `triton` (GPU kernels) and `torchvision` (no build
matches the CPU torch). `load()` makes them importable in the least invasive way: triton through SGLang's
own stub (`sglang/_platform_stubs.py`, what SGLang installs on Apple silicon, which has no triton);
torchvision through placeholders whose every call fails, so a path that did use it would fail loudly
rather than compute something else. Nothing else of SGLang is replaced: what runs is SGLang's code.

Loading changes the process for good (SGLang patches transformers on import, publishes a process-wide
runtime context, and its weight groups live in torch.distributed's process-global registry), so it belongs
in processes of its own: the stand-in's server process, a contract test's child process.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TESTED = "0.5.23"
"""The SGLang release tests/contract runs (setup.cfg's `gpu` extra admits the releases it was run against)."""

_LOCK = threading.Lock()
_LOADED: SGLang | None = None


class Unavailable(RuntimeError):
    """SGLang's code cannot be loaded here (not installed, or an import failed): says why."""


class _Placeholder(types.ModuleType):
    """A module of a package that is not installed: attributes resolve (imports and default arguments
    such as `InterpolationMode.BICUBIC` work), calls fail."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        child = _Placeholder(f"{self.__name__}.{attr}")
        setattr(self, attr, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__} is not installed here; SGLang's path called it")

    def __mro_entries__(self, bases: tuple) -> tuple:  # `class X(torchvision.Something)`
        return (object,)


class _PlaceholderFinder:
    """Serves `_Placeholder` modules for the packages named (and only when they are not installed)."""

    def __init__(self, packages: set[str]) -> None:
        self.packages = packages

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.packages:
            return None
        module = sys.modules.get(fullname) or _Placeholder(fullname)
        sys.modules[fullname] = module
        parent, _, child = fullname.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)
        return module.__spec__


def _sglang_file(relative: str) -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("sglang is not installed (make setup-test installs the pinned wheel)")
    return os.path.join(list(spec.submodule_search_locations)[0], relative)


def _install_triton_stub() -> None:
    """SGLang's own triton stub, installed as SGLang installs it where triton does not exist."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return
    name = "_guirl_sglang_platform_stubs"
    spec = importlib.util.spec_from_file_location(name, _sglang_file("_platform_stubs.py"))
    if spec is None or spec.loader is None:
        raise Unavailable("this SGLang has no _platform_stubs.py (its triton stub)")
    stubs = importlib.util.module_from_spec(spec)
    sys.modules[name] = stubs
    spec.loader.exec_module(stubs)
    import platform
    from unittest import mock

    import torch

    # install_platform_stubs() acts only on Apple silicon; on this machine we want exactly its triton part
    # (its torch.mps patches touch a backend nothing here uses)
    with (
        mock.patch.object(stubs.sys, "platform", "darwin"),
        mock.patch.object(platform, "machine", return_value="arm64"),
        mock.patch.object(torch.backends.mps, "is_available", return_value=True),
    ):
        stubs.install_platform_stubs()


def _prepare_imports() -> None:
    # transformers decides once whether torchvision exists: let it see that it does not, before the
    # placeholders exist (its image processing would otherwise take them for the real thing)
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.insert(0, _PlaceholderFinder({"torchvision"}))
    _install_triton_stub()


@dataclass
class SGLang:
    """The SGLang functions guirl's contract is checked against (see tests/contract/README.md)."""

    version: str
    modules: types.SimpleNamespace

    # -- requests ----------------------------------------------------------------------------------

    def contract_error(self, body: Any) -> str | None:
        """The `/generate` JSON contract's verdict on a body (None: admitted), as the server checks it."""
        return self.modules.api_contract.generate_contract_error(body)

    def parse_body(self, cls_name: str, body: Any) -> Any:
        """A control route's body parsed as FastAPI parses it (pydantic over SGLang's msgspec Struct);
        raises `ValueError` (pydantic's ValidationError) where FastAPI answers 422."""
        from pydantic import TypeAdapter

        cls = getattr(self.modules.io_struct, cls_name)
        return TypeAdapter(cls).validate_python(body)

    # -- server ------------------------------------------------------------------------------------

    def parse_launch_flags(self, argv: list[str]) -> Any:
        """`launch_server`'s flags parsed by SGLang's own parser (argparse: an unknown flag exits 2)."""
        import argparse

        parser = argparse.ArgumentParser(prog="sglang serve")
        self.modules.server_args.ServerArgs.add_cli_args(parser)
        return parser.parse_args(argv)

    def server_args(self, argv: list[str]) -> Any:
        """A resolved `ServerArgs` (SGLang's `prepare_server_args`)."""
        return self.modules.server_args.prepare_server_args(argv)

    def publish(self, server_args: Any, role: str = "scheduler") -> None:
        """Publish the process's runtime context from `server_args`, as a server process of `role` does."""
        self.modules.runtime_context.publish(server_args, role=role)

    def server_info(self, server_args: Any) -> dict[str, Any]:
        """`/server_info`'s fields (SGLang's `build_server_info`, no scheduler state)."""
        return self.modules.common.build_server_info(server_args, {})

    # -- weights -----------------------------------------------------------------------------------

    def weight_side(
        self,
        load_weights: Callable[[list[tuple[str, Any]]], None],
        on_version: Callable[[str | None], None],
        *,
        tp_rank: int = 0,
        device: str = "cpu",
    ) -> WeightSide:
        """One TP rank's weight-update machinery: SGLang's scheduler-side manager (the session rule, the
        fan-out to runners, the version record) over SGLang's model-runner `WeightUpdater` (process groups,
        receiving broadcasts), loading what it receives through `load_weights`. Needs a published runtime
        context (`publish`); makes the default process group (one rank, as a TP-1 server has) if there is
        none."""
        return WeightSide(self, load_weights, on_version, tp_rank=tp_rank, device=device)

    def flush_gate(
        self, flush: Callable[[], bool], idle: Callable[[], bool], answer: Callable[[Any, Any], None]
    ) -> Any:
        """SGLang's `/flush_cache` handling (`SchedulerFlushWrapper`): refused while requests run, deferred
        up to the request's timeout; call `.handle(FlushCacheReqInput)` and, as the scheduler loop does,
        `.check_pending()` whenever requests end."""
        return self.modules.flush.SchedulerFlushWrapper(
            flush_cache=flush, is_fully_idle=idle, send_output=answer
        )


class WeightSide:
    """See `SGLang.weight_side`. Every call blocks (a broadcast waits for the learner): one at a time, off the
    event loop, as SGLang's scheduler runs them."""

    def __init__(
        self,
        sglang: SGLang,
        load_weights: Callable[[list[tuple[str, Any]]], None],
        on_version: Callable[[str | None], None],
        *,
        tp_rank: int,
        device: str,
    ) -> None:
        import torch
        import torch.distributed as dist

        m = sglang.modules
        self.sglang = sglang
        if not dist.is_initialized():  # SGLang's server always has one (its TP group); a TP-1 server's
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        m.runtime_context.get_parallel().override_permanently(
            tp_group=types.SimpleNamespace(cpu_group=dist.group.WORLD)
        )

        class Model(torch.nn.Module):  # what the runner loads into: its load_weights is the model's
            def load_weights(self, named: list[tuple[str, Any]]) -> None:
                load_weights(list(named))

        model = Model()
        self.updater = m.runner_weights.WeightUpdater(
            tp_rank=tp_rank,
            device=device,
            gpu_id=0,
            model_config=None,
            custom_weight_loaders={},
            get_model=lambda: model,
            update_model_fields=None,
            recapture_cuda_graph=None,
            get_model_runner=None,
        )
        runner = types.SimpleNamespace(weight_updater=self.updater)
        tp_worker = types.SimpleNamespace(
            model_runner=runner, weight_update_runners=lambda: [("target", runner)]
        )
        # the TP worker's glue is SGLang's too (TpModelWorker's methods, on this worker)
        tp_cls = importlib.import_module("sglang.srt.managers.tp_worker").TpModelWorker
        tp_worker.init_weights_update_group = types.MethodType(tp_cls.init_weights_update_group, tp_worker)
        tp_worker.destroy_weights_update_group = types.MethodType(
            tp_cls.destroy_weights_update_group, tp_worker
        )
        self.manager = m.scheduler_weights.SchedulerWeightUpdaterManager(
            tp_worker=tp_worker,
            draft_worker=None,
            memory_saver_adapter=None,
            flush_cache=lambda **_: True,  # the caller flushes (guirl sends flush_cache false per bucket)
            is_fully_idle=lambda **_: True,
            scheduler=types.SimpleNamespace(
                record_weight_version_change=lambda new_version: on_version(new_version)
            ),
        )

    def call(self, route: str, body: Any) -> tuple[bool, str]:
        """One weight route's request, parsed as the server parses it; `(success, message)`. A body the
        server would not parse raises `ValueError` (FastAPI's 422)."""
        cls, method = _WEIGHT_ROUTES[route]
        req = self.sglang.parse_body(cls, body)
        out = getattr(self.manager, method)(req)
        return bool(out.success), str(out.message)


_WEIGHT_ROUTES = {
    "/init_weights_update_group": ("InitWeightsUpdateGroupReqInput", "init_weights_update_group"),
    "/destroy_weights_update_group": ("DestroyWeightsUpdateGroupReqInput", "destroy_weights_update_group"),
    "/begin_weight_update": ("BeginWeightUpdateReqInput", "begin_weight_update"),
    "/end_weight_update": ("EndWeightUpdateReqInput", "end_weight_update"),
    "/update_weights_from_distributed": (
        "UpdateWeightsFromDistributedReqInput",
        "update_weights_from_distributed",
    ),
}
"""SGLang's weight routes: the request type FastAPI parses the body into, and the manager's method."""


def load_server() -> SGLang:
    """`load()`, plus SGLang's HTTP server process: its FastAPI app (`http_server`), `TokenizerManager`,
    `PortArgs`, `TemplateManager`. transformers' Qwen3-VL processor insists on a video processor, which needs
    torchvision: a bare `BaseVideoProcessor` stands in for it (SGLang's image path uses only the
    processor's tokenizer and image processor)."""
    sglang = load()
    with _LOCK:
        if hasattr(sglang.modules, "http_server"):
            return sglang
        import transformers
        import transformers.video_processing_utils as video
        from transformers.models.auto import video_processing_auto
        from transformers.utils import import_utils

        if not import_utils.is_torchvision_available():
            transformers.VideoProcessorMixin = video.VideoProcessorMixin
            video_processing_auto.AutoVideoProcessor.from_pretrained = classmethod(
                lambda cls, *a, **k: video.BaseVideoProcessor()
            )
        try:
            sglang.modules.http_server = importlib.import_module("sglang.srt.entrypoints.http_server")
            sglang.modules.tokenizer_manager = importlib.import_module(
                "sglang.srt.managers.tokenizer_manager"
            )
            sglang.modules.template_manager = importlib.import_module("sglang.srt.parser.template_manager")
        except Exception as exc:
            raise Unavailable(
                f"SGLang {sglang.version}'s HTTP server does not import here: {type(exc).__name__}: {exc}"
            ) from exc
        return sglang


def load() -> SGLang:
    """SGLang's modules, loaded once per process (see the module docstring); `Unavailable` says why not."""
    global _LOADED
    with _LOCK:
        if _LOADED is not None:
            return _LOADED
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            raise Unavailable("sglang is not installed (make setup-test installs the pinned wheel)") from None
        try:
            _prepare_imports()
            modules = types.SimpleNamespace(
                api_contract=importlib.import_module("sglang.srt.entrypoints.api_contract"),
                io_struct=importlib.import_module("sglang.srt.managers.io_struct"),
                common=importlib.import_module("sglang.srt.utils.common"),
                server_args=importlib.import_module("sglang.srt.server_args"),
                runtime_context=importlib.import_module("sglang.srt.runtime_context"),
                scheduler_weights=importlib.import_module(
                    "sglang.srt.managers.scheduler_components.weight_updater"
                ),
                runner_weights=importlib.import_module(
                    "sglang.srt.model_executor.model_runner_components.weight_updater"
                ),
                flush=importlib.import_module("sglang.srt.managers.scheduler_components.flush_wrapper"),
            )
        except Unavailable:
            raise
        except Exception as exc:  # an import chain that needs what is not here: say which
            raise Unavailable(
                f"SGLang {version}'s modules do not import here: {type(exc).__name__}: {exc}"
            ) from exc
        _LOADED = SGLang(version=version, modules=modules)
        return _LOADED
