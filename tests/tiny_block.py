"""Tiny block drafters (DFlash, DSpark) for the tiny targets, in their publishers' Hugging Face layouts: random
ones for comparing with the reference implementation, and ones trained briefly on the target's own greedy
continuations so that drafting those texts gets drafts accepted."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def block_config(target_config: dict, kind: str = "dflash", layers: int = 2, block_size: int = 4,
                 target_layer_ids: list[int] | None = None, layer_types: list[str] | None = None,
                 sliding_window: int | None = None, causal: bool | None = None, markov_rank: int = 16,
                 confidence: bool = False) -> dict:
    """The config.json z-lab (DFlash), Inco (DFlash2) or DeepSpec (DSpark: `block_size` counts the drafts)
    write, sized for `target_config`, with the null and missing fields their releases have and `rope_parameters`."""
    text = target_config.get("text_config", target_config)
    hidden, vocab, target_layers = text["hidden_size"], text["vocab_size"], text["num_hidden_layers"]
    ids = target_layer_ids or [0, target_layers // 2, target_layers - 1]
    options = {"mask_token_id": vocab - 1, "target_layer_ids": ids}
    if causal is not None:
        options["causal"] = causal
    config = {
        "architectures": ["DFlashDraftModel" if kind == "dflash" else "DSparkDraftModel"], "model_type": "qwen3",
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": hidden // 4, "rms_norm_eps": 1e-6,
        "vocab_size": vocab, "max_position_embeddings": 4096, "hidden_act": "silu", "attention_bias": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "rope_scaling": None,
        "sliding_window": sliding_window, "tie_word_embeddings": True, "torch_dtype": "float32",
        "num_target_layers": target_layers, "dflash_config": options,
    }
    if layer_types:
        config["layer_types"] = layer_types
    if kind == "dspark":
        options.update(projector_type="dspark", markov_rank=markov_rank, block_size=block_size - 1)
        if confidence:
            options.update(enable_confidence_head=True, confidence_head_with_markov=True)
    else:
        config["block_size"] = block_size
    if kind == "dflash2":  # Inco's DFlash2: a candidate selector, grouped dynamic convolutions, scales
        config["architectures"] = ["DFlash2DraftModel"]
        options.update(selector_top_k=8, selector_rank=8, conv_kernel_size=3, conv_group_size=16,
                       input_embedding_scale=1.5, output_multiplier=0.8)
    return config


class Recorder:
    """A decoder layer that keeps what it returns (the reference's way of reading a target layer's output)."""

    def __init__(self, layer, sink: list):
        self.layer, self.sink = layer, sink

    def __getattr__(self, name):
        return getattr(self.layer, name)

    def __call__(self, *args, **kwargs):
        out = self.layer(*args, **kwargs)
        self.sink.append(out)
        return out


def layer_outputs(model, tokens: list[int], ids: list[int]) -> tuple[mx.array, mx.array]:
    """(the outputs of layers `ids` over `tokens`, concatenated (n, len(ids) H), the logits (n, V)), from one
    forward of the mlx-lm model from an empty cache, each listed layer wrapped to keep its output."""
    from mlx_lm.models.cache import make_prompt_cache

    layers = getattr(model, "language_model", model).model.layers
    sinks = {i: [] for i in ids}
    originals = list(layers)
    for i in ids:
        layers[i] = Recorder(layers[i], sinks[i])
    try:
        logits = model(mx.array(tokens)[None], cache=make_prompt_cache(model))
    finally:
        layers[:] = originals
    return mx.concatenate([sinks[i][0] for i in ids], axis=-1)[0], logits[0]


def save_block_drafter(out_dir: str | Path, config: dict, weights: dict) -> Path:
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: np.array(v) for k, v in weights.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    return out_dir


def random_block_drafter(out_dir: str | Path, target_dir: str | Path, seed: int = 0, scale: float = 0.3,
                         **options) -> Path:
    """A block drafter with random weights (norm weights near 1, the rest `scale` / sqrt(fan-in))."""
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    config = block_config(target_config, **options)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, value in drafter_parameters(config, Path(out_dir)).items():
        if name.endswith("norm.weight"):
            weights[name] = (1 + 0.1 * rng.standard_normal(value.shape)).astype(np.float32)
        else:
            weights[name] = (scale * rng.standard_normal(value.shape) / np.sqrt(value.shape[-1])).astype(np.float32)
    return save_block_drafter(out_dir, config, weights)


def drafter_parameters(config: dict, path: Path) -> dict:
    """The drafter's parameters by their checkpoint names, as mlx-spec builds the model."""
    from mlx.utils import tree_flatten

    from mlx_spec.models.dflash import BlockDrafterModel, read_config

    return dict(tree_flatten(BlockDrafterModel(read_config(config, path), False, False).parameters()))


def train_block_drafter(out_dir: str | Path, target_dir: str | Path, texts: list[str], steps: int = 150,
                        context: int = 24, seed: int = 0, **options) -> Path:
    """A block drafter trained on the target's greedy continuations of `texts`: for every anchor position a
    (with `context` positions before it) the block [token a, MASK ...] after the features of a - context .. a - 1
    learns the target's greedy tokens a + 1 .. (attention is relative: every example sits at positions 0 ..)."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model, load_tokenizer

    from mlx_spec.models.dflash import BlockDrafterModel, read_config
    from tiny_heads import fit, greedy_continuations

    mx.random.seed(seed)
    target, target_config = load_model(Path(target_dir))
    config = block_config(target_config, **options)
    c = read_config(config, Path(out_dir))
    model = BlockDrafterModel(c, False, False)
    language = getattr(target, "language_model", target)
    embed = language.model.embed_tokens
    head = embed.as_linear if not hasattr(language, "lm_head") else language.lm_head
    k = c["drafts"]
    rows = ([], [], [])  # per example: context features, block tokens, labels
    for sequence in greedy_continuations(target, load_tokenizer(Path(target_dir)), texts, tokens=120):
        features, logits = layer_outputs(target, sequence, c["target_layer_ids"])
        choice = mx.argmax(logits, axis=-1)
        for a in range(context, len(sequence) - k - 1):
            rows[0].append(features[a - context:a])
            rows[1].append(mx.array([sequence[a]] + [c["mask"]] * (k - c["from_anchor"])))
            rows[2].append(choice[a:a + k])
    features, blocks, labels = (mx.stack(r) for r in rows)
    mx.eval(features, blocks, labels, model.parameters())
    markov = "markov_head" in model

    def loss(model):
        cache = model.make_cache()
        model.extend(features, cache, 0)
        hidden = model(embed(blocks), cache, context)[:, 0 if c["from_anchor"] else 1:]
        scores = head(hidden)
        if markov:  # teacher forcing: each position after the target's own previous token
            previous = mx.concatenate([blocks[:, :1], labels[:, :-1]], axis=1)
            scores = scores + model.markov_head(previous)
        return nn.losses.cross_entropy(scores, labels).mean()

    fit(model, loss, steps, 3e-3)
    return save_block_drafter(out_dir, config, dict(tree_flatten(model.parameters())))


def as_speculators(source: str | Path, target_dir: str | Path, out_dir: str | Path,
                   keep: list[int] | None = None) -> Path:
    """The z-lab / DeepSpec drafter in `source` in vllm-project/speculators' layout, as its DFlash converter writes
    it: the Qwen3 fields nested in `transformer_layer_config`; `aux_hidden_state_layer_ids` = z-lab's ids + 1 (it
    counts the embeddings as hidden state 0); `block_size` counting the block's positions (DSpark drafts from the
    anchor: its DeepSpec `block_size` of drafts is kept); the verifier's embedding and head copied in. With `keep`
    (sorted target ids) the draft vocabulary is those tokens: `lm_head` (and the Markov head's output map) keep
    their rows, `d2t` = kept id - draft id, `t2d` marks them."""
    from mlx_lm.utils import load_model

    source = Path(source)
    config = json.loads((source / "config.json").read_text())
    options = config["dflash_config"]
    dspark = "markov_rank" in options
    target, _ = load_model(Path(target_dir))
    language = getattr(target, "language_model", target)
    embed = language.model.embed_tokens.weight
    head = language.lm_head.weight if hasattr(language, "lm_head") else embed
    vocab = embed.shape[0]
    keep = mx.array(keep if keep is not None else list(range(vocab)))
    weights = dict(mx.load(str(source / "model.safetensors")))
    weights.update({"embed_tokens.weight": embed, "lm_head.weight": head[keep]})
    if dspark:
        weights["markov_head.markov_w2.weight"] = weights["markov_head.markov_w2.weight"][keep]
    if keep.shape[0] < vocab:
        weights["d2t"] = (keep - mx.arange(keep.shape[0])).astype(mx.int64)
        t2d = np.zeros(vocab, dtype=bool)
        t2d[np.array(keep)] = True
        weights["t2d"] = mx.array(t2d)
    layer = {k: v for k, v in config.items()
             if k not in ("architectures", "auto_map", "block_size", "dflash_config", "num_target_layers")}
    spec = {"architectures": ["DSparkSpeculator" if dspark else "DFlashSpeculator"],
            "speculators_model_type": "dspark" if dspark else "dflash", "transformer_layer_config": layer,
            "draft_vocab_size": int(keep.shape[0]), "block_size": options.get("block_size", config.get("block_size")),
            "aux_hidden_state_layer_ids": [i + 1 for i in options["target_layer_ids"]],
            "mask_token_id": options["mask_token_id"], "sliding_window_non_causal": False,
            "sample_from_anchor": dspark, "target_hidden_size": None, "speculators_version": "0.6.0",
            "speculators_config": {"algorithm": "dspark" if dspark else "dflash", "default_proposal_method": "greedy",
                                   "verifier": {"name_or_path": str(target_dir), "architectures": []}}}
    if dspark:
        spec.update(markov_rank=options["markov_rank"], markov_head_type="vanilla",
                    enable_confidence_head=bool(options.get("enable_confidence_head")),
                    confidence_head_with_markov=True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(json.dumps(spec, indent=2))
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "pt"})
    return out_dir
