"""`mlx-spec train-mtp`: train an MTP head (models/mtp_head.py) for a target that has none, on the user's machine.

Self-distillation on the frozen target: text is cut into sequences; the target runs once per batch and gives its
post-norm hidden states and its distribution over the head's vocabulary; row t of the head pairs embed(t_{t+1})
with the hidden state at t and learns the target's distribution at t + 2 (soft cross-entropy, so any text
works: no labels, and the head learns what the target would say, which is what acceptance measures). The head's
vocabulary is the `vocab_top` tokens the training text uses most. Held-out first-draft acceptance (the head's
greedy choice against the target's) is printed every `eval_every` steps; a checkpoint every `checkpoint_every`
steps lets a killed run resume with the same result as an unbroken one (the batches follow from the step
number); `max_hours` stops cleanly and writes the head trained so far.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from .errors import SpecError
from .files import check_writable
from .models.mtp_head import MTPHead, check_trainable, head_config, save_head

TEXT_SUFFIXES = (".py", ".md", ".txt", ".rst", ".json", ".toml", ".c", ".h", ".js", ".ts", ".rs", ".go", ".java")
CHECKPOINT = ".train-mtp-checkpoint"
EVAL_ROWS = 16  # held-out sequences evaluated


def text_files(data: list[str]) -> list[Path]:
    """The text files named, and those under the folders named (by suffix), sorted."""
    files = []
    for entry in data:
        path = Path(entry).expanduser()
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        elif path.is_file():
            files.append(path)
        else:
            raise SpecError(f"--data {entry}: no such file or folder")
    if not files:
        raise SpecError(f"--data {' '.join(data)} holds no text files ({', '.join(TEXT_SUFFIXES)}): give some text "
                        "to train on")
    return files


def sequences(tokenizer, files: list[Path], seq_len: int) -> np.ndarray:
    """(n, seq_len + 1) token rows, each file cut from its beginning (the target then sees what it sees when it
    writes the text: its own context from the start), the shorter tail of a file left out."""
    getattr(tokenizer, "_tokenizer", tokenizer).model_max_length = 2**62  # whole files: no length warnings
    rows = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = tokenizer.encode(text, add_special_tokens=False) if text.strip() else []
        rows += [ids[i:i + seq_len + 1] for i in range(0, len(ids) - seq_len, seq_len)]
    return np.array(rows, dtype=np.int32).reshape(-1, seq_len + 1)


class Trainer:
    def __init__(self, target, config: dict, rows: np.ndarray, vocab_top: int | None, batch_tokens: int, lr: float,
                 seed: int):
        """rows: (n >= 2, seq_len + 1) token ids, the last twentieth (at least one) held out."""
        self.target, self.config, seq_len = target, config, rows.shape[1] - 1
        held = max(1, len(rows) // 20)
        self.train_rows, self.held_rows = rows[:-held], rows[-held:]
        counts = np.bincount(self.train_rows.ravel(), minlength=config["vocab_size"])
        top = min(vocab_top or config["vocab_size"], config["vocab_size"])
        ids = np.sort(np.argsort(-counts, kind="stable")[:top]).astype(np.int32)
        self.head = MTPHead(target, mx.array(ids), config.get("rms_norm_eps", 1e-6))
        h = self.head.eh_proj.weight.shape[0]  # start as "the target's last layer once more": x = hnorm(hidden)
        self.head.eh_proj.weight = mx.concatenate([mx.zeros((h, h)), mx.eye(h)], axis=1)
        self.head.lm_head.weight = output_weight(target)[mx.array(ids)]
        self.target_head = output_weight(target)[mx.array(ids)]  # the target's rows over the head's vocabulary
        self.batch = max(1, batch_tokens // seq_len)
        self.seed, self.step = seed, 0
        self.run = {"vocab_top": int(ids.size), "seq_len": seq_len,
                    "batch": self.batch, "lr": lr, "seed": seed, "data_tokens": int(rows.size)}
        self.optimizer = optim.Adam(learning_rate=lr)
        self.loss_and_grad = nn.value_and_grad(self.head, self.loss)
        self.target.freeze()

    def batch_rows(self, step: int) -> np.ndarray:
        """The batch of `step`: a fixed shuffle per pass over the data, so a resumed run sees the same batches."""
        n = len(self.train_rows)
        epoch, start = divmod(step * self.batch, n)
        order = np.random.default_rng(self.seed + epoch).permutation(n)
        picks = [order[(start + i) % n] for i in range(self.batch)]
        return self.train_rows[picks]

    def features(self, rows: np.ndarray):
        tokens = mx.array(rows)
        hidden = self.target.model(tokens)  # post-norm
        return tokens, mx.stop_gradient(hidden)

    def loss(self, head, tokens, hidden):
        target = mx.softmax(hidden[:, 1:-1] @ self.target_head.T, axis=-1)  # the target's distribution at t + 2
        out = head(self.target.model.embed_tokens(tokens[:, 1:-1]), hidden[:, :-2])
        return -(target * nn.log_softmax(head.reduced_logits(out), axis=-1)).sum(-1).mean()

    def train_step(self) -> float:
        tokens, hidden = self.features(self.batch_rows(self.step))
        loss, grads = self.loss_and_grad(self.head, tokens, hidden)
        self.optimizer.update(self.head, grads)
        mx.eval(self.head.parameters(), self.optimizer.state, loss)
        self.step += 1
        return loss.item()

    def evaluate(self) -> float:
        """Held-out first-draft acceptance: how often the head's greedy choice is the target's greedy token."""
        hits = total = 0
        for row in self.held_rows[:EVAL_ROWS]:  # one at a time: the target's full logits are large
            tokens, hidden = self.features(row[None])
            wanted = mx.argmax(hidden[:, 1:-1] @ output_weight(self.target).T, -1)
            out = self.head(self.target.model.embed_tokens(tokens[:, 1:-1]), hidden[:, :-2])
            guess = self.head.ids[mx.argmax(self.head.reduced_logits(out), -1)]
            hits += (guess == wanted).sum().item()
            total += wanted.size
        return hits / total

    def save_checkpoint(self, folder: Path) -> None:
        """Head, optimizer and step, written so that a kill at any moment leaves the last complete one."""
        folder.mkdir(parents=True, exist_ok=True)
        state = {**{f"head.{k}": v for k, v in tree_flatten(self.head.trainable_parameters())},
                 **{f"optimizer.{k}": v for k, v in tree_flatten(self.optimizer.state)}}
        name = f"state-{self.step}.safetensors"
        mx.save_safetensors(str(folder / f"partial-{name}"), state)
        os.replace(folder / f"partial-{name}", folder / name)
        (folder / "partial-step.json").write_text(json.dumps({"step": self.step, "state": name, "run": self.run}))
        os.replace(folder / "partial-step.json", folder / "step.json")
        for old in folder.glob("state-*.safetensors"):
            if old.name != name:
                old.unlink()

    def load_checkpoint(self, folder: Path) -> bool:
        if not (folder / "step.json").exists():
            return False
        saved = json.loads((folder / "step.json").read_text())
        if saved.get("run") != self.run:
            raise SpecError(f"{folder} holds the checkpoint of another run ({saved.get('run')}): delete it, or repeat "
                            "that run's command to resume it")
        state = mx.load(str(folder / saved["state"]))
        self.head.update(tree_unflatten([(k[len("head."):], v) for k, v in state.items() if k.startswith("head.")]))
        self.optimizer.state = tree_unflatten([(k[len("optimizer."):], v) for k, v in state.items()
                                               if k.startswith("optimizer.")])
        self.step = saved["step"]
        return True


def output_weight(target) -> mx.array:
    head = getattr(target, "lm_head", None)
    return head.weight if head is not None else target.model.embed_tokens.weight


def train(model: str, data: list[str], out: str, steps: int = 2000, batch_tokens: int = 2048, lr: float = 1e-3,
          max_hours: float | None = None, vocab_top: int | None = 32768, seq_len: int = 256, eval_every: int = 200,
          checkpoint_every: int = 100, seed: int = 0, progress=print) -> Path:
    """Train and write the head to `out`; resumes from the checkpoint a killed run with the same `out` left."""
    from .loading import load_target

    out_dir = Path(out).expanduser()
    checkpoint = out_dir.parent / f".{out_dir.name}{CHECKPOINT}"
    if out_dir.exists():
        raise SpecError(f"{out_dir} already exists: choose a new --out or delete it")
    check_writable(str(out_dir), "--out")
    for name, value, least in (("--steps", steps, 1), ("--seq-len", seq_len, 2),
                               ("--batch-tokens", batch_tokens, seq_len),
                               ("--vocab-top", 1 if vocab_top is None else vocab_top, 0),
                               ("--eval-every", eval_every, 1), ("--checkpoint-every", checkpoint_every, 1)):
        if value < least:
            raise SpecError(f"{name} must be >= {least}, got {value}")
    if not lr > 0:
        raise SpecError(f"--lr must be > 0, got {lr}")
    loaded = load_target(model)
    check_trainable(loaded.config, loaded.path)
    mx.random.seed(seed)
    rows = sequences(loaded.tokenizer, text_files(data), seq_len)
    if len(rows) < 2:
        raise SpecError(f"--data holds {len(rows)} stretch(es) of {seq_len + 1} tokens: train-mtp needs at least two "
                        "(more text, or a shorter --seq-len)")
    trainer = Trainer(loaded.model, loaded.config, rows, vocab_top, batch_tokens, lr, seed)
    if trainer.load_checkpoint(checkpoint):
        progress(f"resuming from step {trainer.step} ({checkpoint})")
    start, per_step = time.perf_counter(), trainer.batch * seq_len
    deadline = start + 3600 * max_hours if max_hours else None
    first, acceptance = trainer.step, None
    while trainer.step < steps:
        loss, acceptance = trainer.train_step(), None
        rate = (trainer.step - first) * per_step / (time.perf_counter() - start)
        if trainer.step % eval_every == 0 or trainer.step == steps:
            acceptance = trainer.evaluate()
            progress(f"step {trainer.step}/{steps}: loss {loss:.3f}, held-out first-draft acceptance "
                     f"{acceptance:.1%}, {rate:.0f} tokens/s, "
                     f"{(steps - trainer.step) * per_step / rate / 60:.0f} min to go")
        if trainer.step % checkpoint_every == 0 and trainer.step < steps:
            trainer.save_checkpoint(checkpoint)
        if deadline and time.perf_counter() > deadline:
            progress(f"--max-hours reached at step {trainer.step}: writing the head trained so far")
            break
    record = {"steps": trainer.step, "seq_len": seq_len, "batch_tokens": trainer.batch * seq_len, "lr": lr,
              "held_out_first_draft_acceptance": trainer.evaluate() if acceptance is None else acceptance,
              "data_tokens": int(trainer.train_rows.size)}
    from .convert import staging

    with staging(out_dir, "writing the MTP head") as work:
        save_head(trainer.head, head_config(loaded.config, int(trainer.head.ids.shape[0]), record), work / "head")
        (work / "head").rename(out_dir)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return out_dir
