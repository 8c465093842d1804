"""The one small interface of every way new weights leave the learner (slime keeps one module per
weight-update transport): `disk.DiskPublisher` (safetensors files the engines load) and
`broadcast_publisher`'s `GuirlLayoutPublisher` / `SGLangLayoutPublisher` (a broadcast over the learner's
weight group, in guirl's wire format or SGLang's).

Publishing is two steps, because a broadcast's engines must be told where to join before it can be sent:
`prepare` gets the weights ready and says where the engines take them from (the `WeightSource` the learner
sends the broker), then `send` delivers them while the engines take them. Both block: the learner calls
them on a thread of its own, one publish at a time. The learner's fallback (a broadcast that cannot be
made goes to disk) is a few lines around them (`guirl.learner.publish.WeightDelivery`).
"""

from __future__ import annotations

from typing import Any, Protocol

from guirl.messages.weights import WeightSource


class WeightPublisher(Protocol):
    """One transport of the learner's weights to the engines."""

    def prepare(self, version: int, state: dict[str, Any]) -> WeightSource:
        """Get `state` (a full state dict on CPU, ready for safetensors) ready as `version`: written to disk,
        or cast and planned for a broadcast. Returns where the engines take it from."""
        ...

    def send(self) -> int:
        """Deliver what `prepare` got ready, while the engines take it; the bytes sent (0: nothing to send,
        the files are written)."""
        ...

    def close(self) -> None:
        """Release what the transport holds (a weight group: left, so peers blocked in it fail now)."""
        ...


def cast_state(state: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Floating-point tensors in `dtype` ("" or "float32": as trained) for the engines."""
    import torch

    if dtype in ("", "float32"):
        return state
    target = getattr(torch, dtype)
    return {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
