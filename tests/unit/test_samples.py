"""Training samples: trajectory validation, collation (padding, label alignment, images) and micro-batch
packing, against hand-worked layouts."""

from __future__ import annotations

import io
import math

import pytest
import torch
from PIL import Image as PILImage

from guirl.inference.chat import ChatRenderer
from guirl.learner.samples import TrainSample, collate, pack_microbatches, samples_from_trajectory
from guirl.messages.blob import Blob
from guirl.messages.types import Image, StepSample, Tensor, Trajectory
from guirl.model.tiny import build_image_processor, build_tokenizer

PAD = 0


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(build_tokenizer(), build_image_processor())


def png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), (10, 200, 30)).save(buf, "PNG")
    return buf.getvalue()


def sample(
    prompt: list[int],
    response: list[int],
    *,
    images: list[bytes] | None = None,
    adv: float = 1.0,
    step: int = 0,
) -> TrainSample:
    return TrainSample(
        prompt_ids=prompt,
        response_ids=response,
        behaviour_logprobs=[-0.5 - i for i in range(len(response))],
        images=images or [],
        advantage=adv,
        policy_version=3,
        episode_id="ep",
        step=step,
        group_id="g",
    )


def step_sample(step: int, **overrides) -> StepSample:
    fields = {
        "step": step,
        "prompt_ids": Tensor.from_list([5, 6, 7], "int32"),
        "response_ids": Tensor.from_list([8, 9], "int32"),
        "logprobs": Tensor.from_list([-0.25, -1.5], "float32"),
        "policy_version": 4,
    }
    return StepSample(**{**fields, **overrides})


def trajectory(
    *steps: StepSample, screens: list[Image] | None = None, status: str = "completed"
) -> Trajectory:
    return Trajectory(
        episode_id="e1",
        task_id="t",
        group_id="g1",
        sample_index=0,
        status=status,
        reward=1.0,
        steps=list(steps),
        screens=screens or [],
    )


# -- TrainSample and samples_from_trajectory ---------------------------------------------------------


def test_train_sample_checks_lengths() -> None:
    with pytest.raises(ValueError, match="episode 'ep' step 0: 1 behaviour log-probs for 2 response tokens"):
        TrainSample([1], [2, 3], [-1.0], [], 1.0, 0, "ep", 0, "g")
    with pytest.raises(ValueError, match="empty response"):
        TrainSample([1], [], [], [], 1.0, 0, "ep", 0, "g")


def test_samples_from_trajectory_keeps_exact_tokens_and_resolves_screens() -> None:
    screens = [Image(data=Blob(b"screen-a")), Image(data=Blob(b"screen-b"))]
    traj = trajectory(step_sample(0, image_refs=[0]), step_sample(1, image_refs=[0, 1]), screens=screens)
    [a, b] = samples_from_trajectory(traj, advantage=-0.5)
    assert (a.prompt_ids, a.response_ids, a.behaviour_logprobs) == ([5, 6, 7], [8, 9], [-0.25, -1.5])
    assert a.images == [b"screen-a"] and b.images == [b"screen-a", b"screen-b"]
    assert (b.advantage, b.policy_version, b.episode_id, b.step, b.group_id) == (-0.5, 4, "e1", 1, "g1")
    # a step may also carry its own images
    [c] = samples_from_trajectory(trajectory(step_sample(0, images=[Image(data=Blob(b"own"))])), 1.0)
    assert c.images == [b"own"]
    assert samples_from_trajectory(trajectory(), 1.0) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"prompt_ids": Tensor.from_list([5, 6], "int64")}, "prompt_ids must be a 1-D int32 tensor"),
        ({"response_ids": Tensor.from_list([8.0, 9.0], "float32")}, "response_ids must be a 1-D int32"),
        ({"logprobs": Tensor.from_list([-1, -2], "int32")}, "logprobs must be a 1-D float32"),
        ({"logprobs": Tensor.from_list([-1.0], "float32")}, "1 log-probs for 2 response tokens"),
        (
            {"response_ids": Tensor.from_list([], "int32"), "logprobs": Tensor.from_list([], "float32")},
            "empty response",
        ),
        ({"logprobs": Tensor.from_list([-1.0, math.nan], "float32")}, "non-finite behaviour log-prob"),
        ({"image_refs": [2]}, r"image_refs \[2\] outside the 1 screens"),
        ({"image_refs": [0], "images": [Image(data=Blob(b"x"))]}, "both image_refs and images"),
    ],
)
def test_malformed_step_is_named(overrides: dict, message: str) -> None:
    traj = trajectory(step_sample(0), step_sample(7, **overrides), screens=[Image(data=Blob(b"s"))])
    with pytest.raises(ValueError, match=f"episode 'e1' step 7: {message}"):
        samples_from_trajectory(traj, 1.0)


def test_unfinished_episode_and_bad_advantage_are_refused() -> None:
    with pytest.raises(ValueError, match="aborted, not completed"):
        samples_from_trajectory(trajectory(step_sample(0), status="aborted"), 1.0)
    with pytest.raises(ValueError, match="not finite"):
        samples_from_trajectory(trajectory(step_sample(0)), math.nan)


# -- collate -------------------------------------------------------------------------------------------


def test_collate_right_pads_and_aligns_labels(renderer: ChatRenderer) -> None:
    img = renderer.image_token_id
    n_img = renderer.image_tokens(png(64, 64))  # 4x4 patches, merge 2 -> 4 tokens
    assert n_img == 4
    text = sample([11, 12, 13], [21, 22], adv=2.0)
    pic = sample([11, *[img] * n_img, 14], [31, 32, 33], images=[png(64, 64)], adv=-1.0)
    batch = collate([text, pic], renderer, PAD)

    # rows:   text: 11 12 13 21 22 .. .. .. ..      pic: 11 I I I I 14 31 32 33
    assert batch.input_ids.tolist() == [
        [11, 12, 13, 21, 22, PAD, PAD, PAD, PAD],
        [11, img, img, img, img, 14, 31, 32, 33],
    ]
    assert batch.attention_mask.tolist() == [[1] * 5 + [0] * 4, [1] * 9]
    assert batch.mm_token_type_ids.tolist() == [[0] * 9, [0, 1, 1, 1, 1, 0, 0, 0, 0]]
    # label-aligned: logits[:, t] predicts input_ids[:, t + 1]; text predicts 21, 22 at t = 2, 3
    assert batch.response_mask.int().tolist() == [
        [0, 0, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 1, 1, 0],
    ]
    next_tokens = torch.roll(batch.input_ids, -1, dims=1)[batch.response_mask].tolist()
    assert next_tokens == [21, 22, 31, 32, 33]
    assert batch.behaviour_logprobs[batch.response_mask].tolist() == [-0.5, -1.5, -0.5, -1.5, -2.5]
    assert batch.behaviour_logprobs[~batch.response_mask].abs().sum() == 0
    assert batch.advantages.tolist()[0][2:4] == [2.0, 2.0] and batch.advantages[1, 5:8].tolist() == [-1.0] * 3
    assert batch.advantages[~batch.response_mask].abs().sum() == 0
    assert batch.n_response_tokens == 5
    # one image: its 16 patches and its grid, as the renderer processes it
    assert batch.image_grid_thw.tolist() == [[1, 4, 4]] and batch.pixel_values.shape[0] == 16
    assert "pixel_values" in batch.model_inputs()
    assert "pixel_values" not in collate([text], renderer, PAD).model_inputs()


def test_collate_concatenates_images_in_sample_order(renderer: ChatRenderer) -> None:
    img = renderer.image_token_id
    small, wide = png(64, 64), png(128, 64)
    a = sample([1, *[img] * 4, 2], [3], images=[small])
    b = sample([1, *[img] * 8, 2, *[img] * 4, 2], [3], images=[wide, small])
    batch = collate([a, b], renderer, PAD)
    assert batch.image_grid_thw.tolist() == [[1, 4, 4], [1, 4, 8], [1, 4, 4]]
    assert batch.pixel_values.shape[0] == 16 + 32 + 16


def test_collate_names_the_sample_with_a_wrong_image_token_count(renderer: ChatRenderer) -> None:
    img = renderer.image_token_id
    good = sample([1, *[img] * 4, 2], [3], images=[png(64, 64)])
    short = sample([1, *[img] * 3, 2], [3], images=[png(64, 64)], step=5)
    with pytest.raises(ValueError, match=r"episode 'ep' step 5: image 0: prompt_ids hold 3 <\|image_pad\|>"):
        collate([good, short], renderer, PAD)
    missing = sample([1, 2], [3], images=[png(64, 64)], step=6)
    with pytest.raises(ValueError, match="episode 'ep' step 6: prompt_ids hold 0 runs"):
        collate([missing], renderer, PAD)
    drawn = sample([1, 2], [3, img], step=8)
    with pytest.raises(ValueError, match=r"episode 'ep' step 8: the response contains <\|image_pad\|>"):
        collate([drawn], renderer, PAD)
    with pytest.raises(ValueError, match="empty list"):
        collate([], renderer, PAD)


# -- pack_microbatches ---------------------------------------------------------------------------------


def of_lengths(*lengths: int) -> list[TrainSample]:
    return [sample([1] * (n - 1), [2], step=i) for i, n in enumerate(lengths)]


def steps(batches: list[list[TrainSample]]) -> list[list[int]]:
    return [[s.step for s in mb] for mb in batches]


def test_pack_by_padded_size_in_order() -> None:
    # budget 9: 3+3+3 = 3 rows x 3 = 9 fits; 10 is over budget and goes alone; then 2
    assert steps(pack_microbatches(of_lengths(3, 3, 3, 10, 2), 9)) == [[0, 1, 2], [3], [4]]
    # padded, not summed: (4, 2) is 2 x 4 = 8; adding 2 makes 3 x 4 = 12 > 8 although 4+2+2 = 8
    assert steps(pack_microbatches(of_lengths(4, 2, 2), 8)) == [[0, 1], [2]]
    # a long sample after short ones widens the batch: (2, 2) then 5 -> 3 x 5 = 15 > 10
    assert steps(pack_microbatches(of_lengths(2, 2, 5, 5), 10)) == [[0, 1], [2, 3]]
    assert pack_microbatches([], 8) == []
    with pytest.raises(ValueError, match="max_tokens"):
        pack_microbatches(of_lengths(2), 0)
