"""A hybrid's MTP layer that agrees with its random target part of the time: its `fc` fitted by least squares on
the target's own greedy continuations of a few texts (with and without a repetition penalty), so that drafting
those texts gets drafts both accepted and rejected. (A random target's next token is no simple function of the MTP
layer's inputs: a layer fitted on other text, or left random, is almost never right.)"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np

PENALTIES = (1.0, 1.3)  # the tests decode with and without the repetition penalty
ZERO_CENTRED_NORMS = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight")


def rms_normed(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def greedy_continuation(model, prompt: list[int], tokens: int, penalty: float) -> list[int]:
    """mlx-lm's greedy decoding of `prompt` for `tokens` tokens (penalty over the last 64, as the tests)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors

    processors = make_logits_processors(repetition_penalty=penalty, repetition_context_size=64) \
        if penalty != 1.0 else None
    steps = generate_step(mx.array(prompt), model, max_tokens=tokens, logits_processors=processors)
    return [int(token) for token, _ in steps]


def fitted_fc(model, embed: np.ndarray, continuations: list[tuple[list[int], int]]) -> np.ndarray:
    """The (H, 2H) `fc` that best maps [norm(embed(t[p+1])), norm(h[p])] to the target's post-norm hidden h[p+1]
    over the positions decoded in `continuations` (a prompt, how many tokens), by ridge least squares."""
    import mlx.core as mx

    from mlx_spec.models.qwen3_5 import text_model

    inputs, outputs = [], []
    for (prompt, tokens), penalty in itertools.product(continuations, PENALTIES):
        sequence = prompt + greedy_continuation(model, prompt, tokens, penalty)
        hidden = np.array(text_model(model).model(mx.array([sequence]))[0], dtype=np.float64)
        decoded = slice(len(prompt) - 1, len(sequence) - 1)
        inputs.append(np.concatenate([rms_normed(embed[sequence[1:]]), rms_normed(hidden[:-1])], -1)[decoded])
        outputs.append(hidden[1:][decoded])
    x, y = np.concatenate(inputs), np.concatenate(outputs)
    fc = np.linalg.solve(x.T @ x + 1e-3 * np.eye(x.shape[1]), x.T @ y).T
    return np.ascontiguousarray(fc)  # safetensors.numpy would write a transposed view's buffer as it lies


def with_fitted_mtp(out_dir: str | Path, source_dir: str | Path, continuations: dict[str, int],
                    layer_scale: float = 0.1) -> Path:
    """A copy of the hybrid checkpoint in `source_dir` (the same target weights) whose MTP layer drafts the
    target's continuations of some texts (text -> how many tokens) right part of the time: `fc` fitted as above,
    its RMSNorms plain (zero-centred weights at 0), and its decoder layer's attention and MLP outputs scaled by
    `layer_scale`, so that the layer runs in full but keeps `fc`'s output nearly as it is."""
    from mlx_lm.utils import load
    from safetensors.numpy import load_file, save_file

    out_dir = Path(shutil.copytree(source_dir, out_dir))
    model, tokenizer = load(str(out_dir))
    weights = load_file(str(out_dir / "model.safetensors"))
    embed = next(w for name, w in weights.items() if name.endswith("embed_tokens.weight")).astype(np.float64)
    prompts = [(tokenizer.encode(text), tokens) for text, tokens in continuations.items()]
    weights["mtp.fc.weight"] = fitted_fc(model, embed, prompts).astype(np.float32)
    for name in ZERO_CENTRED_NORMS:
        weights[name] = np.zeros_like(weights[name])
    for name in [n for n in weights if n.startswith("mtp.layers.0.")]:
        if name.endswith("o_proj.weight") or "down_proj" in name:  # the attention's, each expert's and the MLP's
            weights[name] = weights[name] * np.float32(layer_scale)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir
