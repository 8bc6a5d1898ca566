"""`mlx-spec train-drafter --kind dflash|dspark`: train a block drafter (models/dflash.py) for a target nobody
published one for, on the user's machine, by self-distillation on the frozen target (the DFlash recipe).

Each training row's target features (the outputs of the target layers the drafter reads, and the final post-norm
hidden state) are computed once and stored beside the checkpoint in float16, so later passes over the data cost
the drafter's forward only. A step draws `anchors` random anchor positions a per row; the block [token a, MASK
...] at positions a .. a + n - 1 attends to the context features before a and to itself (all blocks of a row in
one forward: `BlockDrafterModel.every_block`), and draft j learns the target's own distribution at position
a + j (soft cross-entropy over the draft vocabulary, weighted exp(-j / GAMMA) toward early drafts). DSpark's
Markov head sees the text's token before each draft (teacher forcing); its confidence head learns each draft's
acceptance probability sum_v min(q_v, p_v) (binary cross-entropy, the backbone's outputs held fixed).

The drafter starts from the target: its decoder layers from copies of the target's last ones (what fits: a
Llama's layer fills all but the q/k norms), its final norm from the target's, its context map `fc` as the mean
of the layers read; the target's embedding and head (its rows of the `vocab_top` most used tokens) stay frozen.
`fc` trains on each feature divided by its RMS over the held-out rows (hidden states carry massive activations,
10^4 in a few features of SmolLM2's middle layers, on which every Adam step would jump) and is written with that
scale folded back in, so the published layout holds the same function.
Written in the publishers' layouts: z-lab's DFlash / DeepSpec's DSpark over the whole vocabulary (mlx-vlm, z-lab
and dflash-mlx read it), vllm-project/speculators' with a reduced vocabulary (`draft_vocab_size`, `d2t`, `t2d`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from ..models.common import float_copy, rope_settings, weight_rows
from ..models.dflash import BlockDrafterModel, read_config
from ..runners.target import hidden_reader
from ..seams import layout
from ..seams.errors import SpecError
from .common import (
    Setup,
    batch_picks,
    check_numbers,
    fit,
    load_checkpoint,
    output_layer,
    save_checkpoint,
    split_pools,
)

KINDS = ("dflash", "dspark")
GAMMA = 4.0  # the loss weight of draft j is exp(-j / GAMMA) (speculators' default for blocks of 8)
EVAL_ROWS = 16  # held-out rows evaluated per pool
EVAL_ANCHORS = 64  # anchors per held-out forward


def spread_layers(layers: int, count: int) -> list[int]:
    """z-lab's choice of target layers: `count` spread evenly from layer 1 to layer `layers` - 3."""
    start, end = 1, layers - 3 if layers > 4 else layers - 1
    return sorted({round(start + i * (end - start) / max(1, count - 1)) for i in range(count)})


def drafter_config(kind: str, target_config: dict, layers: int, positions: int, layer_ids: list[int], mask: int,
                   markov_rank: int, draft_vocab: int) -> dict:
    """config.json of the drafter in its publisher's layout: z-lab's DFlash or DeepSpec's DSpark over the whole
    vocabulary, speculators' over a reduced one (`draft_vocab`). `positions`: the block's (DFlash drafts one
    fewer; DSpark drafts from the anchor)."""
    text = target_config.get("text_config", target_config)
    rope = {k: v for k, v in (text.get("rope_parameters") or {}).items() if k != "partial_rotary_factor"}
    theta, scaling = rope_settings({**text, "rope_parameters": rope, "partial_rotary_factor": None}, "the target")
    heads = text["num_attention_heads"]
    layer = {"model_type": "qwen3", "hidden_size": text["hidden_size"],
             "intermediate_size": text.get("intermediate_size") or 4 * text["hidden_size"],
             "num_hidden_layers": layers, "num_attention_heads": heads,
             "num_key_value_heads": text.get("num_key_value_heads") or heads,
             "head_dim": text.get("head_dim") or text["hidden_size"] // heads,
             "rms_norm_eps": text.get("rms_norm_eps") or 1e-6, "vocab_size": text["vocab_size"],
             "max_position_embeddings": text.get("max_position_embeddings") or 32768, "rope_theta": theta,
             "rope_scaling": scaling, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
             "torch_dtype": "float32"}
    dspark = kind == "dspark"
    markov = {"markov_rank": markov_rank, "markov_head_type": "vanilla", "enable_confidence_head": True,
              "confidence_head_with_markov": True}
    if draft_vocab == text["vocab_size"]:  # z-lab's DFlashDraftModel, DeepSpec's DSpark
        options = {"mask_token_id": mask, "target_layer_ids": layer_ids}
        if dspark:  # DeepSpec's block_size counts the drafts
            options.update(projector_type="dspark", block_size=positions, sample_from_anchor=True, **markov)
        return {"architectures": ["DSparkDraftModel" if dspark else "DFlashDraftModel"], **layer,
                "block_size": positions, "num_target_layers": text["num_hidden_layers"], "dflash_config": options}
    return {"architectures": ["DSparkSpeculator" if dspark else "DFlashSpeculator"],
            "speculators_model_type": kind, "transformer_layer_config": layer, "draft_vocab_size": draft_vocab,
            "block_size": positions, "aux_hidden_state_layer_ids": [i + 1 for i in layer_ids],  # vLLM's count
            "mask_token_id": mask, "sliding_window_non_causal": False, "sample_from_anchor": dspark,
            "target_hidden_size": None, **(markov if dspark else {}),
            "speculators_config": {"algorithm": kind, "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy",
                                                         "speculative_tokens": positions - (not dspark)}]}}


class FeatureStore:
    """The target's features of each training row (the layers read, then the final post-norm hidden state),
    computed once and kept in float16 in `folder`/features.npy; `done` marks the rows written (a kill loses at most
    the row being written)."""

    def __init__(self, folder: Path, rows: int, length: int, width: int, key: str):
        """key: what the features follow from (the target, the layers read, the rows); stored features of another
        key are computed afresh."""
        folder.mkdir(parents=True, exist_ok=True)
        data, done, stamp = folder / "features.npy", folder / "features-done.npy", folder / "features-key.txt"
        shape = (rows, length, width)
        fresh = (not data.exists() or np.load(data, mmap_mode="r").shape != shape or not stamp.exists()
                 or stamp.read_text() != key)
        if fresh:
            done.unlink(missing_ok=True)
            stamp.write_text(key)
        self.data = np.lib.format.open_memmap(data, mode="w+" if fresh else "r+", dtype=np.float16, shape=shape)
        self.done_file = done
        self.done = np.zeros(rows, dtype=bool) if fresh or not done.exists() else np.load(done)

    def rows(self, indices: list[int], compute) -> np.ndarray:
        """The features of rows `indices` (len, length, width), computing those missing by `compute(indices)`."""
        missing = sorted({i for i in indices if not self.done[i]})
        if missing:
            self.data[missing] = compute(missing)
            self.data.flush()
            self.done[missing] = True
            np.save(self.done_file.with_suffix(".partial.npy"), self.done)
            self.done_file.with_suffix(".partial.npy").replace(self.done_file)
        return np.asarray(self.data[indices])


class BlockTrainer:
    def __init__(self, target, target_config: dict, config: dict, rows: np.ndarray | None,
                 answer_rows: np.ndarray | None, vocab_ids: np.ndarray | None, batch_tokens: int, lr: float,
                 seed: int, anchors: int, store: Path):
        """config: the drafter's config.json (`drafter_config`); rows, answer_rows: (n >= 2, L) token rows of the
        text and of the target's answers; vocab_ids: the draft vocabulary (sorted target ids; None: all)."""
        self.train_pools, self.held = split_pools(rows, answer_rows)
        self.target, self.config, self.c = target, config, read_config(config, Path("the drafter"))
        length = self.train_pools[0].shape[1]
        self.k, self.first = self.c["drafts"], 0 if self.c["from_anchor"] else 1
        reduced = vocab_ids is not None
        self.model = BlockDrafterModel(self.c, False, reduced)
        self.embed = layout.input_embedding(target)
        self.ids = None if vocab_ids is None else mx.array(vocab_ids)
        self.target_head = weight_rows(output_layer(target), self.ids) if reduced else None
        self.output = layout.output_head(target)
        self.head = self.model.lm_head if reduced else self.output
        if reduced:
            self.model.lm_head.weight = self.target_head
        self.softcap = target_config.get("text_config", target_config).get("final_logit_softcapping")
        self.start_from_target()
        self.read_layers = hidden_reader(target, [i + 1 for i in self.c["target_layer_ids"]])
        self.read_final = hidden_reader(target, "post")
        self.batch, self.anchors, self.seed, self.step = max(1, batch_tokens // length), anchors, seed, 0
        self.offsets = np.cumsum([0] + [len(p) for p in self.train_pools])
        width = self.model.fc.weight.shape[1] + self.c["hidden_size"]
        key = hashlib.sha256(json.dumps([target_config, self.c["target_layer_ids"]], sort_keys=True).encode())
        for pool in self.train_pools:
            key.update(pool.tobytes())
        self.store = FeatureStore(store, int(self.offsets[-1]), length, width, key.hexdigest())
        self.computed, self.trained, self.scale = 0, 0, 1.0
        self.target_seconds = 0.0  # spent computing features, for the target's own rate
        self.held_features = {pool: self.split(np.concatenate([self.compute(rows[i:i + 1])
                                                               for i in range(min(EVAL_ROWS, len(rows)))]))
                              for pool, rows in self.held.items()}
        layers = next(iter(self.held_features.values()))[0]
        self.scale = mx.maximum(mx.sqrt(mx.mean(layers.reshape(-1, layers.shape[-1]) ** 2, axis=0)), 1e-3)
        self.held_features = {pool: (layers / self.scale, final) for pool, (layers, final) in
                              self.held_features.items()}
        self.run = {"kind": self.c["kind"], "drafts": self.k, "layers": self.c["layers"],
                    "target_layer_ids": self.c["target_layer_ids"], "draft_vocab": self.c["draft_vocab"],
                    "seq_len": length - 1, "batch": self.batch, "lr": lr, "seed": seed, "anchors": anchors,
                    "data_tokens": {name: int(p.size) for name, p in (("answers", answer_rows), ("text", rows))
                                    if p is not None}}
        target.freeze()
        if reduced:
            self.model.lm_head.freeze()
        self.optimizer = optim.Adam(learning_rate=lr)
        self.loss_and_grad = nn.value_and_grad(self.model, self.loss)

    def start_from_target(self) -> None:
        """Decoder layers from the target's last ones (each weight whose shape fits), the final norm from the
        target's, `fc` the mean of the layers read; the Markov output and confidence weights at zero."""
        source = layout.decoder_layers(self.target)
        for layer, copy in zip(self.model.layers, source[-len(self.model.layers):]):
            weights = dict(tree_flatten(float_copy(copy).parameters()))
            mine = dict(tree_flatten(layer.parameters()))
            layer.load_weights([(k, v) for k, v in weights.items() if k in mine and v.shape == mine[k].shape],
                               strict=False)
        norm = layout.final_norm(self.target)
        if norm.weight.shape == self.model.norm.weight.shape:
            self.model.norm.weight = mx.array(norm.weight)
        h, count = self.c["hidden_size"], len(self.c["target_layer_ids"])
        self.model.fc.weight = mx.concatenate([mx.eye(h)] * count, axis=1) / count
        if "markov_head" in self.model:
            self.model.markov_head.markov_w2.weight = mx.zeros_like(self.model.markov_head.markov_w2.weight)
            self.model.confidence_head.proj.weight = mx.zeros_like(self.model.confidence_head.proj.weight)
        mx.eval(self.model.parameters())

    def compute(self, rows: np.ndarray) -> np.ndarray:
        """The target's features of token rows (n, L): the layers read, then the final post-norm hidden state."""
        start = time.perf_counter()
        self.target(mx.array(rows))
        features = np.array(mx.concatenate([self.read_layers(), self.read_final()], axis=-1).astype(mx.float16))
        self.computed += rows.size
        self.target_seconds += time.perf_counter() - start
        return features

    def split(self, features: np.ndarray) -> tuple[mx.array, mx.array]:
        """(the layers read, each feature divided by its scale; the final hidden states) of stored features."""
        features = mx.array(features).astype(mx.float32)
        width = self.model.fc.weight.shape[1]
        return features[..., :width] / self.scale, features[..., width:]

    def target_scores(self, final: mx.array, whole: bool = False) -> mx.array:
        """The target's logits over the draft vocabulary (`whole`: over its own) from its final hidden states."""
        logits = final @ self.target_head.T if self.ids is not None and not whole else self.output(final)
        return mx.tanh(logits / self.softcap) * self.softcap if self.softcap else logits

    def draft(self, model, tokens: mx.array, layers: mx.array, anchors: mx.array):
        """(draft logits (B, m, k, D), hidden states (B, m, k, H), the token before each draft (B, m, k)) of the
        blocks at `anchors` (B, m); the Markov bias from the text's token before each draft."""
        b, m = anchors.shape
        blocks = mx.full((b, m, self.k + self.first), self.c["mask"], dtype=mx.int32)
        blocks[:, :, 0] = mx.take_along_axis(tokens, anchors, axis=1)
        hidden = model.every_block(layers, self.embed(blocks), anchors)[:, :, self.first:]
        logits = self.head(hidden)
        previous = mx.take_along_axis(tokens, (anchors[..., None] + mx.arange(self.k)).reshape(b, -1),
                                      axis=1).reshape(b, m, self.k)
        if "markov_head" in model:
            logits = logits + model.markov_head(previous)
        return logits, hidden, previous

    def wanted(self, final: mx.array, anchors: mx.array, whole: bool = False) -> mx.array:
        """The target's logits (B, m, k, D) at the positions each block's drafts predict from: a + j."""
        b, m = anchors.shape
        at = (anchors[..., None] + mx.arange(self.k)).reshape(b, -1)
        return self.target_scores(mx.take_along_axis(final, at[..., None], axis=1), whole).reshape(b, m, self.k, -1)

    def loss(self, model, tokens, layers, final, anchors):
        logits, hidden, previous = self.draft(model, tokens, layers, anchors)
        p = mx.softmax(self.wanted(final, anchors), axis=-1)
        log_q = nn.log_softmax(logits, axis=-1)
        weight = mx.exp(-mx.arange(self.k) / GAMMA)
        total = (-(p * log_q).sum(-1) * weight).sum(-1).mean() / weight.sum()
        if "confidence_head" in model:
            accept = mx.stop_gradient(mx.minimum(mx.exp(log_q), p).sum(-1))
            codes = mx.stop_gradient(model.markov_head.markov_w1(previous))
            guess = mx.clip(model.confidence_head(mx.stop_gradient(hidden), codes), 1e-6, 1 - 1e-6)
            bce = -(accept * mx.log(guess) + (1 - accept) * mx.log(1 - guess))
            total = total + (bce * weight).sum(-1).mean() / weight.sum()
        return total

    def anchors_of(self, step: int, count: int, length: int) -> mx.array:
        """(count, anchors) sorted random anchor positions 1 .. length - k, drawn from the step number."""
        rng = np.random.default_rng([self.seed, step, 7])
        valid = length - self.k
        return mx.array(np.sort(np.stack([rng.choice(valid, min(self.anchors, valid), replace=False) + 1
                                          for _ in range(count)]), axis=1))

    def train_step(self) -> float:
        picks = batch_picks(self.step, self.batch, [len(p) for p in self.train_pools], self.seed)
        tokens = np.stack([self.train_pools[pool][row] for pool, row in picks])
        indices = [int(self.offsets[pool]) + row for pool, row in picks]
        features = self.store.rows(indices, lambda missing: self.compute(
            np.stack([tokens[indices.index(i)] for i in missing])))
        layers, final = self.split(features)
        loss, grads = self.loss_and_grad(self.model, mx.array(tokens), layers, final,
                                         self.anchors_of(self.step, len(tokens), tokens.shape[1]))
        self.optimizer.update(self.model, grads)
        mx.eval(self.model.parameters(), self.optimizer.state, loss)
        self.step, self.trained = self.step + 1, self.trained + tokens.size
        return loss.item()

    def evaluate(self, pool: str | None = None) -> list[float]:
        """Held-out acceptance per draft position on `pool` (default: the answers if any): how often draft j (the
        drafter's greedy choice) is the target's greedy token, at every anchor of the first EVAL_ROWS held-out
        rows where drafts 0 .. j - 1 were accepted and the text is what decoding would have (the target's
        choice)."""
        pool = pool or next(iter(self.held))
        rows = self.held[pool][:EVAL_ROWS]
        layers, final = self.held_features[pool]
        hits, seen = np.zeros(self.k), np.zeros(self.k)
        positions = np.arange(1, rows.shape[1] - self.k)  # the text token after the last draft too
        for start in range(0, len(positions), EVAL_ANCHORS):
            anchors = mx.array(np.broadcast_to(positions[start:start + EVAL_ANCHORS], (len(rows), len(
                positions[start:start + EVAL_ANCHORS]))))
            logits, _, _ = self.draft(self.model, mx.array(rows), layers, anchors)
            guess = mx.argmax(logits, -1)  # in the target's ids, as the target's own greedy choices
            guess = np.array(guess if self.ids is None else self.ids[guess])
            wanted = np.array(mx.argmax(self.wanted(final, anchors, whole=True), -1))
            text = np.take_along_axis(rows, (np.array(anchors)[..., None] + np.arange(1, self.k + 1)).reshape(
                len(rows), -1), axis=1).reshape(guess.shape)
            chain = np.ones(guess.shape[:2], dtype=bool)
            for j in range(self.k):
                hits[j] += (chain & (guess[..., j] == wanted[..., j])).sum()
                seen[j] += chain.sum()
                chain &= (guess[..., j] == wanted[..., j]) & (wanted[..., j] == text[..., j])
        return [float(h / s) if s else 0.0 for h, s in zip(hits, seen)]

    def report(self, acceptance: dict[str, list[float]]) -> str:
        """Like "accepted 2.31 of 7 drafts a block on answers (per position: 71% 55% ...), 1.20 on text", the
        expected accepted length from the per-position acceptance (speculators' EAL)."""
        def expected(a):
            return sum(np.cumprod(a))

        return "accepted " + ", ".join(f"{expected(a):.2f} of {self.k} drafts a block on {pool} (per position: "
                                       f"{' '.join(f'{x:.0%}' for x in a)})" for pool, a in acceptance.items())

    def speed(self, seconds: float, first_step: int) -> str:
        """The target's own rate while it computes features (none once all are stored), the drafter's overall."""
        target = f"{self.computed / self.target_seconds:.0f} target tokens/s" if self.target_seconds else "no target"
        return f"{target}, {self.trained / seconds:.0f} trained tokens/s"

    def save(self, folder: Path, record: dict) -> None:
        """The drafter in its publisher's layout (`drafter_config`), `record` as its config's "training"."""
        weights = {**dict(tree_flatten(self.model.parameters())), "fc.weight": self.model.fc.weight / self.scale}
        if self.ids is not None:  # speculators' maps: target id = draft id + d2t[draft id]; t2d marks the kept ids
            weights["d2t"] = (self.ids - mx.arange(self.ids.shape[0])).astype(mx.int64)
            t2d = np.zeros(self.c["vocab_size"], dtype=bool)
            t2d[np.array(self.ids)] = True
            weights["t2d"] = mx.array(t2d)
        folder.mkdir(parents=True)
        mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({**self.config, "training": record}, indent=2))

    def save_checkpoint(self, folder) -> None:
        save_checkpoint(folder, self.step, self.run, self.model, self.optimizer)

    def load_checkpoint(self, folder) -> bool:
        step = load_checkpoint(folder, self.run, self.model, self.optimizer)
        self.step = self.step if step is None else step
        return step is not None


def mask_token(pools: list[np.ndarray], vocab: int) -> int:
    """The block's MASK token: the last id the training rows never use (else the least used)."""
    counts = np.bincount(np.concatenate([p.ravel() for p in pools]), minlength=vocab)[:vocab]
    return int(vocab - 1 - np.argmin(counts[::-1]))


def train_drafter(kind: str, model: str, data: list[str] | None, out: str, steps: int = 2000,
                  batch_tokens: int = 512, lr: float = 1e-3, max_hours: float | None = None,
                  vocab_top: int | None = 32768, seq_len: int = 256, eval_every: int = 200,
                  checkpoint_every: int = 100, seed: int = 0, progress: bool = True, prompts: str | None = None,
                  answer_tokens: int = 256, block_size: int = 8, layers: int = 1, target_layers: int = 3,
                  anchors: int = 64, markov_rank: int = 256) -> Path:
    """Train a `kind` block drafter for `model` and write it to `out` (resuming from the checkpoint a killed run
    with the same `out` left); the options as train_mtp.train's, and the drafter's shape: `block_size` positions
    a block, `layers` decoder layers reading `target_layers` of the target's, `anchors` blocks a row a step."""
    if kind not in KINDS:
        raise SpecError(f"--kind {kind}: train-drafter trains {', '.join(('mtp',) + KINDS)}")
    check_numbers((("--steps", steps, 1), ("--seq-len", seq_len, 2), ("--batch-tokens", batch_tokens, seq_len),
                   ("--vocab-top", 1 if vocab_top is None else vocab_top, 0), ("--eval-every", eval_every, 1),
                   ("--checkpoint-every", checkpoint_every, 1), ("--answer-tokens", answer_tokens, 1),
                   ("--block-size", block_size, 2), ("--layers", layers, 1), ("--target-layers", target_layers, 1),
                   ("--anchors", anchors, 1), ("--markov-rank", markov_rank, 1)))
    drafts = block_size - (kind == "dflash")
    if seq_len <= drafts:
        raise SpecError(f"--seq-len must be more than the block's {drafts} drafts, got {seq_len}")
    if not lr > 0:
        raise SpecError(f"--lr must be > 0, got {lr}")

    def check_target(loaded):
        count = len(layout.decoder_layers(loaded.model))
        if count < 2:
            raise SpecError(f"{loaded.path} has {count} decoder layer: a block drafter reads the target's "
                            "intermediate layers")

    setup = Setup("train-drafter", model, data, prompts, out, seq_len, answer_tokens, progress, check_target)
    text = setup.loaded.config.get("text_config", setup.loaded.config)
    vocab = text["vocab_size"]
    pools = split_pools(setup.rows, setup.answers)[0]
    counts = np.bincount(np.concatenate([p.ravel() for p in pools]), minlength=vocab)[:vocab]
    vocab_ids = (np.sort(np.argsort(-counts, kind="stable")[:vocab_top]).astype(np.int32)
                 if vocab_top and vocab_top < vocab else None)
    ids = spread_layers(text["num_hidden_layers"], target_layers)
    config = drafter_config(kind, setup.loaded.config, layers, block_size, ids, mask_token(pools, vocab),
                            markov_rank, vocab if vocab_ids is None else len(vocab_ids))
    mx.random.seed(seed)
    trainer = BlockTrainer(setup.loaded.model, setup.loaded.config, config, setup.rows, setup.answers, vocab_ids,
                           batch_tokens, lr, seed, anchors, setup.checkpoint / "features")
    acceptance = fit(trainer, setup, f"train-drafter {kind}", steps, eval_every, checkpoint_every, max_hours,
                     progress)
    record = {"steps": trainer.step, "seq_len": seq_len, "batch_tokens": trainer.batch * (seq_len + 1), "lr": lr,
              "anchors": anchors, "held_out_acceptance_per_position": acceptance,
              "held_out_accepted_per_block": {pool: float(sum(np.cumprod(a))) for pool, a in acceptance.items()},
              "data_tokens": trainer.run["data_tokens"]}
    from ..seams.files import staging

    with staging(setup.out, f"writing the {kind} drafter") as work:
        trainer.save(work / "drafter", record)
        (work / "drafter").rename(setup.out)
    shutil.rmtree(setup.checkpoint, ignore_errors=True)
    return setup.out
