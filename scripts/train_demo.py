"""Train the offline demo: a tiny Qwen3.5-format code model with its MTP head, plus a smaller draft model.

Corpus: the Python standard-library sources of the running interpreter (test suites left out); files whose
path hashes into the held-out bucket are kept for evaluation only. The script trains a byte-level BPE
tokenizer, then jointly (one optimizer, separate losses) the target, its `mtp.*` layer on next-next-token
prediction from the target's post-norm hidden state, and a separate small Qwen3 draft. It writes Hugging
Face-layout checkpoints (OUT/hf/{demo,demo-draft}), checks that they reload to the trained model exactly,
converts them with `mlx-spec convert` (OUT/mlx/...) and writes `report.md` / `report.json` beside them.

    python scripts/train_demo.py --out build/demo --steps 600
    cp -r build/demo/mlx/* mlx_spec/demo/          # what the package ships
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3, qwen3_5

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny checkpoint builders
import tiny  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.convert import convert  # noqa: E402
from mlx_spec.models.qwen3_5 import MTP, load_mtp  # noqa: E402

HELD_OUT_BUCKETS = 20  # 1 in 20 files is held out
COMPLETION_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# Qwen3.5 text config: Gated DeltaNet and gated full-attention layers alternating. On a 2-core CPU a training
# step of this hybrid takes ~1.3x the all-attention one (the recurrence runs step by step), which fits the hour.
TARGET = {
    "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 32, "linear_value_head_dim": 32, "full_attention_interval": 2,
    "layer_types": ["linear_attention", "full_attention"] * 2, "tie_word_embeddings": True,
}
DRAFT = {"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 384, "head_dim": 32}
MTP_LOSS_WEIGHT = 0.5


def corpus_files() -> tuple[list[Path], list[Path]]:
    """(training files, held-out files) of the interpreter's standard library, tests excluded."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    files = sorted(p for p in stdlib.rglob("*.py") if not skip & set(p.relative_to(stdlib).parts))
    held = [p for p in files if int(hashlib.sha1(str(p.relative_to(stdlib)).encode()).hexdigest(), 16)
            % HELD_OUT_BUCKETS == 0]
    return [p for p in files if p not in set(held)], held


def read(files: list[Path]) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def write_prompts(path: Path, held_files: list[Path], count: int = 12) -> None:
    """Code-completion prompts from held-out files (the lines up to a function's first body lines), in the
    JSONL form `mlx-spec bench --prompts` reads."""
    lines_out = []
    for file in held_files:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ") and i > 3]
        if starts and len(lines_out) < count:
            i = starts[len(starts) // 2]
            prompt = "\n".join(lines[max(0, i - 8):i + 3]) + "\n"
            lines_out.append(json.dumps({"category": "held-out code", "prompt": prompt, "temperature": 0.0}))
    path.write_text("\n".join(lines_out) + "\n")


def encode(tokenizer, texts: list[str], eos: int) -> np.ndarray:
    ids = []
    for text in texts:
        ids.extend(tokenizer.encode(text).ids)
        ids.append(eos)
    return np.array(ids, dtype=np.int32)


def target_config(vocab: int) -> dict:
    cfg = tiny.qwen3_5_config("qwen3_5", vocab, TARGET["hidden_size"], TARGET["num_hidden_layers"])
    text = cfg["text_config"]
    text.update(TARGET)
    text["rope_parameters"]["mrope_section"] = [3, 3, 2]  # head_dim 64 * partial 0.25 = 16 rotary dims
    cfg["tie_word_embeddings"] = TARGET["tie_word_embeddings"]
    return cfg


def draft_config(vocab: int) -> dict:
    cfg = tiny.family_config("qwen3", vocab, DRAFT["hidden_size"], DRAFT["num_hidden_layers"])
    cfg.update(DRAFT)
    return cfg


class Demo(nn.Module):
    """Everything trained: the target, its MTP layer and the draft (separate weights, one optimizer)."""

    def __init__(self, target_cfg: dict, draft_cfg: dict):
        super().__init__()
        self.target = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(target_cfg))
        self.mtp = MTP(target_cfg)
        self.draft = qwen3.Model(qwen3.ModelArgs.from_dict(draft_cfg))

    def __call__(self, inputs: mx.array):
        """Logits of the target, of the MTP layer (row p: embed(token p+1) with hidden p, scoring token p+2)
        and of the draft."""
        text = self.target.language_model.model
        hidden = text(inputs)  # post-norm: what the head scores and what the MTP layer reads
        logits = text.embed_tokens.as_linear(hidden)
        mtp_hidden = self.mtp(text.embed_tokens(inputs[:, 1:]), hidden[:, :-1], cache=[None])
        return logits, text.embed_tokens.as_linear(mtp_hidden), self.draft(inputs)


def losses(model: Demo, batch: mx.array):
    inputs, labels = batch[:, :-1], batch[:, 1:]
    logits, mtp_logits, draft_logits = model(inputs)
    main = nn.losses.cross_entropy(logits, labels).mean()
    mtp = nn.losses.cross_entropy(mtp_logits, labels[:, 1:]).mean()
    draft = nn.losses.cross_entropy(draft_logits, labels).mean()
    return main + MTP_LOSS_WEIGHT * mtp + draft, (main, mtp, draft)


def evaluate(model: Demo, tokens: np.ndarray, length: int, windows: int) -> dict:
    """Held-out metrics on non-overlapping windows: perplexities, and how often each drafter's greedy guess
    equals the target's greedy choice (teacher-forced: the first-position acceptance at temperature 0)."""
    sums = dict(main=0.0, mtp=0.0, draft=0.0, mtp_agree=0.0, draft_agree=0.0, mtp_top1=0.0, main_top1=0.0)
    count = min(windows, (len(tokens) - 1) // (length + 1))
    for i in range(count):
        batch = mx.array(tokens[i * (length + 1):(i + 1) * (length + 1)][None])
        inputs, labels = batch[:, :-1], batch[:, 1:]
        logits, mtp_logits, draft_logits = model(inputs)
        greedy = logits.argmax(-1)
        values = dict(
            main=nn.losses.cross_entropy(logits, labels).mean(),
            mtp=nn.losses.cross_entropy(mtp_logits, labels[:, 1:]).mean(),
            draft=nn.losses.cross_entropy(draft_logits, labels).mean(),
            mtp_agree=(mtp_logits.argmax(-1) == greedy[:, 1:]).mean(),
            draft_agree=(draft_logits.argmax(-1) == greedy).mean(),
            mtp_top1=(mtp_logits.argmax(-1) == labels[:, 1:]).mean(),
            main_top1=(greedy == labels).mean(),
        )
        for key, value in values.items():
            sums[key] += value.item() / count
    return {
        "windows": count, "tokens": count * length,
        "target_perplexity": math.exp(sums["main"]), "mtp_perplexity": math.exp(sums["mtp"]),
        "draft_perplexity": math.exp(sums["draft"]), "target_top1": sums["main_top1"],
        "mtp_top1_next_next": sums["mtp_top1"], "mtp_agrees_with_target": sums["mtp_agree"],
        "draft_agrees_with_target": sums["draft_agree"],
    }


# --- export in the Hugging Face layout ---------------------------------------------------------------------

ZERO_CENTRED = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                ".q_norm.weight", ".k_norm.weight")


def target_hf_weights(model: Demo) -> dict[str, np.ndarray]:
    """The target and MTP weights under their HF names and conventions: zero-centred decoder / final / MTP
    norms (HF stores w - 1), conv1d as [channels, 1, kernel]: the inverse of mlx-lm's `sanitize`."""
    weights = {}
    for name, value in tree_flatten(model.target.parameters()):
        name = name.replace("language_model.model.", "model.language_model.", 1)
        if name.endswith("conv1d.weight"):
            value = value.moveaxis(2, 1)
        if name.endswith(ZERO_CENTRED):
            value = value - 1.0
        weights[name] = value
    for name, value in tree_flatten(model.mtp.parameters()):
        weights["mtp." + name] = value - 1.0 if value.ndim == 1 and "norm" in name else value
    return {k: np.array(v, dtype=np.float32) for k, v in weights.items()}


def export(model: Demo, out: Path, target_cfg: dict, draft_cfg: dict, tokenizer_dir: Path) -> tuple[Path, Path]:
    target = target_hf_weights(model)
    expected = tiny.qwen3_5_shapes("qwen3_5", target_cfg)
    if target_cfg["tie_word_embeddings"]:
        expected.pop("lm_head.weight")
    assert {k: v.shape for k, v in target.items()} == expected, "export does not match the Qwen3.5 HF layout"
    draft = {k: np.array(v, dtype=np.float32) for k, v in tree_flatten(model.draft.parameters())}
    assert {k: v.shape for k, v in draft.items()} == tiny.family_shapes("qwen3", draft_cfg)
    return (tiny.write_checkpoint(out / "demo", target_cfg, target, tokenizer_dir),
            tiny.write_checkpoint(out / "demo-draft", draft_cfg, draft, tokenizer_dir))


def check_reload(model: Demo, target_dir: Path, draft_dir: Path, sample: mx.array) -> float:
    """Largest difference between the trained model's logits and the exported checkpoints' (through mlx-lm's
    loader and mlx-spec's MTP loader): the export must be the trained model."""
    from mlx_lm.utils import load_model

    target, _ = load_model(target_dir)
    draft, _ = load_model(draft_dir)
    mtp = load_mtp(target_dir, json.loads((target_dir / "config.json").read_text()))
    reloaded = Demo.__new__(Demo)
    nn.Module.__init__(reloaded)
    reloaded.target, reloaded.mtp, reloaded.draft = target, mtp, draft
    return max(mx.abs(a - b).max().item() for a, b in zip(model(sample), reloaded(sample)))


def report(out: Path, info: dict) -> None:
    (out / "report.json").write_text(json.dumps(info, indent=2))
    ev = info["held_out"]
    lines = [
        "# mlx-spec demo model: training report", "",
        "A tiny code model trained by `scripts/train_demo.py` on the Python standard library; it continues the "
        "code you give it. Shipped so that the first command runs offline with a drafter whose acceptance means "
        "something; it is not a useful assistant.", "",
        f"- Corpus: Python {info['python']} standard library, tests excluded: {info['train_files']} training files "
        f"({info['train_tokens']:,} tokens), {info['held_out_files']} held-out files ({info['held_out_tokens']:,} "
        "tokens).",
        f"- Tokenizer: byte-level BPE, {info['vocab']} tokens; end of file = `<|endoftext|>`.",
        f"- Target `demo`: Qwen3.5 layout (`qwen3_5`), {info['target_params']:,} parameters: "
        "Gated DeltaNet and gated full-attention layers alternating (4 layers), hidden 256, tied embeddings; "
        "training a hybrid step costs ~1.3x an all-attention one on this CPU, which fit the hour. One `mtp.*` "
        f"layer ({info['mtp_params']:,} parameters) trained on next-next-token prediction from the post-norm "
        f"hidden state (loss weight {MTP_LOSS_WEIGHT}).",
        f"- Draft `demo-draft`: Qwen3 layout, {info['draft_params']:,} parameters (2 layers, hidden 128).",
        f"- Training: {info['steps']} steps of {info['batch']} x {info['length']} tokens "
        f"({info['steps'] * info['batch'] * info['length']:,} tokens), AdamW, peak lr {info['lr']}, cosine decay, "
        f"float32, {info['minutes']:.0f} min on {info['machine']}.",
        f"- Final training losses (mean of the last 50 steps): target {info['final_loss']['target']:.3f}, "
        f"MTP {info['final_loss']['mtp']:.3f}, draft {info['final_loss']['draft']:.3f}.",
        f"- Exported checkpoint reproduces the trained logits to {info['export_max_diff']:.1e}.", "",
        f"## Held-out ({ev['tokens']:,} tokens)", "",
        "| metric | value |", "|---|---|",
        f"| target perplexity | {ev['target_perplexity']:.2f} |",
        f"| draft perplexity | {ev['draft_perplexity']:.2f} |",
        f"| MTP perplexity (next-next token) | {ev['mtp_perplexity']:.2f} |",
        f"| target top-1 accuracy | {ev['target_top1']:.3f} |",
        f"| MTP greedy guess = target's greedy choice | {ev['mtp_agrees_with_target']:.3f} |",
        f"| draft greedy guess = target's greedy choice | {ev['draft_agrees_with_target']:.3f} |",
        f"| chance (1 / vocabulary) | {1 / info['vocab']:.4f} |", "",
        "Loss curve (training loss, mean of the last 100 steps or fewer: target / MTP / draft):", "",
        *[f"    step {s:5d}  {a:.3f} / {b:.3f} / {c:.3f}" for s, a, b, c in info["curve"]], "",
    ]
    (out / "report.md").write_text("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/demo")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--q-bits", type=int, default=8, help="quantization of the shipped MLX model (0: none)")
    args = parser.parse_args(argv)
    mx.random.seed(args.seed)
    out = Path(args.out)

    train_files, held_files = corpus_files()
    train_texts = read(train_files)
    tokenizer_dir = tiny.build_tokenizer(out / "tokenizer", vocab_size=args.vocab, texts=train_texts,
                                         chat_template=COMPLETION_TEMPLATE)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    train, held = encode(tokenizer, train_texts, 0), encode(tokenizer, read(held_files), 0)
    print(f"corpus: {len(train_files)} files / {len(train):,} tokens; held out {len(held_files)} / {len(held):,}")

    target_cfg, draft_cfg = target_config(vocab), draft_config(vocab)
    model = Demo(target_cfg, draft_cfg)
    warmup = max(1, args.steps // 20)
    schedule = optim.join_schedules([optim.linear_schedule(1e-5, args.lr, warmup),
                                     optim.cosine_decay(args.lr, args.steps - warmup, args.lr / 20)], [warmup])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    loss_and_grad = nn.value_and_grad(model, losses)
    state = [model.state, optimizer.state]  # not compiled: measured no faster on this CPU

    def step(batch):
        (_, parts), grads = loss_and_grad(model, batch)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return parts
    rng = np.random.default_rng(args.seed)
    history, curve, start = [], [], time.perf_counter()
    for i in range(1, args.steps + 1):
        starts = rng.integers(0, len(train) - args.length - 1, args.batch)
        batch = mx.array(np.stack([train[s:s + args.length + 1] for s in starts]))
        parts = step(batch)
        mx.eval(parts, state)
        history.append([p.item() for p in parts])
        if i % 100 == 0 or i in (1, 10) or i == args.steps:
            mean = np.mean(history[-100:], axis=0)
            curve.append((i, *map(float, mean)))
            elapsed = time.perf_counter() - start
            print(f"step {i}/{args.steps}  target {mean[0]:.3f}  mtp {mean[1]:.3f}  draft {mean[2]:.3f}  "
                  f"{elapsed / i:.2f} s/step, {elapsed / 60:.1f} min", flush=True)
    minutes = (time.perf_counter() - start) / 60

    held_out = evaluate(model, held, args.length, windows=200)
    print(json.dumps(held_out, indent=2))
    hf_target, hf_draft = export(model, out / "hf", target_cfg, draft_cfg, tokenizer_dir)
    sample = mx.array(held[None, :129])
    max_diff = check_reload(model, hf_target, hf_draft, sample)
    assert max_diff < 1e-3, f"exported checkpoint differs from the trained model by {max_diff}"

    mlx_dir = out / "mlx"
    quant = dict(quantize=bool(args.q_bits), q_bits=args.q_bits or 8)
    convert(str(hf_target), str(mlx_dir / "demo"), **quant)
    convert(str(hf_draft), str(mlx_dir / "demo-draft"), **quant)
    n_params = {name: sum(v.size for _, v in tree_flatten(getattr(model, name).parameters()))
                for name in ("target", "mtp", "draft")}
    info = dict(
        python=sys.version.split()[0], train_files=len(train_files), held_out_files=len(held_files),
        held_out_paths=[str(p.relative_to(sysconfig.get_paths()["stdlib"])) for p in held_files],
        train_tokens=len(train), held_out_tokens=len(held), vocab=vocab, target_params=n_params["target"],
        mtp_params=n_params["mtp"], draft_params=n_params["draft"], steps=args.steps, batch=args.batch,
        length=args.length, lr=args.lr, minutes=minutes,
        machine=f"{platform.machine()} {os.cpu_count()} cores, BLAS: {linux_blas.describe()}",
        final_loss=dict(zip(("target", "mtp", "draft"), map(float, np.mean(history[-50:], axis=0)))),
        curve=curve, held_out=held_out, export_max_diff=max_diff, quantization_bits=args.q_bits,
    )
    report(mlx_dir, info)
    write_prompts(mlx_dir / "prompts.jsonl", held_files)
    print(f"wrote {mlx_dir}/demo, {mlx_dir}/demo-draft and {mlx_dir}/report.md")


if __name__ == "__main__":
    main()
