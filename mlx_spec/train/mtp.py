"""`mlx-spec train-mtp`: train an MTP head (models/mtp_head.py) for a target that has none, on the user's machine.

Self-distillation on the frozen target: text is cut into sequences; the target runs once per batch and gives its
post-norm hidden states and its distribution over the head's vocabulary; row t of the head pairs embed(t_{t+1})
with the hidden state at t and learns the target's distribution at t + 2 (soft cross-entropy, so any text
works: no labels, and the head learns what the target would say, which is what acceptance measures). Given
prompts, the target first answers them (`answer_rows`): text in the shape drafting meets (a chat template, the
target's own style), half of every batch. The head's
vocabulary is the `vocab_top` tokens the training text uses most. `draft_steps` > 1 also trains chained drafts:
step j feeds the head its own output with the next token and sees what drafting lets it see (the training-time
test: one tree forward over the head's own cache). `reuse` > 1 makes more updates per target forward (the
target costs about twice the head on a CPU), on recent batches kept in memory. Held-out acceptance per draft
position (the head's greedy choice against the target's) is printed every `eval_every` steps; a checkpoint every
`checkpoint_every` steps lets a killed run resume with the same result as an unbroken one (the batches follow
from the step number; kept batches are recomputed); `max_hours` stops cleanly and writes the head trained so far.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from ..models.common import weight_rows
from ..models.mtp_head import MTPHead, check_trainable, head_config, save_head
from ..seams.caches import TreeKVCache, tree_forward
from ..seams.compat import positioned_ropes
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
    target_logits,
)

EVAL_ROWS = 16  # held-out sequences evaluated
REPLAY = 8  # batches of target features kept in memory for --reuse


class Trainer:
    def __init__(self, target, config: dict, rows: np.ndarray | None, vocab_top: int | None, batch_tokens: int,
                 lr: float, seed: int, draft_steps: int = 1, reuse: int = 1, layer_lr: float = 0.1,
                 answer_rows: np.ndarray | None = None):
        """rows, answer_rows: (n >= 2, seq_len + 1) token ids of the text and of the target's own answers (either
        may be None), the last twentieth of each (at least one) held out; batches take from both alike.
        draft_steps: how many chained drafts are trained (each feeding the head its own output, as drafting
        does); reuse: updates per batch the target runs (the extra ones on batches drawn from the last REPLAY,
        kept in memory)."""
        self.train_pools, self.held = split_pools(rows, answer_rows)
        self.target, self.config, seq_len = target, config, self.train_pools[0].shape[1] - 1
        counts = np.bincount(np.concatenate([p.ravel() for p in self.train_pools]), minlength=config["vocab_size"])
        top = min(vocab_top or config["vocab_size"], config["vocab_size"])
        ids = np.sort(np.argsort(-counts, kind="stable")[:top]).astype(np.int32)
        self.head = MTPHead(target, mx.array(ids), config.get("rms_norm_eps", 1e-6))
        h = self.head.eh_proj.weight.shape[0]  # start from x = (enorm(embedding) + hnorm(hidden)) / 2
        self.head.eh_proj.weight = mx.concatenate([mx.eye(h), mx.eye(h)], axis=1) / 2
        self.head.lm_head.weight = weight_rows(output_layer(target), mx.array(ids))
        self.target_head = self.head.lm_head.weight  # the target's rows over the head's vocabulary
        if draft_steps > 1 and not positioned_ropes(self.head):
            raise SpecError(f"--draft-steps {draft_steps} needs rotary position embeddings in the target's layers")
        self.batch, self.draft_steps, self.reuse = max(1, batch_tokens // seq_len), draft_steps, reuse
        self.seed, self.step, self.recent = seed, 0, []
        self.run = {"vocab_top": int(ids.size), "seq_len": seq_len, "batch": self.batch, "lr": lr, "seed": seed,
                    "data_tokens": {name: int(p.size) for name, p in (("answers", answer_rows), ("text", rows))
                                    if p is not None}, "draft_steps": draft_steps,
                    "reuse": reuse, "layer_lr": layer_lr}
        self.target.freeze()
        self.head.layers[0].unfreeze()  # a copy of a target layer: frozen when the target is
        if layer_lr == 0:
            self.head.layers[0].freeze()
        self.optimizer = optim.MultiOptimizer([optim.Adam(learning_rate=lr * layer_lr), optim.Adam(learning_rate=lr)],
                                              [lambda path, _: path.startswith("layers.")])
        self.loss_and_grad = nn.value_and_grad(self.head, self.loss)

    def batch_rows(self, step: int) -> np.ndarray:
        """The token rows of batch `step` (`training.batch_picks`)."""
        return np.stack([self.train_pools[pool][row] for pool, row in
                         batch_picks(step, self.batch, [len(p) for p in self.train_pools], self.seed)])

    def features(self, rows: np.ndarray):
        tokens = mx.array(rows)
        hidden = mx.stop_gradient(self.target.model(tokens))  # post-norm
        mx.eval(hidden)
        return tokens, hidden

    def rows(self, tokens) -> int:
        """The head's rows per sequence: every step of the chain has its target position in the sequence."""
        return tokens.shape[1] - 1 - self.draft_steps

    def unroll(self, head, tokens, hidden) -> list[mx.array]:
        """The head's outputs for draft steps 1..draft_steps at rows p = 0..n-1: step 1 pairs embed(x[p+1]) with
        the target's hidden[p]; step j pairs embed(x[p+j]) with step j-1's output and sees, as when drafting,
        the step-1 rows up to p and its own chain (placed at position p + j - 1). Step j predicts position p + j."""
        n, steps = self.rows(tokens), self.draft_steps
        embed = self.target.model.embed_tokens
        caches = [TreeKVCache()] if steps > 1 else None
        outs = [head(embed(tokens[:, 1:n + 1]), hidden[:, :n], caches)]
        for j in range(2, steps + 1):
            attend = np.zeros((n, j * n), dtype=bool)
            attend[:, :n] = np.tri(n, dtype=bool)
            for block in range(1, j):
                attend[np.arange(n), block * n + np.arange(n)] = True
            with tree_forward(caches, attend, list(range(j - 1, n + j - 1))):
                outs.append(head(embed(tokens[:, j:n + j]), outs[-1], caches))
        return outs

    def loss(self, head, tokens, hidden):
        """Soft cross-entropy against the target's own distribution at each step's position, averaged over steps."""
        n, total = self.rows(tokens), 0.0
        for j, out in enumerate(self.unroll(head, tokens, hidden), 1):
            target = mx.softmax(hidden[:, j:n + j] @ self.target_head.T, axis=-1)
            total = total - (target * nn.log_softmax(head.reduced_logits(out), axis=-1)).sum(-1).mean()
        return total / self.draft_steps

    def update(self, tokens, hidden) -> mx.array:
        loss, grads = self.loss_and_grad(self.head, tokens, hidden)
        self.optimizer.update(self.head, grads)
        mx.eval(self.head.parameters(), self.optimizer.state, loss)
        return loss

    def train_step(self) -> float:
        """One batch through the target, trained on, kept; then reuse - 1 updates on kept batches."""
        fresh = self.features(self.batch_rows(self.step))
        loss = self.update(*fresh)
        if self.reuse > 1:
            self.recent = [*self.recent, fresh][-REPLAY:]
            for pick in np.random.default_rng([self.seed, self.step]).integers(0, len(self.recent), self.reuse - 1):
                self.update(*self.recent[pick])
        self.step += 1
        return loss.item()

    def evaluate(self, pool: str | None = None) -> list[float]:
        """Held-out acceptance per draft position on `pool` ("answers" or "text"; default: the answers if any):
        how often draft j (the head's greedy choice) is the target's greedy token, among the rows where drafts
        1..j-1 were accepted and the text is what drafting would have fed the head (the text's token is the
        target's choice). [0] is first-draft acceptance."""
        hits, seen = np.zeros(self.draft_steps), np.zeros(self.draft_steps)
        for row in self.held[pool or next(iter(self.held))][:EVAL_ROWS]:  # one at a time: full logits are large
            tokens, hidden = self.features(row[None])
            n = self.rows(tokens)
            chain = np.ones(n, dtype=bool)
            for j, out in enumerate(self.unroll(self.head, tokens, hidden), 1):
                wanted = np.array(mx.argmax(target_logits(self.target, hidden[0, j:n + j]), -1))
                guess = np.array(self.head.ids[mx.argmax(self.head.reduced_logits(out[0]), -1)])
                hits[j - 1] += (chain & (guess == wanted)).sum()
                seen[j - 1] += chain.sum()
                chain &= (guess == wanted) & (wanted == row[j + 1:n + j + 1])
        return [float(h / s) if s else 0.0 for h, s in zip(hits, seen)]

    def report(self, acceptance: dict[str, list[float]]) -> str:
        """Like "first-draft acceptance 31.2% on answers (per draft position: 31% 20%), 25.0% on text"."""
        return "first-draft acceptance " + ", ".join(
            f"{a[0]:.1%} on {pool}" + (f" (per draft position: {' '.join(f'{x:.0%}' for x in a)})"
                                       if self.draft_steps > 1 else "") for pool, a in acceptance.items())

    def speed(self, seconds: float, first_step: int) -> str:
        return f"{(self.step - first_step) * self.batch * self.run['seq_len'] / seconds:.0f} target tokens/s"

    def save_checkpoint(self, folder) -> None:
        save_checkpoint(folder, self.step, self.run, self.head, self.optimizer)

    def load_checkpoint(self, folder) -> bool:
        """Resume from `folder`; the kept batches are run through the target again (they are not saved)."""
        step = load_checkpoint(folder, self.run, self.head, self.optimizer)
        if step is None:
            return False
        self.step = step
        if self.reuse > 1:
            self.recent = [self.features(self.batch_rows(s)) for s in range(max(0, self.step - REPLAY), self.step)]
        return True


def train(model: str, data: list[str] | None, out: str, steps: int = 2000, batch_tokens: int = 512,
          lr: float = 3e-3, max_hours: float | None = None, vocab_top: int | None = 32768, seq_len: int = 256,
          eval_every: int = 200, checkpoint_every: int = 100, seed: int = 0, draft_steps: int = 1, reuse: int = 2,
          layer_lr: float = 0.1, progress: bool = True, prompts: str | None = None,
          answer_tokens: int = 256) -> Path:
    """Train and write the head to `out`; resumes from the checkpoint a killed run with the same `out` left.
    data: text files and folders; prompts: a JSONL file of prompts the target answers first (`answer_rows`), its
    answers then half of every batch. Reports go to stderr, under a progress bar unless `progress` is False."""
    check_numbers((("--steps", steps, 1), ("--seq-len", seq_len, 2), ("--batch-tokens", batch_tokens, seq_len),
                   ("--vocab-top", 1 if vocab_top is None else vocab_top, 0), ("--eval-every", eval_every, 1),
                   ("--checkpoint-every", checkpoint_every, 1), ("--draft-steps", draft_steps, 1),
                   ("--reuse", reuse, 1), ("--answer-tokens", answer_tokens, 1)))
    if seq_len <= draft_steps:
        raise SpecError(f"--seq-len must be more than --draft-steps ({draft_steps}), got {seq_len}")
    if not lr > 0:
        raise SpecError(f"--lr must be > 0, got {lr}")
    if not 0 <= layer_lr <= 1:
        raise SpecError(f"--layer-lr must be from 0 (frozen) to 1, got {layer_lr}")
    setup = Setup("train-mtp", model, data, prompts, out, seq_len, answer_tokens, progress,
                  lambda loaded: check_trainable(loaded.config, loaded.path))
    mx.random.seed(seed)
    trainer = Trainer(setup.loaded.model, setup.loaded.config, setup.rows, vocab_top, batch_tokens, lr, seed,
                      draft_steps, reuse, layer_lr, setup.answers)
    acceptance = fit(trainer, setup, "train-mtp", steps, eval_every, checkpoint_every, max_hours, progress)
    headline = acceptance[next(iter(trainer.held))]
    record = {"steps": trainer.step, "seq_len": seq_len, "batch_tokens": trainer.batch * seq_len, "lr": lr,
              "draft_steps": draft_steps, "reuse": reuse, "layer_lr": layer_lr,
              "held_out_first_draft_acceptance": headline[0], "held_out_acceptance_per_position": acceptance,
              "data_tokens": trainer.run["data_tokens"]}
    from ..seams.files import staging

    with staging(setup.out, "writing the MTP head") as work:
        save_head(trainer.head, head_config(setup.loaded.config, int(trainer.head.ids.shape[0]), record),
                  work / "head")
        (work / "head").rename(setup.out)
    shutil.rmtree(setup.checkpoint, ignore_errors=True)
    return setup.out
