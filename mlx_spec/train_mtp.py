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

import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from .caches import TreeKVCache, tree_forward
from .compat import positioned_ropes
from .errors import SpecError
from .files import check_writable
from .models import weight_rows
from .models.mtp_head import MTPHead, check_trainable, head_config, save_head

TEXT_SUFFIXES = (".py", ".md", ".txt", ".rst", ".json", ".toml", ".c", ".h", ".js", ".ts", ".rs", ".go", ".java")
CHECKPOINT = ".train-mtp-checkpoint"
EVAL_ROWS = 16  # held-out sequences evaluated
REPLAY = 8  # batches of target features kept in memory for --reuse


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
    def __init__(self, target, config: dict, rows: np.ndarray | None, vocab_top: int | None, batch_tokens: int,
                 lr: float, seed: int, draft_steps: int = 1, reuse: int = 1, layer_lr: float = 0.1,
                 answer_rows: np.ndarray | None = None):
        """rows, answer_rows: (n >= 2, seq_len + 1) token ids of the text and of the target's own answers (either
        may be None), the last twentieth of each (at least one) held out; batches take from both alike.
        draft_steps: how many chained drafts are trained (each feeding the head its own output, as drafting
        does); reuse: updates per batch the target runs (the extra ones on batches drawn from the last REPLAY,
        kept in memory)."""
        pools = {name: p for name, p in (("answers", answer_rows), ("text", rows)) if p is not None}
        self.target, self.config, seq_len = target, config, next(iter(pools.values())).shape[1] - 1
        self.train_pools = [p[:-max(1, len(p) // 20)] for p in pools.values()]
        self.held = {name: p[-max(1, len(p) // 20):] for name, p in pools.items()}  # the first: the headline
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
                    "data_tokens": {k: int(p.size) for k, p in pools.items()}, "draft_steps": draft_steps,
                    "reuse": reuse, "layer_lr": layer_lr}
        self.target.freeze()
        self.head.layers[0].unfreeze()  # a copy of a target layer: frozen when the target is
        if layer_lr == 0:
            self.head.layers[0].freeze()
        self.optimizer = optim.MultiOptimizer([optim.Adam(learning_rate=lr * layer_lr), optim.Adam(learning_rate=lr)],
                                              [lambda path, _: path.startswith("layers.")])
        self.loss_and_grad = nn.value_and_grad(self.head, self.loss)

    def batch_rows(self, step: int) -> np.ndarray:
        """The batch of `step`, its rows taken from the pools in turn, each pool in a fixed shuffle per pass over
        it, so a resumed run sees the same batches."""
        picks, count = [], len(self.train_pools)
        for slot in range(step * self.batch, (step + 1) * self.batch):
            pool = self.train_pools[slot % count]
            epoch, at = divmod(slot // count, len(pool))
            picks.append(pool[np.random.default_rng([self.seed, slot % count, epoch]).permutation(len(pool))[at]])
        return np.stack(picks)

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
        """Resume from `folder`; the kept batches are run through the target again (they are not saved)."""
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
        if self.reuse > 1:
            self.recent = [self.features(self.batch_rows(s)) for s in range(max(0, self.step - REPLAY), self.step)]
        return True


def read_prompts(prompts_file: str) -> list[tuple[float, str | list[dict]]]:
    """(temperature, prompt) for each line of a JSONL file of prompts, as bench reads it."""
    from .bench import load_prompts

    return [(temperature, prompt) for temperature, items in load_prompts(None, prompts_file).values()
            for prompt in items]


def answer_rows(loaded, prompts: list[tuple[float, str | list[dict]]], answer_tokens: int, seq_len: int,
                folder: Path, progress: bool, say) -> np.ndarray:
    """The target's own answers to `prompts` (`read_prompts`; greedy where the temperature is 0), each after its
    rendered prompt, packed into (n, seq_len + 1) rows. Generated in batches once: each answer is appended to
    `folder`/answers.jsonl as it finishes, so a resumed run only generates those it lacks."""
    from tqdm import tqdm

    from .batched import Job
    from .loading import make_engine
    from .prompts import render_prompt
    from .sampling import SamplingParams

    engine = make_engine(loaded, drafter="off")
    encoded = [render_prompt(loaded.tokenizer, prompt) for _, prompt in prompts]  # as bench and the chat render
    store, done = folder / "answers.jsonl", {}
    if store.exists():  # kept: the whole lines (a kill may cut the last short) that answer these prompts
        for line in store.read_text().splitlines():
            try:
                index, tokens = json.loads(line).values()
                if tokens[:len(encoded[index])] == encoded[index]:
                    done[index] = tokens
            except (ValueError, TypeError, IndexError, AttributeError):
                continue
    folder.mkdir(parents=True, exist_ok=True)
    store.write_text("".join(json.dumps({"index": i, "tokens": t}) + "\n" for i, t in done.items()))
    jobs = [(i, Job(ids, SamplingParams(temperature=temperature), answer_tokens, seed=i))
            for i, ((temperature, _), ids) in enumerate(zip(prompts, encoded)) if i not in done]
    if jobs:
        longest = max(len(job.prompt) for _, job in jobs) + answer_tokens
        size = 1 if engine.batch_problem() else min(8, engine.largest_batch(longest))
        say(f"the target answers {len(jobs)} of {len(prompts)} prompts ({answer_tokens} tokens each at most, "
            f"{size} at a time; kept in {store})")
        bar = tqdm(total=len(prompts), initial=len(done), unit="answer", dynamic_ncols=True, disable=not progress,
                   desc="answers")
        with store.open("a") as out:
            for k, result in engine.generate_many([job for _, job in jobs], size):
                index, job = jobs[k]
                done[index] = job.prompt + result.tokens
                out.write(json.dumps({"index": index, "tokens": done[index]}) + "\n")
                out.flush()
                bar.update()
        bar.close()
    stream = np.array([t for i in sorted(done) for t in done[i]], dtype=np.int32)
    usable = len(stream) // (seq_len + 1) * (seq_len + 1)
    return stream[:usable].reshape(-1, seq_len + 1)


def report(acceptance: dict[str, list[float]], draft_steps: int) -> str:
    """Like "31.2% on answers (per draft position: 31% 20%), 25.0% on text" from evaluate's lists by pool."""
    return ", ".join(f"{a[0]:.1%} on {pool}" + (f" (per draft position: {' '.join(f'{x:.0%}' for x in a)})"
                                                 if draft_steps > 1 else "") for pool, a in acceptance.items())


def output_layer(target) -> nn.Module:
    """The target's output projection: its lm_head, or its tied (maybe quantized) embedding."""
    head = getattr(target, "lm_head", None)
    return head if head is not None else target.model.embed_tokens


def target_logits(target, hidden: mx.array) -> mx.array:
    layer = output_layer(target)
    return layer(hidden) if isinstance(layer, (nn.Linear, nn.QuantizedLinear)) else layer.as_linear(hidden)


def train(model: str, data: list[str] | None, out: str, steps: int = 2000, batch_tokens: int = 512,
          lr: float = 3e-3, max_hours: float | None = None, vocab_top: int | None = 32768, seq_len: int = 256,
          eval_every: int = 200, checkpoint_every: int = 100, seed: int = 0, draft_steps: int = 1, reuse: int = 2,
          layer_lr: float = 0.1, progress: bool = True, prompts: str | None = None,
          answer_tokens: int = 256) -> Path:
    """Train and write the head to `out`; resumes from the checkpoint a killed run with the same `out` left.
    data: text files and folders; prompts: a JSONL file of prompts the target answers first (`answer_rows`), its
    answers then half of every batch. Reports go to stderr, under a progress bar unless `progress` is False."""
    from tqdm import tqdm

    from .loading import load_target

    out_dir = Path(out).expanduser()
    checkpoint = out_dir.parent / f".{out_dir.name}{CHECKPOINT}"
    if out_dir.exists():
        raise SpecError(f"{out_dir} already exists: choose a new --out or delete it")
    check_writable(str(out_dir), "--out")
    for name, value, least in (("--steps", steps, 1), ("--seq-len", seq_len, 2),
                               ("--batch-tokens", batch_tokens, seq_len),
                               ("--vocab-top", 1 if vocab_top is None else vocab_top, 0),
                               ("--eval-every", eval_every, 1), ("--checkpoint-every", checkpoint_every, 1),
                               ("--draft-steps", draft_steps, 1), ("--reuse", reuse, 1),
                               ("--answer-tokens", answer_tokens, 1)):
        if value < least:
            raise SpecError(f"{name} must be >= {least}, got {value}")
    if seq_len <= draft_steps:
        raise SpecError(f"--seq-len must be more than --draft-steps ({draft_steps}), got {seq_len}")
    if not data and not prompts:
        raise SpecError("nothing to train on: give --data (text files or folders) and/or --prompts (a JSONL file of "
                        "prompts the target answers)")
    if not lr > 0:
        raise SpecError(f"--lr must be > 0, got {lr}")
    if not 0 <= layer_lr <= 1:
        raise SpecError(f"--layer-lr must be from 0 (frozen) to 1, got {layer_lr}")
    files = text_files(data) if data else None
    prompt_list = read_prompts(prompts) if prompts else None  # a bad file is refused before the target loads
    loaded = load_target(model)
    check_trainable(loaded.config, loaded.path)
    mx.random.seed(seed)
    say = functools.partial(tqdm.write, file=sys.stderr)
    rows = sequences(loaded.tokenizer, files, seq_len) if files else None
    answers = (answer_rows(loaded, prompt_list, answer_tokens, seq_len, checkpoint, progress, say) if prompts
               else None)
    for flag, pool, more in (("--data", rows, "more text"), ("--prompts", answers, "more prompts")):
        if pool is not None and len(pool) < 2:
            raise SpecError(f"{flag} gives {len(pool)} stretch(es) of {seq_len + 1} tokens: train-mtp needs at "
                            f"least two ({more}, or a shorter --seq-len)")
    trainer = Trainer(loaded.model, loaded.config, rows, vocab_top, batch_tokens, lr, seed, draft_steps, reuse,
                      layer_lr, answers)
    if trainer.load_checkpoint(checkpoint):
        say(f"resuming from step {trainer.step} ({checkpoint})")
    start, per_step = time.perf_counter(), trainer.batch * seq_len
    deadline = start + 3600 * max_hours if max_hours else None
    first, acceptance = trainer.step, None
    stops = f" (stops by {time.strftime('%H:%M', time.localtime(time.time() + 3600 * max_hours))})" if deadline else ""
    bar = tqdm(total=steps, initial=trainer.step, unit="step", dynamic_ncols=True, mininterval=1, disable=not progress,
               desc=f"train-mtp{stops}")
    while trainer.step < steps:
        loss, acceptance = trainer.train_step(), None
        rate = (trainer.step - first) * per_step / (time.perf_counter() - start)
        bar.set_postfix_str(f"loss {loss:.3f}, {rate:.0f} target tokens/s", refresh=False)
        bar.update()
        if trainer.step % eval_every == 0 or trainer.step == steps:
            acceptance = {pool: trainer.evaluate(pool) for pool in trainer.held}
            say(f"step {trainer.step}/{steps}: loss {loss:.3f}, held-out first-draft acceptance "
                f"{report(acceptance, draft_steps)}, {rate:.0f} target tokens/s")
        if trainer.step % checkpoint_every == 0 and trainer.step < steps:
            trainer.save_checkpoint(checkpoint)
        if deadline and time.perf_counter() > deadline:
            say(f"--max-hours reached at step {trainer.step}: writing the head trained so far")
            break
    bar.close()
    acceptance = acceptance or {pool: trainer.evaluate(pool) for pool in trainer.held}
    headline = acceptance[next(iter(trainer.held))]
    record = {"steps": trainer.step, "seq_len": seq_len, "batch_tokens": trainer.batch * seq_len, "lr": lr,
              "draft_steps": draft_steps, "reuse": reuse, "layer_lr": layer_lr,
              "held_out_first_draft_acceptance": headline[0], "held_out_acceptance_per_position": acceptance,
              "data_tokens": trainer.run["data_tokens"]}
    from .convert import staging

    with staging(out_dir, "writing the MTP head") as work:
        save_head(trainer.head, head_config(loaded.config, int(trainer.head.ids.shape[0]), record), work / "head")
        (work / "head").rename(out_dir)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return out_dir
