"""Images in a prompt: the checkpoint's processor expands each image's placeholder into the image's tokens, its
image encoder (mlx-vlm's, through seams/vision.py) turns the images into their embeddings, and the prompt is
prefilled as the model reads it: Qwen 3.5 / 3.6 at its multimodal rotary positions (M-RoPE), Gemma 4 with each
image's tokens seeing one another and its per-layer embeddings reading padding there.

Decoding after the prompt stays plain: a Qwen prompt is prefilled in a frame shifted by the positions its images
saved (`Images.frame`), so every position after it is the cache's own offset, as in a text-only prompt, and
every drafter, cache type and round works unchanged (rotary attention sees only position differences)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..seams import compat, layout, vision
from ..seams.errors import SpecError


@dataclass(frozen=True)
class MRope:
    """Qwen's multimodal rotary positions: text one past the last position on every axis, an image's tokens its
    (t, h, w) patch grid."""

    grids: tuple[tuple[int, int, int], ...]  # each image's (t, h, w) patch grid, before merging
    merge: int  # patches merged into one token along each side
    sections: mx.array  # (rotary frequencies,): the axis that turns each frequency


@dataclass(frozen=True)
class Images:
    """A prompt's images, ready to prefill."""

    prompt: tuple[int, ...]  # the token ids of the prompt they are in, each image's placeholder expanded
    features: mx.array  # (image tokens, hidden): the embeddings of the prompt's image tokens, in order
    token: int  # the id of an image token (the placeholder the processor repeated)
    count: int  # how many images
    keys: np.ndarray  # (image tokens,): each image token's stand-in when prompts are compared, from its image's pixels
    rope: MRope | None = None  # Qwen's multimodal positions; None: positions in a row
    layer_token: int | None = None  # the id the model's per-layer embeddings read at an image token (Gemma 4's pad)
    whole: bool = False  # an image's tokens see one another, later ones too (Gemma 4's bidirectional vision)
    deep: tuple[mx.array, ...] = ()  # Qwen3-VL's deepstack: per first decoder layer, what its image tokens add

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """(3, prompt length): each position's temporal, height and width rotary positions (all three the same
        without M-RoPE)."""
        if self.rope is None:
            return np.tile(np.arange(len(self.prompt)), (3, 1))
        return rope_positions(list(self.prompt), self.token, self.rope.grids, self.rope.merge)

    @functools.cached_property
    def before(self) -> np.ndarray:
        """(prompt length + 1,): how many image tokens come before each position."""
        return np.concatenate([[0], np.cumsum(np.array(self.prompt) == self.token)])

    @functools.cached_property
    def blocks(self) -> np.ndarray:
        """(prompt length,): the image each position's token belongs to, -1 for text."""
        return image_runs(self.prompt, self.token)

    def over(self, prompt: list[int]) -> "Images":
        """The same images in another prompt (the same placeholders, other text around them)."""
        return replace(self, prompt=tuple(prompt))

    def image_rows(self, tokens: mx.array, start: int) -> tuple[mx.array, mx.array]:
        """For prompt positions start..start + len(tokens) - 1: which hold image tokens, and the row of the
        features each takes (meaningful where it is one)."""
        is_image = tokens == self.token
        index = mx.clip(mx.cumsum(is_image.astype(mx.int32)) - 1 + int(self.before[start]), 0,
                        self.features.shape[0] - 1)
        return is_image, index

    def embeddings(self, model, tokens: mx.array, start: int) -> mx.array:
        """The input embeddings of prompt positions start..start + len(tokens) - 1, image tokens taking the
        features in order, as `model` takes them (before its own scale: see `layout.input_scale`)."""
        is_image, index = self.image_rows(tokens, start)
        text = layout.input_embedding(model)(tokens)
        features = self.features[index].astype(text.dtype)
        if (scale := layout.input_scale(model)) != 1.0:
            features = features / scale
        return mx.where(is_image[:, None], features, text)

    def deepstack(self, tokens: mx.array, start: int) -> list[mx.array]:
        """What the first decoder layers add to their outputs at prompt positions start..start + len(tokens) - 1:
        at image tokens their deepstack features, nothing elsewhere."""
        is_image, index = self.image_rows(tokens, start)
        return [mx.where(is_image[:, None], deep[index], 0) for deep in self.deep]

    @property
    def saved(self) -> int:
        """The positions the images saved: each takes the largest side of its grid, not one per token (M-RoPE)."""
        return self.positions.shape[1] - int(self.positions.max()) - 1

    def piece_end(self, start: int, end: int) -> int:
        """Where a prefill piece from `start` meant to end at `end` ends: not inside an image the model reads
        whole (`whole`), but before it, or after it when the piece starts in it."""
        if (not self.whole or end >= len(self.prompt) or self.blocks[end] < 0
                or self.blocks[end - 1] != self.blocks[end]):
            return end
        first = int(np.flatnonzero(self.blocks == self.blocks[end])[0])
        return first if first > start else int(np.flatnonzero(self.blocks == self.blocks[end])[-1]) + 1

    def seen(self, start: int, end: int) -> np.ndarray | None:
        """(n, n) for prompt positions start..end - 1: which of them each sees beyond causality (the tokens of
        its own image, when the model reads images whole); None when none."""
        if not self.whole:
            return None
        blocks = self.blocks[start:end]
        return (blocks[:, None] == blocks[None, :]) & (blocks[:, None] >= 0)

    @contextlib.contextmanager
    def placed(self, model, piece: mx.array, start: int):
        """Within: `model` reads prompt positions start..start + len(piece) - 1 as it reads images: its rotary
        embeddings put them at their shifted multimodal positions (`frame`, with M-RoPE), its first layers add
        their deepstack features (`deepstack`); yields the ids and the input embeddings it takes for the piece
        (`embeddings`; the ids read by its per-layer embeddings, `layer_token` at image tokens)."""
        ids = piece if self.layer_token is None else mx.where(piece == self.token, self.layer_token, piece)
        with contextlib.ExitStack() as stack:
            if self.rope is not None:
                compat.positioned_ropes(model)
                stack.enter_context(compat.positions(self.frame(start, start + piece.shape[0]), self.rope.sections))
            if self.deep:
                stack.enter_context(compat.added_to_layers(model, self.deepstack(piece, start)))
            yield ids, self.embeddings(model, piece, start)

    def frame(self, start: int, end: int) -> mx.array:
        """(3, end - start): the positions of prompt positions start..end - 1 shifted by what the images saved,
        so that the position after the prompt is its length (the cache's offset) on every axis."""
        return mx.array(self.positions[:, start:end] + self.saved)

    def keyed(self, tokens: list[int]) -> list[int]:
        """`tokens` (the prompt, and what followed it) with each image token of the prompt replaced by its stand-in
        (negative: no token's id), so that prompts showing different images differ where the images do."""
        keyed, prompt = list(tokens), len(self.prompt)
        for index, at in enumerate(np.flatnonzero(np.array(tokens[:prompt]) == self.token)):
            keyed[at] = int(self.keys[index])
        return keyed


def image_runs(ids, token: int) -> np.ndarray:
    """(len(ids),): which run of consecutive `token`s (an image) each position is in, -1 elsewhere."""
    is_image = np.array(ids) == token
    starts = is_image & ~np.concatenate([[False], is_image[:-1]])
    return np.where(is_image, np.cumsum(starts) - 1, -1)


def prompt_keys(tokens: list[int], images: Images | None) -> list:
    """What a cache holding `tokens` (a prompt showing `images`, and what followed it) is known by when prompts
    are compared (the prompt caches): its tokens, each image token replaced by its image's stand-in (its pixels);
    in a frame shifted by what the images saved (M-RoPE: every position of the prompt is shifted), the first
    marked with the shift, so that two sequences share a prefix exactly where their caches hold the same."""
    if images is None:
        return list(tokens)
    keys = images.keyed(tokens)
    if images.saved and keys:
        keys[0] = -(1 + images.saved) * 2 ** 80 + keys[0]  # beyond every token id and stand-in
    return keys


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


def rope_settings(text_config: dict) -> dict:
    """A Qwen text config's rotary settings (`rope_parameters`; older configs' `rope_scaling`)."""
    return text_config.get("rope_parameters") or text_config.get("rope_scaling") or {}


def frequency_axes(text_config: dict) -> np.ndarray:
    """The axis (0 temporal, 1 height, 2 width) that turns each rotary frequency: Qwen 3.5's and Qwen3-VL's
    interleaved layout (t h w t h w ..., each axis for as many frequencies as its section), or Qwen2.5-VL's
    sections in a row (its first section's frequencies temporal, then height, then width)."""
    rope = rope_settings(text_config)
    sections = rope["mrope_section"]
    rotary = int(text_config.get("head_dim") or text_config["hidden_size"] // text_config["num_attention_heads"])
    axes = np.zeros(int(rotary * rope.get("partial_rotary_factor", 1.0)) // 2, dtype=np.int32)
    if not rope.get("mrope_interleaved"):
        axes[:sum(sections)] = np.repeat([0, 1, 2], sections)
        return axes
    for axis in (1, 2):
        axes[axis:min(3 * sections[axis], len(axes)):3] = axis
    return axes


READS = ("qwen3_5", "qwen3_5_moe", "qwen3_vl", "qwen3_vl_moe", "qwen2_5_vl", "gemma4")  # whose images mlx-spec reads
READS_SAID = "Qwen 3.5 / 3.6, Qwen3-VL, Qwen2.5-VL and Gemma 4"


class Vision:
    """A vision-language checkpoint's image side, loaded at its first image."""

    def __init__(self, path: Path, config: dict):
        self.path, self.config = path, config
        self.tower = self.processor = None

    @staticmethod
    def of(path: Path, config: dict) -> "Vision | None":
        """The image side of the checkpoint at `path`, None for a text-only one."""
        return Vision(path, config) if "vision_config" in config else None

    @property
    def text_config(self) -> dict:
        return self.config.get("text_config", self.config)

    def problem(self) -> str | None:
        """Why mlx-spec cannot read this checkpoint's images (None when it can)."""
        model_type = self.config.get("model_type")
        if model_type not in READS or (model_type != "gemma4" and "mrope_section" not in rope_settings(
                self.text_config)):
            return f"images are not supported for {model_type} checkpoints yet: {READS_SAID} read them " \
                   "(see docs/images.md)"
        if "image_token_id" not in self.config:
            return f"{self.path}'s config.json names no image_token_id (a text-only conversion?): use the " \
                   "original checkpoint for images"
        return None

    def load(self) -> None:
        if self.tower is None:
            if problem := self.problem():
                raise SpecError(problem)
            vision.check(self.config["model_type"])
            compat.check_sections()
            compat.check_input_embeddings()
            compat.check_additions()
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
            ids, inputs = vision.process(self.processor, text, images)
        except (ValueError, StopIteration) as e:  # Gemma 4's: more placeholders than images
            raise SpecError(f"the model's processor refuses these images ({e or type(e).__name__}): send one "
                            "image per image part") from None
        features, deep = self.tower(inputs)
        token = self.config["image_token_id"]
        blocks = image_runs(ids, token)
        if sum(t == token for t in ids) != features.shape[0] or blocks.max(initial=-1) + 1 != len(images):
            raise SpecError(f"the prompt holds {sum(t == token for t in ids)} image tokens for images of "
                            f"{features.shape[0]}: put one image part per image")
        per_image = np.bincount(blocks[blocks >= 0], minlength=len(images))
        return ids, Images(tuple(ids), features, token, len(images), np.repeat(keys, per_image), deep=tuple(deep),
                           **self.reading(inputs))

    def reading(self, inputs: dict) -> dict:
        """How the model reads its images (the `Images` fields past the keys), from the processor's `inputs`."""
        if self.config["model_type"] == "gemma4":
            return {"layer_token": self.text_config.get("pad_token_id", 0),
                    "whole": self.text_config.get("use_bidirectional_attention") == "vision"}
        merge = self.config["vision_config"].get("spatial_merge_size", 2)
        grids = tuple(tuple(grid) for grid in inputs["image_grid_thw"].tolist())
        return {"rope": MRope(grids, merge, mx.array(frequency_axes(self.text_config)))}
