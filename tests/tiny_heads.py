"""Tiny draft heads for a tiny target, in their published Hugging Face layouts: Medusa (FasterDecoding) and
EAGLE-3 (EAGLE / SpecForge), each trained briefly on the target's own greedy continuations of a few texts so
that drafting those texts gets drafts accepted. (A random model's future tokens are no simple function of its
hidden states: heads trained on other text would almost never be right.)"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def fit(model, loss, steps: int, learning_rate: float) -> None:
    """`steps` full-batch Adam steps on `loss(model)`."""
    import mlx.optimizers as optim

    optimizer = optim.Adam(learning_rate=learning_rate)
    loss_and_grad = nn.value_and_grad(model, loss)
    for _ in range(steps):
        _, grads = loss_and_grad(model)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state)


def greedy_continuations(target, tokenizer, texts: list[str], tokens: int = 160) -> list[list[int]]:
    """Each text's tokens followed by the target's own greedy continuation."""
    from mlx_lm.models.cache import make_prompt_cache

    sequences = []
    for text in texts:
        sequence = tokenizer.encode(text)
        cache = make_prompt_cache(target)
        logits = target(mx.array(sequence)[None], cache=cache)
        for _ in range(tokens):
            sequence.append(logits[0, -1].argmax().item())
            logits = target(mx.array(sequence[-1:])[None], cache=cache)
        sequences.append(sequence)
    return sequences


def output_weight(target) -> mx.array:
    return target.lm_head.weight if hasattr(target, "lm_head") else target.model.embed_tokens.weight


def build_medusa(out_dir: str | Path, target_dir: str | Path, texts: list[str], heads: int = 3, layers: int = 1,
                 steps: int = 80, seed: int = 0) -> Path:
    """Medusa heads in the FasterDecoding layout (config.json, medusa_lm_head.safetensors with keys
    "{head}.{block}.linear.{weight,bias}" and "{head}.{layers}.weight"), initialised as the reference does (the
    target's output head, zero residual blocks); head i at position t learns the token at t + i + 2."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model, load_tokenizer
    from safetensors.numpy import save_file

    from mlx_spec.models.medusa import WEIGHTS, MedusaHeads

    mx.random.seed(seed)
    target, config = load_model(Path(target_dir))
    vocab, hidden, states, labels = config["vocab_size"], config["hidden_size"], [], []
    for sequence in greedy_continuations(target, load_tokenizer(Path(target_dir)), texts):
        positions = len(sequence) - heads - 1
        states.append(target.model(mx.array(sequence)[None])[0, :positions])  # post-norm: what the heads read
        labels.append(mx.array([sequence[i + 2:i + 2 + positions] for i in range(heads)]))
    states, labels = mx.concatenate(states), mx.concatenate(labels, axis=1)
    model = MedusaHeads(heads, layers, hidden, vocab)
    for head in model.heads:
        head.out.weight = output_weight(target)
        for block in head.blocks:
            block.linear.weight = mx.zeros_like(block.linear.weight)
    mx.eval(states, model.parameters())

    def loss(model):
        return sum(nn.losses.cross_entropy(head(states), labels[i]).mean() for i, head in enumerate(model.heads))

    fit(model, loss, steps, 1e-2)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        _, head, part, *rest = name.split(".")  # heads.{i}.out.weight / heads.{i}.blocks.{j}.linear.{w}
        key = f"{head}.{layers}.weight" if part == "out" else f"{head}.{rest[0]}.{'.'.join(rest[1:])}"
        weights[key] = np.array(value)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                     "base_model_name_or_path": Path(target_dir).name}, indent=2))
    save_file(weights, str(out_dir / WEIGHTS))
    return out_dir


def eagle3_config(target_config: dict, draft_vocab: int, feature_layers: list[int] | None) -> dict:
    """An EAGLE-3 head's config.json as the EAGLE repository writes it, sized for `target_config`."""
    hidden = target_config["hidden_size"]
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": hidden // 4, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "max_position_embeddings": 4096, "vocab_size": target_config["vocab_size"],
              "draft_vocab_size": draft_vocab, "tie_word_embeddings": False, "hidden_act": "silu"}
    if feature_layers:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": feature_layers}
    return config


def target_features(target, tokens: list[int], layers: list[int]) -> tuple[mx.array, mx.array]:
    """(the inputs of `layers` concatenated (n, 3 H), the target's logits (n, V)) over `tokens`, computed layer
    by layer here (not through mlx-spec's taps)."""
    from mlx_lm.models.base import create_attention_mask

    h = target.model.embed_tokens(mx.array(tokens)[None])
    mask, features = create_attention_mask(h, None), {}
    for i, layer in enumerate(target.model.layers):
        features[i] = h
        h = layer(h, mask, cache=None)
    logits = target.lm_head(target.model.norm(h)) if hasattr(target, "lm_head") else \
        target.model.embed_tokens.as_linear(target.model.norm(h))
    return mx.concatenate([features[i] for i in layers], axis=-1)[0], logits[0]


def build_eagle3(out_dir: str | Path, target_dir: str | Path, texts: list[str], draft_vocab: int = 256,
                 feature_layers: list[int] | None = None, steps: int = 120, seed: int = 0) -> Path:
    """An EAGLE-3 head in the EAGLE / SpecForge layout (config.json, model.safetensors with `fc`, `midlayer.*`,
    `norm`, `lm_head`, `d2t`, `t2d`), its draft vocabulary the `draft_vocab` tokens the target writes most
    often, trained for the first two draft steps: row p pairs the features at p with embed(t_{p+1}) and learns
    the target's greedy choice after p + 1; then its output g with embed(t_{p+2}), the choice after p + 2."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model, load_tokenizer
    from safetensors.numpy import save_file

    from mlx_spec.seams import compat
    from mlx_spec.seams.caches import TreeKVCache, tree_forward
    from mlx_spec.models.eagle3 import Eagle3, feature_layers as default_layers, read_config

    mx.random.seed(seed)
    target, target_config = load_model(Path(target_dir))
    vocab = target_config["vocab_size"]
    config = eagle3_config(target_config, draft_vocab, feature_layers)
    head_config = read_config(config, Path(out_dir))
    layers = default_layers(head_config, target_config["num_hidden_layers"])
    rows = []  # per text: (features, embeddings of the next tokens, draft-vocabulary labels)
    sequences = greedy_continuations(target, load_tokenizer(Path(target_dir)), texts)
    for sequence in sequences:
        features, logits = target_features(target, sequence, layers)
        rows.append((features[:-1], target.model.embed_tokens(mx.array(sequence[1:])), mx.argmax(logits[1:], -1)))
    counts = np.bincount(np.concatenate([np.array(labels) for *_, labels in rows]), minlength=vocab)
    kept = np.sort(np.argsort(-counts, kind="stable")[:draft_vocab])  # draft id -> target id, ascending
    to_draft = np.full(vocab, -1)
    to_draft[kept] = np.arange(draft_vocab)
    rows = [(features, embeddings, mx.array(to_draft[np.array(labels)])) for features, embeddings, labels in rows]
    head = Eagle3(head_config, own_embedding=False)
    mx.eval(rows, head.parameters())

    compat.positioned_ropes(head)

    def loss(head):
        total = 0.0
        for features, embeddings, labels in rows:
            n = labels.shape[0] - 1
            cache = [TreeKVCache()]
            g = head(embeddings[None, :n], features[None, :n], cache)[0]  # step 1 over verified features
            # step 2 as drafting runs it (training-time test): row p feeds its own g back with the next token,
            # at position p + 1, seeing the step-1 rows up to p and itself
            attend = np.zeros((n, 2 * n), dtype=bool)
            attend[:, :n] = np.tri(n, dtype=bool)
            attend[np.arange(n), n + np.arange(n)] = True
            with tree_forward(cache, attend, list(range(1, n + 1))):
                g2 = head(embeddings[None, 1:], g[None], cache)[0]
            for out, wanted in ((g, labels[:n]), (g2, labels[1:])):
                known = wanted >= 0  # targets outside the draft vocabulary cannot be learnt
                scores = head.lm_head(head.norm(out))
                total = total + (nn.losses.cross_entropy(scores, mx.maximum(wanted, 0)) * known).sum() / known.sum()
        return total / len(rows)

    fit(head, loss, steps, 3e-3)
    weights = {name.replace("layers.0.", "midlayer."): np.array(value)  # the EAGLE repository's names
               for name, value in tree_flatten(head.parameters())}
    weights["d2t"] = (kept - np.arange(draft_vocab)).astype(np.int64)
    weights["t2d"] = to_draft >= 0
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def build_mtp_head(out_dir: str | Path, target_dir: str | Path, texts: list[str], vocab_top: int = 256,
                   steps: int = 80) -> Path:
    """An `mlx-spec train-mtp` head (reduced to `vocab_top` tokens) trained by its own Trainer on the target's
    greedy continuations of `texts`, as token ids (a random model's text does not tokenize back to its ids)."""
    from mlx_spec.loading import load_target
    from mlx_spec.models.mtp_head import head_config, save_head
    from mlx_spec.train.mtp import Trainer

    target = load_target(str(target_dir))
    sequences = greedy_continuations(target.model, target.tokenizer, texts, tokens=120)
    length = min(map(len, sequences))
    rows = np.array([s[:length] for s in sequences] + [sequences[0][:length]], dtype=np.int32)  # held out: a copy
    trainer = Trainer(target.model, target.config, rows, vocab_top, len(texts) * (length - 1), 3e-3, seed=0,
                      layer_lr=1)  # a random target: its layer holds nothing worth keeping
    for _ in range(steps):
        trainer.train_step()
    save_head(trainer.head, head_config(target.config, vocab_top, {"steps": steps}), Path(out_dir))
    return Path(out_dir)
