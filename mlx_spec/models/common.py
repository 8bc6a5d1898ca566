"""What the model files share: loading weights exactly, reduced draft vocabularies, RoPE settings, float copies."""

import copy
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..seams.errors import SpecError


def materialize(model) -> None:
    """Evaluate every array a module tree holds, private ones too (RoPE frequency tables are built lazily at
    construction). MLX arrays belong to the stream of the thread that made them: one left unevaluated here
    fails when the chat's generation thread first uses it."""
    mx.eval([value for module in model.modules() for value in module.values() if isinstance(value, mx.array)])


def target_rows(d2t: mx.array, vocab: int) -> mx.array:
    """For each of the target's `vocab` tokens, its row in a reduced draft vocabulary whose draft id d is target
    id d + d2t[d] (the EAGLE / speculators map); the draft vocabulary's size (past the last row) for the others."""
    draft_vocab = d2t.shape[0]
    index = mx.full((vocab,), draft_vocab, dtype=mx.int32)
    index[mx.arange(draft_vocab) + d2t.astype(mx.int32)] = mx.arange(draft_vocab, dtype=mx.int32)
    return index


def to_target_vocabulary(scores: mx.array, index: mx.array) -> mx.array:
    """Scores over a head's reduced vocabulary (n, R) as scores over the target's (n, V): `index` maps each target
    token to its row, R (past the last) for tokens outside it, which score -inf."""
    padded = mx.concatenate([scores, mx.full((*scores.shape[:-1], 1), -mx.inf, dtype=scores.dtype)], axis=-1)
    return mx.take(padded, index, axis=-1)


def rope_settings(config: dict, path: Path, layer_type: str = "full_attention") -> tuple[float, dict | None]:
    """(base, scaling) of a drafter's rotary embedding from its Hugging Face config: `rope_parameters` (transformers
    5; flat, or one entry per layer type) or `rope_theta` / `rope_scaling`, nulls meaning the defaults (base 10000,
    no scaling: None); a partial rotary embedding, which no drafter here applies, is a SpecError."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if any(isinstance(value, dict) for value in rope.values()):
        rope = dict(rope.get(layer_type) or rope.get("full_attention") or {})
    theta = rope.pop("rope_theta", None) or config.get("rope_theta") or 10000.0
    partial = rope.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise SpecError(f"{path}: a partial rotary embedding (partial_rotary_factor {partial}) is not read yet: use "
                        "a drafter whose RoPE covers each head")
    return theta, None if rope.get("rope_type", rope.get("type")) in (None, "default") else rope


def load_exactly(module, weights: dict, misfit: str) -> None:
    """Load `weights` (name -> array) into `module`, every parameter and nothing else, and `materialize` it; a
    mismatch is a SpecError: `misfit` with "{}" standing for what did not fit."""
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise SpecError(misfit.format(e)) from None
    materialize(module)


def weight_rows(module, rows: mx.array) -> mx.array:
    """Rows of a Linear's or Embedding's weight, dequantized when the module is quantized."""
    if "scales" not in module:
        return module.weight[rows]
    biases = module["biases"][rows] if "biases" in module else None
    return mx.dequantize(module.weight[rows], module.scales[rows], biases, module.group_size, module.bits,
                         mode=module.mode)


def float_copy(module: nn.Module) -> nn.Module:
    """A deep copy of `module` whose quantized linear layers are float ones (trainable, and loadable from a
    float checkpoint)."""
    from mlx.utils import tree_unflatten

    module = copy.deepcopy(module)
    floats = []
    for path, part in module.named_modules():
        if isinstance(part, nn.QuantizedLinear):
            weight = weight_rows(part, mx.arange(part.weight.shape[0]))
            linear = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in part)
            linear.weight = weight
            if "bias" in part:
                linear.bias = part.bias
            floats.append((path, linear))
    module.update_modules(tree_unflatten(floats))
    return module


def load_weights(file: Path | str, return_metadata: bool = False):
    """mx.load of one safetensors file, or a SpecError for a truncated or corrupt one."""
    try:
        return mx.load(str(file), return_metadata=return_metadata)
    except (RuntimeError, ValueError, OSError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(f"cannot read {file} ({reason}): the file is truncated or corrupt; re-download or "
                        "re-convert it") from None


def read_safetensors(path: Path, what: str) -> dict:
    """Every tensor of the *.safetensors files in `path`, a checkpoint that declares itself `what` (for errors)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickle = next((p.name for p in path.glob("*.bin")), None) or next((p.name for p in path.glob("*.pt")), None)
        if pickle:
            raise SpecError(f"{path} holds {pickle}, a PyTorch pickle mlx-spec does not read: save its state dict "
                            "as model.safetensors (safetensors.torch.save_file) and retry")
        raise SpecError(f"{path} declares {what} but holds no *.safetensors weights: re-download it")
    weights = {}
    for file in files:
        weights.update(load_weights(file))
    return weights
