"""Thin extensions of mlx-lm's model classes, one module per architecture family."""

from pathlib import Path

import mlx.core as mx

from ..errors import SpecError


def materialize(model) -> None:
    """Evaluate every array a module tree holds, private ones too (RoPE frequency tables are built lazily at
    construction). MLX arrays belong to the stream of the thread that made them: one left unevaluated here
    fails when the chat's generation thread first uses it."""
    mx.eval([value for module in model.modules() for value in module.values() if isinstance(value, mx.array)])


def to_target_vocabulary(scores: mx.array, index: mx.array) -> mx.array:
    """Scores over a head's reduced vocabulary (n, R) as scores over the target's (n, V): `index` maps each target
    token to its row, R (past the last) for tokens outside it, which score -inf."""
    padded = mx.concatenate([scores, mx.full((*scores.shape[:-1], 1), -mx.inf, dtype=scores.dtype)], axis=-1)
    return mx.take(padded, index, axis=-1)


def load_exactly(module, weights: dict, misfit: str) -> None:
    """Load `weights` (name -> array) into `module`, every parameter and nothing else, and `materialize` it; a
    mismatch is a SpecError: `misfit` with "{}" standing for what did not fit."""
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise SpecError(misfit.format(e)) from None
    materialize(module)


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
        weights.update(mx.load(str(file)))
    return weights
