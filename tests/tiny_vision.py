"""Tiny vision-language checkpoints in the published Hugging Face layout: Qwen 3.5 (dense and MoE) with its
vision tower (`model.visual.*`), its MTP layer and its processor's files; Gemma 4 (E2B-shaped) with its vision
tower and projection (`model.vision_tower.*`, `model.embed_vision.*`), reading images whole; random weights drawn
to the shapes of mlx-vlm's own vision classes; and a few small images written as PNG files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tiny import (
    SPECIAL_TOKENS,
    build_tokenizer,
    family_config,
    family_shapes,
    qwen3_5_config,
    qwen3_5_shapes,
    qwen3_5_weights,
    random_weights,
    write_checkpoint,
)
from tiny_gemma4 import gemma4_config, gemma4_shapes, gemma4_weights

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


# Gemma 4's turn markers and image tokens (begin, end, the placeholder its processor repeats), and a template
# for content parts in its form: an image part is the placeholder
GEMMA4_TOKENS = ["<start_of_turn>", "<end_of_turn>", "<|image>", "<image|>", "<|image|>"]
GEMMA4_TEMPLATE = (
    "{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|image|>{% else %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# a tower of 2 layers over 8-pixel patches pooled 2 x 2: at most 16 image tokens an image
GEMMA4_VISION = {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 16,
                 "patch_size": 8, "position_embedding_size": 64, "pooling_kernel_size": 2,
                 "default_output_length": 16, "rms_norm_eps": 1e-6}
GEMMA4_PROCESSOR = {"image_processor": {"patch_size": 8, "max_soft_tokens": 16, "pooling_kernel_size": 2},
                    "processor_class": "Gemma4Processor"}


def build_vision_tokenizer(out_dir: str | Path) -> Path:
    return build_tokenizer(out_dir, special_tokens=SPECIAL_TOKENS + VISION_TOKENS, chat_template=VISION_TEMPLATE)


def build_gemma4_vision_tokenizer(out_dir: str | Path) -> Path:
    """A tokenizer with Gemma 4's image tokens, named where its processor looks for them."""
    out = build_tokenizer(out_dir, special_tokens=SPECIAL_TOKENS + GEMMA4_TOKENS, chat_template=GEMMA4_TEMPLATE)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["extra_special_tokens"] = {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out


def vision_shapes(family: str, config: dict, prefix: str = "model.visual.") -> dict[str, tuple[int, ...]]:
    """The image encoder's tensors under their published names (`prefix`; Gemma 4's `model.vision_tower.*` and
    `model.embed_vision.*`), shaped as mlx-vlm's classes hold them, Qwen's patch embedding in PyTorch's
    (out, in, t, p, p) order."""
    import importlib

    from mlx.utils import tree_flatten

    package = importlib.import_module(f"mlx_vlm.models.{family}")
    vision = package.VisionConfig.from_dict(config["vision_config"])
    modules = {"model.vision_tower." if family == "gemma4" else prefix: package.VisionModel(vision)}
    if family == "gemma4":
        from mlx_vlm.models.gemma4.gemma4 import MultimodalEmbedder

        modules["model.embed_vision."] = MultimodalEmbedder(vision.hidden_size, config["text_config"]["hidden_size"])
    shapes = {}
    for prefix, module in modules.items():
        for name, value in tree_flatten(module.parameters()):
            shape = tuple(value.shape)
            if name == "patch_embed.proj.weight":
                shape = (shape[0], shape[4], shape[1], shape[2], shape[3])
            shapes[prefix + name] = shape
    return shapes


def vision_weights(family: str, config: dict, seed: int, prefix: str = "model.visual.") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in vision_shapes(family, config, prefix).items():
        if len(shape) == 1:
            w = (1.0 if "norm" in name and name.endswith("weight") else 0.0) + 0.1 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        weights[name] = w.astype(np.float32)
    return weights


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
    weights = {**qwen3_5_weights(qwen3_5_shapes(family, cfg), seed), **vision_weights(family, cfg, seed + 1)}
    out = write_checkpoint(Path(out_dir), cfg, weights, tokenizer_dir)
    (out / "preprocessor_config.json").write_text(json.dumps(PROCESSOR, indent=2))
    return out


# Qwen3-VL (its text model Qwen3's, its tower's first two blocks feeding deepstack features to the first two
# decoder layers) and Qwen2.5-VL (Qwen2's text model with biases, M-RoPE sections in a row), each as published:
# (architecture, vision config, where the checkpoint keeps the text model, the vision tower)
QWEN_VL = {
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
        "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3, "num_position_embeddings": 64,
        "out_hidden_size": 64, "deepstack_visual_indexes": [0, 1]}, "model.language_model.", "model.visual."),
    "qwen3_vl_moe": ("Qwen3VLMoeForConditionalGeneration", {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
        "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3, "num_position_embeddings": 64,
        "out_hidden_size": 64, "deepstack_visual_indexes": [0, 1]}, "model.language_model.", "model.visual."),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
        "temporal_patch_size": 2, "spatial_merge_size": 2, "in_chans": 3, "window_size": 64,
        "fullatt_block_indexes": [1], "out_hidden_size": 64}, "model.", "visual."),
}


def build_qwen_vl(out_dir: str | Path, tokenizer_dir: str | Path, family: str, layers: int = 4,
                  seed: int = 17) -> Path:
    """A Qwen3-VL or Qwen2.5-VL checkpoint (`family`, see QWEN_VL) with M-RoPE sections (3, 3, 2) over its 8
    rotary frequencies and a small rope_theta, so that the temporal, height and width positions all matter."""
    tokenizer_dir = Path(tokenizer_dir)
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    architecture, vision, text_prefix, tower_prefix = QWEN_VL[family]
    text = family_config("qwen3", len(vocab), 64, layers)
    text.update(head_dim=16, rope_theta=100.0, tie_word_embeddings=False)
    shapes = family_shapes("qwen3", text)
    if family == "qwen3_vl_moe":  # every layer's experts, stored fused: gate_up (E, H, 2 I), down (E, I, H)
        experts, inter = 4, 32
        text.update(num_experts=experts, num_experts_per_tok=2, moe_intermediate_size=inter, decoder_sparse_step=1,
                    norm_topk_prob=True, mlp_only_layers=[])
        shapes = {k: v for k, v in shapes.items() if ".mlp." not in k}
        for i in range(layers):
            p = f"model.layers.{i}.mlp."
            shapes.update({p + "gate.weight": (experts, 64), p + "experts.gate_up_proj": (experts, 64, 2 * inter),
                           p + "experts.down_proj": (experts, inter, 64)})
    if family == "qwen2_5_vl":  # Qwen2's attention: biases on q, k and v, no q/k norms
        shapes = {k: v for k, v in shapes.items() if "_norm." not in k or "layernorm" in k}
        shapes.update({k.replace(".weight", ".bias"): (v[0],) for k, v in list(shapes.items())
                       if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))})
        text.update(rope_scaling={"type": "mrope", "mrope_section": [3, 3, 2]})
        del text["head_dim"]  # Qwen2's is hidden / heads: 16 too
    else:
        text.update(rope_scaling={"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True})
    weights = {(text_prefix + k[len("model."):] if k.startswith("model.") else k): w
               for k, w in random_weights("qwen3", shapes, seed).items()}
    tokens = {name: vocab[token] for name, token in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    common = {"architectures": [architecture], "model_type": family, "vision_config": {"model_type": family, **vision},
              "tie_word_embeddings": False, "eos_token_id": 0, **tokens}
    cfg = {**text, **common} if family == "qwen2_5_vl" else {
        **common, "text_config": {**text, "model_type": f"{family}_text"}}
    weights.update(vision_weights(family, cfg, seed + 1, tower_prefix))
    out = write_checkpoint(Path(out_dir), cfg, weights, tokenizer_dir)
    processor = "Qwen2_5_VLProcessor" if family == "qwen2_5_vl" else PROCESSOR["processor_class"]
    (out / "preprocessor_config.json").write_text(json.dumps({**PROCESSOR, "processor_class": processor}, indent=2))
    return out


def build_gemma4_vision(out_dir: str | Path, tokenizer_dir: str | Path, seed: int = 13) -> Path:
    """Gemma 4 (E2B-shaped: per-layer embeddings, KV-shared layers) with its vision tower and projection, reading
    each image's tokens all at once (`use_bidirectional_attention: "vision"`); its sliding window (8) is shorter
    than an image. Its token embedding is a fifth of the text fixture's: the tiny model then changes tokens rather
    than repeat its last (a Gemma input is the embedding times the square root of the width, and the head is
    the same embedding)."""
    tokenizer_dir = Path(tokenizer_dir)
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    cfg = gemma4_config(len(vocab), sliding_window=8)
    cfg["text_config"]["use_bidirectional_attention"] = "vision"
    cfg["vision_config"] = GEMMA4_VISION
    cfg.update(image_token_id=vocab["<|image|>"], boi_token_id=vocab["<|image>"], eoi_token_id=vocab["<image|>"])
    weights = {**gemma4_weights(gemma4_shapes(cfg), seed), **vision_weights("gemma4", cfg, seed + 1)}
    weights["model.language_model.embed_tokens.weight"] *= 0.2
    out = write_checkpoint(Path(out_dir), cfg, weights, tokenizer_dir)
    (out / "processor_config.json").write_text(json.dumps(GEMMA4_PROCESSOR, indent=2))
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
