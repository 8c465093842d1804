"""Chat prompts to the exact token ids and pixel tensors a Qwen3-VL model takes.

This is what `Qwen3VLProcessor` does, built from the tokenizer and the image processor alone (the
processor itself needs a video processor, which needs torchvision): the chat template is rendered
with the generation prompt, and each image's single `<|image_pad|>` is expanded to
`grid_t * grid_h * grid_w // merge_size**2` tokens, the number of embeddings the vision tower produces
for it. `mm_token_type_ids` marks those tokens (1) so the model can compute its 3-D rope positions.

As with Qwen's own processor, special-token text inside a text part (say a literal "<|im_end|>") is
parsed as that token; a literal "<|image_pad|>" is caught (the pad count no longer matches the images).
"""

from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from guirl.agent.prompt import VISION_TOKENS
from guirl.messages.types import ChatMessage, ImagePart, TextPart

LOAD_LOCK = threading.Lock()
"""Held while loading from transformers on a worker thread: its lazy module imports are not thread-safe (two
engines starting at once saw `cannot import name 'AutoImageProcessor'`)."""


@dataclass
class RenderedPrompt:
    """Model inputs of one prompt (no batch dimension)."""

    input_ids: list[int]
    pixel_values: torch.Tensor | None
    """(patches, C * temporal * patch * patch) for all images of the prompt, in prompt order."""
    image_grid_thw: torch.Tensor | None
    """(images, 3): each image's (t, h, w) grid in patches."""
    mm_token_type_ids: list[int]
    """1 at image-pad tokens, 0 elsewhere (same length as `input_ids`)."""

    @property
    def n_images(self) -> int:
        return 0 if self.image_grid_thw is None else int(self.image_grid_thw.shape[0])


PNG_END = b"IEND\xaeB`\x82"
"""The last 8 bytes of every whole PNG (its IEND chunk's type and CRC)."""


def decode_image(data: bytes, index: int = 0) -> Any:
    """An RGB PIL image from encoded bytes; ValueError naming the image when they are not one."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
        img.load()  # open() is lazy: decode now so truncated data fails here, not inside the processor
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as exc:
        raise ValueError(f"image {index} ({len(data)} bytes) is not a decodable image: {exc}") from exc
    return img.convert("RGB")


class ChatRenderer:
    """Renders chat messages (or checks prompt ids) together with their images into `RenderedPrompt`s."""

    def __init__(self, tokenizer: Any, image_processor: Any) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.merge_size = int(image_processor.merge_size)
        self.image_token_id = int(tokenizer.convert_tokens_to_ids("<|image_pad|>"))
        self.vision_start_id = int(tokenizer.convert_tokens_to_ids("<|vision_start|>"))
        unk = tokenizer.unk_token_id
        ids = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
        self.vision_token_ids: frozenset[int] = frozenset(i for i in ids if i is not None and i != unk)
        """Ids of the vision tokens: a response must never hold one (it would be taken for an image slot)."""

    @classmethod
    def load(cls, ckpt_dir: str | Path) -> ChatRenderer:
        """The renderer of a local checkpoint directory (never touches the network)."""
        with LOAD_LOCK:
            from transformers import AutoImageProcessor, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(ckpt_dir), local_files_only=True)
            try:
                image_processor = AutoImageProcessor.from_pretrained(str(ckpt_dir), local_files_only=True)
            except ImportError:
                # transformers before 5.2x insists on torchvision for AutoImageProcessor (a GPU box may have
                # torch and transformers only); Qwen2/2.5/3-VL's PIL processor reads the same config
                from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
                    Qwen2VLImageProcessorPil,
                )

                image_processor = Qwen2VLImageProcessorPil.from_pretrained(
                    str(ckpt_dir), local_files_only=True
                )
        return cls(tokenizer, image_processor)

    def template_text(self, messages: list[ChatMessage]) -> str:
        """The chat template applied to `messages`, ending in the assistant generation prompt; the first
        message's `tools` go to the template as its `tools=` (ValueError when another message has some)."""
        tools = tool_schemas(messages)
        conversation = [
            {
                "role": m.role,
                "content": [
                    {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
                    for p in m.parts
                ],
            }
            for m in messages
        ]
        return self.tokenizer.apply_chat_template(
            conversation, tools=tools or None, add_generation_prompt=True, tokenize=False
        )

    def render(
        self, messages: list[ChatMessage], images: list[bytes], *, pixels: bool = True
    ) -> RenderedPrompt:
        """Token ids and pixel tensors of a chat prompt; `ImagePart(index=i)` refers to `images[i]`.

        `pixels=False`: the ids only (`pixel_values` and `image_grid_thw` None), each image's token count
        from its size as its header gives it and the image processor's own `get_number_of_image_patches`
        (the count its processing would give, without decoding a pixel): what a server that processes the
        images itself (SGLang) needs, at a small fraction of the CPU."""
        if not messages:
            raise ValueError("a chat prompt needs at least one message")
        order = [p.index for m in messages for p in m.parts if isinstance(p, ImagePart)]
        for i in order:
            if not 0 <= i < len(images):
                raise ValueError(f"ImagePart(index={i}) but the request has {len(images)} images")
        ids = self.tokenizer(self.template_text(messages), add_special_tokens=False)["input_ids"]
        if ids.count(self.image_token_id) != len(order):
            raise ValueError(
                f"the rendered prompt has {ids.count(self.image_token_id)} <|image_pad|> tokens for "
                f"{len(order)} image parts (a text part contains the literal token?)"
            )
        if pixels:
            pixel_values, grid = self._pixels([images[i] for i in order], order)
            counts = self._token_counts(grid)
        else:
            pixel_values, grid = None, None
            counts = [self._header_tokens(images[i], i) for i in order]
        expanded: list[int] = []
        k = 0
        for tok in ids:
            if tok == self.image_token_id:
                expanded.extend([tok] * counts[k])
                k += 1
            else:
                expanded.append(tok)
        return RenderedPrompt(expanded, pixel_values, grid, self._types(expanded))

    def render_ids(
        self, prompt_ids: list[int], images: list[bytes], *, pixels: bool = True
    ) -> RenderedPrompt:
        """Pixel tensors for exact prompt ids (token-in requests). The ids must already be expanded, as
        `render` returns them: each run of `<|image_pad|>` tokens belongs to the next image, in order, and
        must be as long as that image's token count; ValueError otherwise. `pixels=False`: checked from
        the images' headers only (see `render`)."""
        runs = _runs(prompt_ids, self.image_token_id)
        if len(runs) != len(images):
            raise ValueError(
                f"prompt_ids hold {len(runs)} runs of <|image_pad|> tokens but the request has "
                f"{len(images)} images"
            )
        if pixels:
            pixel_values, grid = self._pixels(images, list(range(len(images))))
            counts = self._token_counts(grid)
        else:
            pixel_values, grid = None, None
            counts = [self._header_tokens(b, i) for i, b in enumerate(images)]
        for i, (run, want) in enumerate(zip(runs, counts)):
            if run != want:
                shape = f"grid {grid[i].tolist()}" if grid is not None else "from its size"
                raise ValueError(
                    f"image {i}: prompt_ids hold {run} <|image_pad|> tokens, the image needs {want} "
                    f"({shape}, merge {self.merge_size}); render the prompt with the same image processor"
                )
        ids = list(prompt_ids)
        return RenderedPrompt(ids, pixel_values, grid, self._types(ids))

    def count_tokens(self, text: str) -> int:
        """Tokens of plain text (no template, special-token text counted as one token each)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def image_tokens(self, data: bytes) -> int:
        """How many `<|image_pad|>` tokens one encoded image becomes."""
        _, grid = self._pixels([data], [0])
        return self._token_counts(grid)[0]

    # -- helpers -----------------------------------------------------------------------------------

    def _pixels(
        self, blobs: list[bytes], indices: list[int]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if not blobs:
            return None, None
        pil = [decode_image(b, i) for b, i in zip(blobs, indices)]
        try:
            out = self.image_processor(images=pil, return_tensors="pt")
        except ValueError as exc:  # e.g. an aspect ratio over 200
            raise ValueError(f"image processing failed: {exc}") from exc
        return out["pixel_values"], out["image_grid_thw"]

    def _header_tokens(self, data: bytes, index: int) -> int:
        """`<|image_pad|>` tokens of an encoded image, from its header's size and the processor's own
        arithmetic (no pixel decoded)."""
        from PIL import Image as PILImage

        try:
            with PILImage.open(io.BytesIO(data)) as img:
                width, height, fmt = *img.size, img.format
        except (PILImage.DecompressionBombError, OSError, ValueError, SyntaxError) as exc:
            raise ValueError(f"image {index} ({len(data)} bytes) is not an image: {exc}") from exc
        # a truncated image has a whole header: refused here, as decoding it would, not by the server
        complete = {"PNG": data.endswith(PNG_END), "JPEG": data.rstrip(b"\0").endswith(b"\xff\xd9")}
        if not complete.get(fmt, False):  # cut short, or a format whose end is not checked: decode it
            if fmt in complete:
                raise ValueError(f"image {index} ({len(data)} bytes) is a truncated {fmt}")
            decode_image(data, index)
        try:
            patches = int(self.image_processor.get_number_of_image_patches(height, width, {}))
        except ValueError as exc:  # e.g. an aspect ratio over 200
            raise ValueError(f"image processing failed: {exc}") from exc
        return patches // self.merge_size**2

    def _token_counts(self, grid: torch.Tensor | None) -> list[int]:
        if grid is None:
            return []
        return [int(n) for n in (grid.prod(-1) // self.merge_size**2).tolist()]

    def _types(self, ids: list[int]) -> list[int]:
        return [1 if t == self.image_token_id else 0 for t in ids]


def tool_schemas(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The function schemas the first message carries for the chat template (`ChatMessage.tools`), decoded
    with their key order kept; ValueError when one is not a JSON object or a later message carries any."""
    if any(m.tools for m in messages[1:]) or (
        messages and messages[0].tools and messages[0].role != "system"
    ):
        raise ValueError("only a first, system message may carry tools")
    schemas = []
    for i, text in enumerate(messages[0].tools if messages else []):
        try:
            schema = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"tool {i} is not JSON: {exc}"[:300]) from None
        if not isinstance(schema, dict):
            raise ValueError(f"tool {i} is not a JSON object")
        schemas.append(schema)
    return schemas


def _runs(ids: list[int], token: int) -> list[int]:
    """Lengths of the maximal runs of `token` in `ids`, in order."""
    runs: list[int] = []
    prev = None
    for t in ids:
        if t == token:
            if prev == token:
                runs[-1] += 1
            else:
                runs.append(1)
        prev = t
    return runs
