"""Images in a prompt: the checkpoint's processor expands each image's placeholder into the image's tokens, its
vision tower (mlx-vlm's, through seams/vision.py) turns the image into their embeddings, and the prompt's
multimodal rotary positions are worked out as Qwen's M-RoPE places them.

Decoding after the prompt stays plain: the prompt is prefilled in a frame shifted by the positions its images
saved (`Images.positions`), so every position after it is the cache's own offset, as in a text-only prompt, and
every drafter, cache type and round works unchanged (rotary attention sees only position differences)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..seams import compat, vision
from ..seams.errors import SpecError
from .prompt_cache import common_prefix


@dataclass(frozen=True)
class Images:
    """A prompt's images, ready to prefill."""

    prompt: tuple[int, ...]  # the token ids of the prompt they are in, each image's placeholder expanded
    features: mx.array  # (image tokens, hidden): the embeddings of the prompt's image tokens, in order
    token: int  # the id of an image token (the placeholder the processor repeated)
    grids: tuple[tuple[int, int, int], ...]  # each image's (t, h, w) patch grid, before merging
    merge: int  # patches merged into one token along each side
    sections: mx.array  # (rotary frequencies,): the axis that turns each frequency
    keys: np.ndarray  # (image tokens,): each image token's stand-in when prompts are compared, from its image's pixels

    @property
    def count(self) -> int:
        return len(self.grids)

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """(3, prompt length): each position's temporal, height and width rotary positions."""
        return rope_positions(list(self.prompt), self.token, self.grids, self.merge)

    @functools.cached_property
    def before(self) -> np.ndarray:
        """(prompt length + 1,): how many image tokens come before each position."""
        return np.concatenate([[0], np.cumsum(np.array(self.prompt) == self.token)])

    def over(self, prompt: list[int]) -> "Images":
        """The same images in another prompt (the same placeholders, other text around them)."""
        return replace(self, prompt=tuple(prompt))

    def embeddings(self, embed, tokens: mx.array, start: int) -> mx.array:
        """The input embeddings of prompt positions start..start + len(tokens) - 1 (`embed`: the model's token
        embedding), image tokens taking the features in order."""
        is_image = tokens == self.token
        index = mx.clip(mx.cumsum(is_image.astype(mx.int32)) - 1 + int(self.before[start]), 0,
                        self.features.shape[0] - 1)
        text = embed(tokens)
        return mx.where(is_image[:, None], self.features[index].astype(text.dtype), text)

    @property
    def saved(self) -> int:
        """The positions the images saved: each takes the largest side of its grid, not one per token."""
        return self.positions.shape[1] - int(self.positions.max()) - 1

    @contextlib.contextmanager
    def placed(self, model, piece: mx.array, start: int):
        """Within: `model`'s rotary embeddings put prompt positions start..start + len(piece) - 1 at their shifted
        multimodal positions (`frame`); yields the piece's input embeddings (`embeddings`)."""
        compat.positioned_ropes(model)
        with compat.positions(self.frame(start, start + piece.shape[0]), self.sections):
            yield self.embeddings(compat.input_embedding(model), piece, start)

    def frame(self, start: int, end: int) -> mx.array:
        """(3, end - start): the positions of prompt positions start..end - 1 shifted by what the images saved,
        so that the position after the prompt is its length (the cache's offset) on every axis."""
        return mx.array(self.positions[:, start:end] + self.saved)

    def keyed(self, tokens: list[int]) -> list[int]:
        """`tokens` (the prompt, and what followed it) with each image token of the prompt replaced by its stand-in
        (negative: no token's id), so that prompts showing different images differ where the images do."""
        keyed, prompt = list(tokens), self.positions.shape[1]
        for index, at in enumerate(np.flatnonzero(np.array(tokens[:prompt]) == self.token)):
            keyed[at] = int(self.keys[index])
        return keyed


def reusable_prefix(held: list[int], held_images: Images | None, tokens: list[int], images: Images | None) -> list:
    """What of a cache holding `held` (with `held_images`) a prefill of `tokens` (with `images`) may keep: their
    common prefix, images compared by their pixels; nothing when the images saved different numbers of positions
    (each prompt is prefilled in its own shifted frame: see `Images.frame`)."""
    if (held_images.saved if held_images else 0) != (images.saved if images else 0):
        return []
    mine, theirs = held_images.keyed(held) if held_images else held, images.keyed(tokens) if images else tokens
    return held[:common_prefix(mine, theirs)]


def rope_positions(ids: list[int], token: int, grids: list[list[int]], merge: int) -> np.ndarray:
    """(3, len(ids)) M-RoPE positions: a text token one past the last position on every axis; an image's tokens
    its (t, h, w) patch grid (after merging) from one past the last position, the next text one past its largest."""
    positions, at, image, after = np.zeros((3, len(ids)), dtype=np.int64), 0, 0, 0
    while at < len(ids):
        if ids[at] != token:
            positions[:, at], at, after = after, at + 1, after + 1
            continue
        t, h, w = grids[image][0], grids[image][1] // merge, grids[image][2] // merge
        grid = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")).reshape(3, -1)
        positions[:, at:at + grid.shape[1]] = after + grid
        at, image, after = at + grid.shape[1], image + 1, after + int(grid.max()) + 1
    return positions


def frequency_axes(text_config: dict) -> np.ndarray:
    """The axis (0 temporal, 1 height, 2 width) that turns each rotary frequency, in Qwen 3.5's interleaved
    layout (t h w t h w ..., each axis for as many frequencies as its section)."""
    rope = text_config["rope_parameters"]
    sections = rope["mrope_section"]
    rotary = int(text_config.get("head_dim") or text_config["hidden_size"] // text_config["num_attention_heads"])
    axes = np.zeros(int(rotary * rope.get("partial_rotary_factor", 1.0)) // 2, dtype=np.int32)
    for axis in (1, 2):
        axes[axis:min(3 * sections[axis], len(axes)):3] = axis
    return axes


READS = ("qwen3_5", "qwen3_5_moe")  # the model types whose images mlx-spec reads
READS_SAID = "Qwen 3.5 / 3.6"


class Vision:
    """A vision-language checkpoint's image side, loaded at its first image."""

    def __init__(self, path: Path, config: dict):
        self.path, self.config = path, config
        self.tower = self.processor = None

    @staticmethod
    def of(path: Path, config: dict) -> "Vision | None":
        """The image side of the checkpoint at `path`, None for a text-only one."""
        return Vision(path, config) if "vision_config" in config else None

    def load(self) -> None:
        if self.tower is None:
            rope = (self.config.get("text_config") or {}).get("rope_parameters") or {}
            if self.config.get("model_type") not in READS or "image_token_id" not in self.config \
                    or "mrope_section" not in rope or not rope.get("mrope_interleaved"):
                raise SpecError(f"images are not supported for {self.config.get('model_type')} checkpoints yet: "
                                f"{READS_SAID} read them (see docs/images.md)")
            vision.check()
            compat.check_sections()
            self.tower = vision.load_tower(self.path, self.config)
            if self.tower is None:
                raise SpecError(f"{self.path} declares a vision model but holds no vision weights (a text-only "
                                "conversion?): use the original checkpoint for images")
            self.processor = vision.load_processor(self.path)

    def prompt(self, text: str, sources: list) -> tuple[list[int], Images]:
        """(token ids, Images) for a rendered prompt whose image placeholders stand for `sources` (paths, bytes or
        PIL images), in order."""
        self.load()
        images, keys = [], []
        for i, source in enumerate(sources):
            try:
                images.append(vision.open_image(source))
            except (ValueError, OSError) as e:
                name = source if isinstance(source, (str, Path)) else f"image {i + 1}"
                raise SpecError(f"cannot read {name} as an image ({e}): give a PNG, JPEG, GIF, WebP or BMP "
                                "file") from None
            digest = hashlib.sha256(images[-1].tobytes() + repr(images[-1].size).encode()).digest()
            keys.append(-1 - int.from_bytes(digest[:7], "big"))
        try:
            ids, pixels, grids = vision.process(self.processor, text, images)
        except ValueError as e:
            raise SpecError(f"the model's processor refuses these images ({e}): send one image per image part") \
                from None
        features = self.tower(pixels.astype(self.tower.patch_embed.proj.weight.dtype), grids)
        features = features[0] if isinstance(features, tuple) else features
        token, merge = self.config["image_token_id"], self.config["vision_config"].get("spatial_merge_size", 2)
        if sum(t == token for t in ids) != features.shape[0]:
            raise SpecError(f"the prompt holds {sum(t == token for t in ids)} image tokens for images of "
                            f"{features.shape[0]}: put one image part per image")
        grids = tuple(tuple(grid) for grid in grids.tolist())
        per_image = [t * h * w // merge ** 2 for t, h, w in grids]
        return ids, Images(tuple(ids), features, token, grids, merge,
                           mx.array(frequency_axes(self.config.get("text_config", self.config))),
                           np.repeat(keys, per_image))
