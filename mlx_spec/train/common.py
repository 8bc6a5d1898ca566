"""What `train-mtp` and `train-drafter` share: the text and the target's own answers cut into rows, the batches
of a step, checkpoints a killed run resumes from exactly, and the loop with its progress, held-out reports and
`--max-hours`. A trainer (train_mtp.Trainer, train_block.BlockTrainer) brings the step, the evaluation and what
it saves."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..seams.errors import SpecError
from ..seams.files import check_writable

TEXT_SUFFIXES = (".py", ".md", ".txt", ".rst", ".json", ".toml", ".c", ".h", ".js", ".ts", ".rs", ".go", ".java")


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


def read_prompts(prompts_file: str) -> list[tuple[float, str | list[dict]]]:
    """(temperature, prompt) for each line of a JSONL file of prompts, as bench reads it."""
    from ..core.prompts import load_prompts

    return [(temperature, prompt) for temperature, items in load_prompts(None, prompts_file).values()
            for prompt in items]


def answer_rows(loaded, prompts: list[tuple[float, str | list[dict]]], answer_tokens: int, seq_len: int,
                folder: Path, progress: bool, say) -> np.ndarray:
    """The target's own answers to `prompts` (`read_prompts`; greedy where the temperature is 0), each after its
    rendered prompt, packed into (n, seq_len + 1) rows. Generated in batches once: each answer is appended to
    `folder`/answers.jsonl as it finishes, so a resumed run only generates those it lacks."""
    from tqdm import tqdm

    from ..core.prompts import render_prompt
    from ..core.sampling import SamplingParams
    from ..decode.rounds import Job
    from ..loading import make_engine

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


def split_pools(rows: np.ndarray | None, answers: np.ndarray | None) -> tuple[list[np.ndarray], dict]:
    """(the training pools, the held-out rows by pool name): the last twentieth of each (at least one row) held
    out; the answers first, the headline of every report."""
    pools = {name: p for name, p in (("answers", answers), ("text", rows)) if p is not None}
    return ([p[:-max(1, len(p) // 20)] for p in pools.values()],
            {name: p[-max(1, len(p) // 20):] for name, p in pools.items()})


def batch_picks(step: int, batch: int, sizes: list[int], seed: int) -> list[tuple[int, int]]:
    """(pool, row) of the rows of batch `step`, taken from the pools in turn, each pool in a fixed shuffle per pass
    over it, so a resumed run sees the same batches."""
    picks, count = [], len(sizes)
    for slot in range(step * batch, (step + 1) * batch):
        pool = slot % count
        epoch, at = divmod(slot // count, sizes[pool])
        picks.append((pool, int(np.random.default_rng([seed, pool, epoch]).permutation(sizes[pool])[at])))
    return picks


def output_layer(target) -> nn.Module:
    """The target's output projection: its lm_head, or its tied (maybe quantized) embedding."""
    language = getattr(target, "language_model", target)
    head = getattr(language, "lm_head", None)
    return head if head is not None else language.model.embed_tokens


def target_logits(target, hidden: mx.array) -> mx.array:
    layer = output_layer(target)
    return layer(hidden) if isinstance(layer, (nn.Linear, nn.QuantizedLinear)) else layer.as_linear(hidden)


def save_checkpoint(folder: Path, step: int, run: dict, module: nn.Module, optimizer) -> None:
    """`module`'s trainable parameters, the optimizer and the step, written so that a kill at any moment leaves
    the last complete checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {**{f"head.{k}": v for k, v in tree_flatten(module.trainable_parameters())},
             **{f"optimizer.{k}": v for k, v in tree_flatten(optimizer.state)}}
    name = f"state-{step}.safetensors"
    mx.save_safetensors(str(folder / f"partial-{name}"), state)
    os.replace(folder / f"partial-{name}", folder / name)
    (folder / "partial-step.json").write_text(json.dumps({"step": step, "state": name, "run": run}))
    os.replace(folder / "partial-step.json", folder / "step.json")
    for old in folder.glob("state-*.safetensors"):
        if old.name != name:
            old.unlink()


def load_checkpoint(folder: Path, run: dict, module: nn.Module, optimizer) -> int | None:
    """The step of the checkpoint in `folder`, its weights and optimizer state loaded; None when there is none."""
    if not (folder / "step.json").exists():
        return None
    saved = json.loads((folder / "step.json").read_text())
    if saved.get("run") != run:
        raise SpecError(f"{folder} holds the checkpoint of another run ({saved.get('run')}): delete it, or repeat "
                        "that run's command to resume it")
    state = mx.load(str(folder / saved["state"]))
    module.update(tree_unflatten([(k[len("head."):], v) for k, v in state.items() if k.startswith("head.")]))
    optimizer.state = tree_unflatten([(k[len("optimizer."):], v) for k, v in state.items()
                                      if k.startswith("optimizer.")])
    return saved["step"]


def check_numbers(checks) -> None:
    """(flag, value, least) triples: a one-line SpecError for the first value under its least."""
    for name, value, least in checks:
        if value < least:
            raise SpecError(f"{name} must be >= {least}, got {value}")


class Setup:
    """A run's output folder, its checkpoint folder beside it, the target and its training rows."""

    def __init__(self, command: str, model: str, data: list[str] | None, prompts: str | None, out: str,
                 seq_len: int, answer_tokens: int, progress: bool, check_target=None):
        """check_target(loaded): refuses a target the trainer cannot train for, before any answer is generated."""
        from tqdm import tqdm

        from ..loading import load_target

        self.out = Path(out).expanduser()
        self.checkpoint = self.out.parent / f".{self.out.name}.{command}-checkpoint"
        if self.out.exists():
            raise SpecError(f"{self.out} already exists: choose a new --out or delete it")
        check_writable(str(self.out), "--out")
        if not data and not prompts:
            raise SpecError("nothing to train on: give --data (text files or folders) and/or --prompts (a JSONL file "
                            "of prompts the target answers)")
        files = text_files(data) if data else None
        prompt_list = read_prompts(prompts) if prompts else None  # a bad file is refused before the target loads
        self.loaded = load_target(model)
        if check_target:
            check_target(self.loaded)
        self.say = functools.partial(tqdm.write, file=sys.stderr)
        self.rows = sequences(self.loaded.tokenizer, files, seq_len) if files else None
        self.answers = (answer_rows(self.loaded, prompt_list, answer_tokens, seq_len, self.checkpoint, progress,
                                    self.say) if prompts else None)
        for flag, pool, more in (("--data", self.rows, "more text"), ("--prompts", self.answers, "more prompts")):
            if pool is not None and len(pool) < 2:
                raise SpecError(f"{flag} gives {len(pool)} stretch(es) of {seq_len + 1} tokens: {command} needs at "
                                f"least two ({more}, or a shorter --seq-len)")


def fit(trainer, setup: Setup, name: str, steps: int, eval_every: int, checkpoint_every: int,
        max_hours: float | None, progress: bool) -> dict[str, list[float]]:
    """Train from the checkpoint (if any) to `steps` or `max_hours`, reporting held-out acceptance every
    `eval_every` steps and checkpointing every `checkpoint_every`; the last held-out acceptance by pool."""
    from tqdm import tqdm

    if trainer.load_checkpoint(setup.checkpoint):
        setup.say(f"resuming from step {trainer.step} ({setup.checkpoint})")
    start, first, acceptance = time.perf_counter(), trainer.step, None
    deadline = start + 3600 * max_hours if max_hours else None
    stops = f" (stops by {time.strftime('%H:%M', time.localtime(time.time() + 3600 * max_hours))})" if deadline else ""
    bar = tqdm(total=steps, initial=trainer.step, unit="step", dynamic_ncols=True, mininterval=1, disable=not progress,
               desc=f"{name}{stops}")
    while trainer.step < steps:
        loss, acceptance = trainer.train_step(), None
        bar.set_postfix_str(f"loss {loss:.3f}, {trainer.speed(time.perf_counter() - start, first)}", refresh=False)
        bar.update()
        if trainer.step % eval_every == 0 or trainer.step == steps:
            acceptance = {pool: trainer.evaluate(pool) for pool in trainer.held}
            setup.say(f"step {trainer.step}/{steps}: loss {loss:.3f}, held-out {trainer.report(acceptance)}, "
                      f"{trainer.speed(time.perf_counter() - start, first)}")
        if trainer.step % checkpoint_every == 0 and trainer.step < steps:
            trainer.save_checkpoint(setup.checkpoint)
        if deadline and time.perf_counter() > deadline:
            setup.say(f"--max-hours reached at step {trainer.step}: writing what is trained so far")
            break
    bar.close()
    return acceptance or {pool: trainer.evaluate(pool) for pool in trainer.held}
