"""Tiny vision-language checkpoints in the published Hugging Face layout: Qwen 3.5 (dense and MoE) with its
vision tower (`model.visual.*`), its MTP layer and its processor's files, random weights drawn to the shapes of
mlx-vlm's own vision classes; and a few small images written as PNG files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tiny import (
    SPECIAL_TOKENS,
    build_tokenizer,
    qwen3_5_config,
    qwen3_5_shapes,
    qwen3_5_weights,
    write_checkpoint,
)

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen 3.5's template for content parts: an image part is its placeholder, which the processor expands
VISION_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
          "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3, "num_position_embeddings": 64,
          "deepstack_visual_indexes": []}
PROCESSOR = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
             "image_std": [0.5, 0.5, 0.5], "size": {"shortest_edge": 32 * 32, "longest_edge": 96 * 96},
             "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor"}


def build_vision_tokenizer(out_dir: str | Path) -> Path:
    return build_tokenizer(out_dir, special_tokens=SPECIAL_TOKENS + VISION_TOKENS, chat_template=VISION_TEMPLATE)


def vision_shapes(family: str, config: dict) -> dict[str, tuple[int, ...]]:
    """The vision tower's tensors under their published names (`model.visual.*`), shaped as mlx-vlm's classes
    hold them, the patch embedding in PyTorch's (out, in, t, p, p) order."""
    import importlib

    from mlx.utils import tree_flatten

    package = importlib.import_module(f"mlx_vlm.models.{family}")
    shapes = {}
    for name, value in tree_flatten(package.VisionModel(package.VisionConfig.from_dict(config)).parameters()):
        shape = tuple(value.shape)
        if name == "patch_embed.proj.weight":
            shape = (shape[0], shape[4], shape[1], shape[2], shape[3])
        shapes["model.visual." + name] = shape
    return shapes


def build_qwen3_5_vision(out_dir: str | Path, tokenizer_dir: str | Path, layers: int = 8, seed: int = 11,
                         family: str = "qwen3_5") -> Path:
    """Qwen 3.5 (dense, or `family` qwen3_5_moe) with a vision tower: M-RoPE over sections (3, 3, 2) of its 8
    rotary frequencies, so the temporal, height and width positions all turn some of them, fast ones among them
    (a small rope_theta)."""
    tokenizer_dir = Path(tokenizer_dir)
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    cfg = qwen3_5_config(family, len(vocab), 64, layers)
    cfg["text_config"].update(head_dim=32)
    cfg["text_config"]["rope_parameters"].update(mrope_section=[3, 3, 2], partial_rotary_factor=0.5, rope_theta=100.0)
    cfg["vision_config"] = {"model_type": family, "out_hidden_size": 64, **VISION}
    cfg.update({name: vocab[token] for name, token in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]})
    shapes = qwen3_5_shapes(family, cfg)
    weights = qwen3_5_weights(shapes, seed)
    rng = np.random.default_rng(seed + 1)
    for name, shape in vision_shapes(family, cfg["vision_config"]).items():
        if len(shape) == 1:
            w = (1.0 if "norm" in name and name.endswith("weight") else 0.0) + 0.1 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        weights[name] = w.astype(np.float32)
    out = write_checkpoint(Path(out_dir), cfg, weights, tokenizer_dir)
    (out / "preprocessor_config.json").write_text(json.dumps(PROCESSOR, indent=2))
    return out


def write_image(path: str | Path, width: int, height: int, seed: int) -> Path:
    """A PNG of smooth random colours."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    channels = [np.sin(rng.uniform(2, 9) * x + rng.uniform(2, 9) * y + rng.uniform(0, 6)) for _ in range(3)]
    pixels = ((np.stack(channels, -1) + 1) * 127.5).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return Path(path)
