"""Medusa heads (Cai et al. 2024), in the FasterDecoding/Medusa checkpoint layout.

Head i = `medusa_num_layers` residual blocks x + SiLU(W x + b), then a linear map to the vocabulary, over the
target's last (post-norm) hidden state h_t; head i scores the token at t + i + 2 (head 0: the token after the
one the target's own head scores). A checkpoint directory holds `config.json` (`medusa_num_heads`,
`medusa_num_layers`, `base_model_name_or_path`) and `medusa_lm_head.safetensors` with the keys of the
reference's `nn.ModuleList` of `nn.Sequential`s: `{head}.{block}.linear.weight`, `{head}.{block}.linear.bias`,
`{head}.{medusa_num_layers}.weight`.
"""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..seams.errors import SpecError
from .common import load_exactly, load_weights

WEIGHTS = "medusa_lm_head.safetensors"


class ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def __call__(self, x: mx.array) -> mx.array:
        return x + nn.silu(self.linear(x))


class Head(nn.Module):
    def __init__(self, hidden: int, vocab: int, layers: int):
        super().__init__()
        self.blocks = [ResBlock(hidden) for _ in range(layers)]
        self.out = nn.Linear(hidden, vocab, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class MedusaHeads(nn.Module):
    def __init__(self, num_heads: int, num_layers: int, hidden: int, vocab: int):
        super().__init__()
        self.heads = [Head(hidden, vocab, num_layers) for _ in range(num_heads)]

    def __call__(self, hidden: mx.array, k: int) -> mx.array:
        """Logits (k, V) of heads 0..k-1 over one hidden state (1, H)."""
        return mx.concatenate([head(hidden) for head in self.heads[:k]])


def is_medusa(config: dict) -> bool:
    return "medusa_num_heads" in config


def medusa_shape(config: dict, path: Path) -> tuple[int, int]:
    """(heads, residual blocks per head) from config.json, a null block count meaning the reference's 1."""
    heads, layers = config.get("medusa_num_heads"), config.get("medusa_num_layers") or 1
    if not isinstance(heads, int) or heads < 1 or not isinstance(layers, int):
        raise SpecError(f"{path}: config.json gives medusa_num_heads {heads!r} and medusa_num_layers {layers!r}, "
                        "not counts: re-download the heads")
    return heads, layers


def load_medusa(path: Path, config: dict) -> MedusaHeads:
    file = path / WEIGHTS
    if not file.exists():
        if (path / "medusa_lm_head.pt").exists():
            raise SpecError(f"{path} holds medusa_lm_head.pt, a PyTorch pickle mlx-spec does not read: save its "
                            f"state dict as {WEIGHTS} (safetensors.torch.save_file) and retry")
        raise SpecError(f"{path} declares Medusa heads but holds no {WEIGHTS}: re-download the heads")
    heads, layers = medusa_shape(config, path)
    weights, renamed = load_weights(file), {}
    for name, value in weights.items():
        match = re.fullmatch(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)", name)
        head, block, kind = (int(match[1]), int(match[2]), match[3]) if match else (heads, 0, "")
        if head >= heads or (block == layers) != (kind == "weight") or block > layers:
            raise SpecError(f"{file}: unexpected tensor {name!r} for {heads} heads of {layers} block(s) (the "
                            "FasterDecoding/Medusa layout is expected)")
        renamed[f"heads.{head}.out.weight" if block == layers else f"heads.{head}.blocks.{block}.{kind}"] = value
    vocab, hidden = weights[f"0.{layers}.weight"].shape if f"0.{layers}.weight" in weights else (0, 0)
    model = MedusaHeads(heads, layers, hidden, vocab)
    load_exactly(model, renamed, f"{file} does not match its config.json ({{}}): re-download the heads")
    return model
