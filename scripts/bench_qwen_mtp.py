"""Hybrid-target benchmark: the cost of verifying on a Gated DeltaNet model, the MTP draft step, end to end.

    python scripts/bench_qwen_mtp.py [--hidden 1024 --layers 16 --reps 5 --tokens 48]

A random float32 Qwen3.5-layout model (3 Gated DeltaNet layers per gated-attention layer, one MTP layer),
~300M parameters at the defaults. Prints, with the BLAS in use (read platform.md: without OpenBLAS a k-token
forward costs k single-token ones on Linux):
  v(k): one verify forward over k+1 tokens, capturing the recurrent state after every position, relative to
        one plain decode step (a replay of accepted tokens instead would cost about k+1); beside it the same
        with the step-by-step recurrence (`recurrence_steps`, the reference), interleaved;
  c:    one MTP draft step relative to one target decode step;
  end-to-end tokens/s of MTP drafting (k = 1, 2) against drafting off, interleaved. The random MTP layer
        agrees with its target almost never, so this row shows the overhead, not a trained model's gain.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny checkpoint builders
import tiny  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import interleaved, median_ms  # noqa: E402
from mlx_spec.models import qwen3_5 as gdn  # noqa: E402
from mlx_spec.runners.target import Target  # noqa: E402


def ratios(cases: dict, reps: int) -> dict:
    """name -> median over rounds of (time of `cases[name]()` / time of `cases["decode"]()` in the same round):
    the cases run alternately, after one warm-up round, so that load from other processes hits them alike."""
    times = {name: [] for name in cases}
    for rep in range(reps + 1):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            if rep:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t / d for t, d in zip(times[name], times["decode"])) for name in cases} | {
        "decode ms": 1000 * statistics.median(times["decode"])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="mlx-spec-bench-"))
    atexit.register(shutil.rmtree, root, True)  # benchmark-sized weights: gigabytes
    tok = tiny.build_tokenizer(root / "tokenizer")
    heads = args.hidden // 128
    path = tiny.build_checkpoint(root / "qwen3_5", "qwen3_5", tok, hidden=args.hidden, layers=args.layers, overrides={
        "num_attention_heads": heads, "num_key_value_heads": 2, "head_dim": 128, "linear_num_key_heads": heads,
        "linear_num_value_heads": 2 * heads, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "intermediate_size": int(3.5 * args.hidden)})
    engine = mlx_spec.load(str(path), draft_len=2)
    params = sum(v.size for _, v in __import__("mlx.utils", fromlist=["x"]).tree_flatten(
        engine.target.model.parameters()))
    print(f"target: qwen3_5 hybrid d={args.hidden} x{args.layers} ({params / 1e6:.0f}M params, float32); "
          f"BLAS: {linux_blas.describe()}")

    target = Target(engine.target.model, hidden="post")
    prompt = engine.encode("def main(argv):\n    for name in argv:\n        print(name)\n" * 3)
    target.prefill(prompt)

    chunked = gdn.recurrence_with_states

    def forward(n, recurrence=chunked):
        def run():
            gdn.recurrence_with_states = recurrence  # the one the capturing GDN layers call
            step = target.forward(prompt[-n:])
            # the final state is computed too: the engine computes one state per layer per round (the kept one)
            mx.eval(step.logits, step.hidden, [c.state for c in target.cache])
            target.rollback(n)  # back to where it was: every call measures the same state
        return run

    cases = {"decode": forward(1)}
    for k in (1, 2, 3, 4):
        cases[k], cases[k, "steps"] = forward(k + 1), forward(k + 1, gdn.recurrence_steps)
    v = ratios(cases, args.reps)
    gdn.recurrence_with_states = chunked
    decode = v["decode ms"]
    print(f"  target decode step: {decode:.1f} ms")
    for k in (1, 2, 3, 4):
        print(f"  v({k}) = {v[k]:.2f}   (verify {k + 1} tokens, per-position states captured, chunked; "
              f"step-by-step recurrence: {v[k, 'steps']:.2f}; target v(4) <= 1.3)")

    drafter = engine.drafter
    drafter.begin(prompt, Target(engine.target.model, hidden="post").prefill(prompt[:-1]))

    def mtp_step():
        logits = drafter._draft_step(mx.array([prompt[-1]]))
        mx.eval(logits)
        drafter.caches[0].trim(1)
        drafter.draft_rows -= 1
    print(f"  c = {median_ms(mtp_step, args.reps) / decode:.3f}   (one MTP draft step / one target decode step)")

    runs = {"off": mlx_spec.load(str(path), drafter="off"), "mtp k=1": mlx_spec.load(str(path), draft_len=1),
            "mtp k=2": mlx_spec.load(str(path), draft_len=2)}
    for e in runs.values():
        e.tokenizer.eos_token_ids = []
    results = interleaved(runs, prompt, args.tokens)
    base = results["off"][0]
    for name, (tps, stats) in results.items():
        extra = f", acceptance {stats.acceptance_rate:.0%}" if name != "off" else ""
        print(f"  {name:8s} {tps:6.2f} tok/s  {tps / base:.2f}x{extra}")


if __name__ == "__main__":
    main()
