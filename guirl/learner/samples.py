"""Training samples from trajectories, micro-batch packing, and collation into model inputs.

Each step of an episode is one sample: the exact prompt ids the engine used (image placeholders already
expanded), the exact response ids it drew, one behaviour log-prob per response token, and the images.
Nothing here re-applies a chat template: re-rendering a prompt can tokenize differently from what the
engine saw, and the log-prob ratio would then compare two different sequences.

Alignment convention (used by every (B, T) tensor of a `Batch` except the model inputs): position `t`
holds the quantity of the prediction made AT `t`, i.e. of token `input_ids[:, t + 1]` read from
`logits[:, t]`. A row with prompt length P and response length R therefore has `response_mask` true on
`t = P - 1 .. P + R - 2`, and the last column is always false (nothing follows it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from guirl.inference.chat import ChatRenderer
from guirl.messages.types import StepSample, Trajectory
from guirl.messages.types import Tensor as WireTensor

__all__ = ["Batch", "TrainSample", "collate", "pack_microbatches", "samples_from_trajectory"]


@dataclass
class TrainSample:
    """One step of one episode, ready to be scored by the learner."""

    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]
    """Log-prob of each response token under the policy that generated it (as the engine reported it)."""
    images: list[bytes]
    """Encoded images, in the order of the prompt's `<|image_pad|>` runs."""
    advantage: float
    policy_version: int
    episode_id: str
    step: int
    group_id: str

    def __post_init__(self) -> None:
        if len(self.behaviour_logprobs) != len(self.response_ids):
            raise ValueError(
                f"{self.name}: {len(self.behaviour_logprobs)} behaviour log-probs for "
                f"{len(self.response_ids)} response tokens"
            )
        if not self.prompt_ids or not self.response_ids:
            raise ValueError(
                f"{self.name}: empty {'prompt' if not self.prompt_ids else 'response'} (nothing to score)"
            )

    @property
    def name(self) -> str:
        """How errors name this sample."""
        return f"episode {self.episode_id!r} step {self.step}"

    @property
    def n_tokens(self) -> int:
        """Prompt plus response length: the sequence the learner runs."""
        return len(self.prompt_ids) + len(self.response_ids)


def samples_from_trajectory(traj: Trajectory, advantage: float | Sequence[float]) -> list[TrainSample]:
    """One `TrainSample` per step of a completed episode, with the episode's `advantage`, or with one
    advantage per step (step-wise estimation) when given a sequence.

    ValueError naming the episode and step for a malformed step (wrong dtype or rank, log-probs that do
    not match the response, an empty response, a non-finite log-prob), and for an episode that did not
    complete: its reward is not an outcome of the policy.
    """
    if traj.status != "completed":
        raise ValueError(f"episode {traj.episode_id!r} is {traj.status}, not completed: it has no reward")
    per_step = [advantage] * len(traj.steps) if isinstance(advantage, int | float) else list(advantage)
    if len(per_step) != len(traj.steps):
        raise ValueError(
            f"episode {traj.episode_id!r}: {len(per_step)} advantages for {len(traj.steps)} steps"
        )
    bad = next((a for a in per_step if not math.isfinite(a)), None)
    if bad is not None:
        raise ValueError(f"episode {traj.episode_id!r}: advantage {bad} is not finite")
    samples = []
    for s, step_advantage in zip(traj.steps, per_step, strict=True):
        where = f"episode {traj.episode_id!r} step {s.step}"
        prompt = _wire_list(s.prompt_ids, "int32", f"{where}: prompt_ids")
        response = _wire_list(s.response_ids, "int32", f"{where}: response_ids")
        logprobs = _wire_list(s.logprobs, "float32", f"{where}: logprobs")
        if len(logprobs) != len(response):
            raise ValueError(f"{where}: {len(logprobs)} log-probs for {len(response)} response tokens")
        if not response:
            raise ValueError(f"{where}: empty response")
        # A NaN behaviour log-prob would make the importance weight NaN and poison the whole update.
        if not all(math.isfinite(x) for x in logprobs):
            raise ValueError(f"{where}: non-finite behaviour log-prob")
        samples.append(
            TrainSample(
                prompt_ids=prompt,
                response_ids=response,
                behaviour_logprobs=logprobs,
                images=_step_images(traj, s, where),
                advantage=float(step_advantage),
                policy_version=s.policy_version,
                episode_id=traj.episode_id,
                step=s.step,
                group_id=traj.group_id,
            )
        )
    return samples


def _step_images(traj: Trajectory, s: StepSample, where: str) -> list[bytes]:
    """A step's prompt images: its `image_refs` into the trajectory's `screens` (each screenshot travels
    once), or its own `images`."""
    if s.image_refs and s.images:
        raise ValueError(f"{where}: both image_refs and images are set; a step uses one or the other")
    if not s.image_refs:
        return [bytes(img.data) for img in s.images]
    bad = [i for i in s.image_refs if not 0 <= i < len(traj.screens)]
    if bad:
        raise ValueError(f"{where}: image_refs {bad} outside the {len(traj.screens)} screens of the episode")
    return [bytes(traj.screens[i].data) for i in s.image_refs]


def _wire_list(t: WireTensor, dtype: str, what: str) -> list:
    if t.dtype != dtype or len(t.shape) != 1:
        raise ValueError(f"{what} must be a 1-D {dtype} tensor, got {t.dtype} of shape {t.shape}")
    return t.tolist()


@dataclass
class Batch:
    """Right-padded model inputs of several samples, plus label-aligned training tensors (see the module
    docstring for the alignment)."""

    input_ids: torch.Tensor
    """(B, T) int64: prompt then response, right-padded with the pad id."""
    attention_mask: torch.Tensor
    """(B, T) int64: 1 on real tokens."""
    mm_token_type_ids: torch.Tensor
    """(B, T) int32: 1 at the prompt's image-pad tokens (the model's mrope needs it)."""
    pixel_values: torch.Tensor | None
    """(patches, D) of every image of every sample, in sample order."""
    image_grid_thw: torch.Tensor | None
    """(images, 3) in the same order."""
    response_mask: torch.Tensor
    """(B, T) bool, label-aligned: true where `logits[:, t]` predicts a response token."""
    behaviour_logprobs: torch.Tensor
    """(B, T) float32, label-aligned; 0 outside `response_mask`."""
    advantages: torch.Tensor
    """(B, T) float32, label-aligned; each sample's advantage on its response positions, 0 elsewhere."""

    @property
    def n_response_tokens(self) -> int:
        """Response tokens in the batch (the positions that carry a loss)."""
        return int(self.response_mask.sum())

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for `Qwen3VLForConditionalGeneration.forward`."""
        inputs = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "mm_token_type_ids": self.mm_token_type_ids,
        }
        if self.pixel_values is not None:
            inputs["pixel_values"] = self.pixel_values
            inputs["image_grid_thw"] = self.image_grid_thw
        return inputs

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Batch:
        """A copy on `device`, pixel values cast to the model's `dtype` when given."""
        pixels = self.pixel_values
        if pixels is not None:
            pixels = pixels.to(device=device, dtype=dtype or pixels.dtype)
        grid = None if self.image_grid_thw is None else self.image_grid_thw.to(device)
        return Batch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            mm_token_type_ids=self.mm_token_type_ids.to(device),
            pixel_values=pixels,
            image_grid_thw=grid,
            response_mask=self.response_mask.to(device),
            behaviour_logprobs=self.behaviour_logprobs.to(device),
            advantages=self.advantages.to(device),
        )


def collate(samples: list[TrainSample], renderer: ChatRenderer, pad_id: int) -> Batch:
    """Right-pad `samples` into one `Batch`; images are processed by `renderer` exactly as the engine
    processed them, and each prompt's image-pad runs are checked against its images (ValueError naming
    the sample otherwise).

    Right padding keeps each row's tokens at columns 0..n-1, so the mrope positions the model derives
    for a row are exactly those of the row alone, on both of its paths: with images in the batch,
    `get_rope_index` computes each row from its unmasked tokens; without, the model uses `arange(T)`,
    which is a right-padded row's own positions (a left-padded row would be shifted by its padding; rope
    only sees position differences, so that would not change its log-probs either, but right padding
    does not have to rely on it).
    """
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    width = max(s.n_tokens for s in samples)
    b = len(samples)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, width), dtype=torch.long)
    types = torch.zeros((b, width), dtype=torch.int32)
    response_mask = torch.zeros((b, width), dtype=torch.bool)
    behaviour = torch.zeros((b, width), dtype=torch.float32)
    advantages = torch.zeros((b, width), dtype=torch.float32)
    pixels, grids = [], []
    for row, s in enumerate(samples):
        try:
            rendered = renderer.render_ids(s.prompt_ids, s.images)
        except ValueError as exc:
            raise ValueError(f"{s.name}: {exc}") from exc
        if renderer.image_token_id in s.response_ids:
            # The model places image features at every image-pad id of the batch, so a drawn pad token
            # in a response would be counted as an image slot and fail the whole forward.
            raise ValueError(f"{s.name}: the response contains <|image_pad|>; it cannot be scored")
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[row, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        attention_mask[row, : p + r] = 1
        types[row, :p] = torch.tensor(rendered.mm_token_type_ids, dtype=torch.int32)
        # Label-aligned: logits at p-1 .. p+r-2 predict the response tokens at p .. p+r-1.
        response_mask[row, p - 1 : p + r - 1] = True
        behaviour[row, p - 1 : p + r - 1] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
        advantages[row, p - 1 : p + r - 1] = s.advantage
        if rendered.pixel_values is not None:
            pixels.append(rendered.pixel_values)
            grids.append(rendered.image_grid_thw)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        mm_token_type_ids=types,
        pixel_values=torch.cat(pixels) if pixels else None,
        image_grid_thw=torch.cat(grids) if grids else None,
        response_mask=response_mask,
        behaviour_logprobs=behaviour,
        advantages=advantages,
    )


def pack_microbatches(samples: list[TrainSample], max_tokens: int) -> list[list[TrainSample]]:
    """Split `samples`, in order, into micro-batches whose padded size (rows x longest row) stays within
    `max_tokens`; a sample longer than the budget goes alone. The padded size, not the sum of lengths,
    is what a right-padded forward allocates."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    batches: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    longest = 0
    for s in samples:
        wider = max(longest, s.n_tokens)
        if current and (len(current) + 1) * wider > max_tokens:
            batches.append(current)
            current, wider = [], s.n_tokens
        current.append(s)
        longest = wider
    if current:
        batches.append(current)
    return batches
