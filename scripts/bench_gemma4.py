"""Gemma 4 target + assistant benchmark: the assistant's draft step against a target step, acceptance, and
end-to-end tokens/s against plain decoding (interleaved, median of 3).

    python scripts/bench_gemma4.py [--hidden 768 --layers 12 --tokens 64]

Random float32 Gemma 4-layout models (sliding window 64, KV-shared last layers, per-layer inputs) with a
quarter-width assistant. Two assistants: the random one with the sparse centroid head (it is right almost
never: the row shows the overhead) and a dense-head one distilled briefly to predict the target's greedy
choices (`tiny_gemma4.distill_gemma4_assistant`; it shows what the mechanism gains when drafts are right). Not a
trained Gemma: read the ratios, not the absolute rates.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny checkpoint builders
import tiny  # noqa: E402
import tiny_gemma4  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import interleaved, median_ms  # noqa: E402
from mlx_spec.core.sampling import SamplingParams  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--draft-len", type=int, default=3)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="mlx-spec-bench-"))
    atexit.register(shutil.rmtree, root, True)  # benchmark-sized weights: gigabytes
    tok = tiny.build_tokenizer(root / "tokenizer")
    heads = args.hidden // 128
    target = tiny_gemma4.build_gemma4_target(root / "gemma4", tok, sliding_window=64, hidden=args.hidden,
                                      layers=args.layers, overrides={
                                          "num_attention_heads": heads, "head_dim": 128, "global_head_dim": 256,
                                          "num_kv_shared_layers": args.layers // 3,
                                          "intermediate_size": 4 * args.hidden})
    assistants = {"random, centroid head": tiny_gemma4.build_gemma4_assistant(root / "random", target,
                                                                       hidden=args.hidden // 4)}
    dense = tiny_gemma4.build_gemma4_assistant(root / "dense", target, ordered=False, hidden=args.hidden // 4)
    assistants["distilled, dense head"] = tiny_gemma4.distill_gemma4_assistant(root / "distilled", dense, target)
    print(f"target: gemma4 d={args.hidden} x{args.layers}, window 64, float32; assistant d={args.hidden // 4} x4; "
          f"BLAS: {linux_blas.describe()}; {args.tokens} tokens, k={args.draft_len}")

    plain = mlx_spec.load(str(target), drafter="off")
    engines = {name: mlx_spec.load(str(target), draft_model=str(path), draft_len=args.draft_len)
               for name, path in assistants.items()}
    prompt = plain.encode("def main(argv):\n    for name in argv:\n        print(name)\n" * 4)

    engine = engines["random, centroid head"]
    step = engine.target.prefill(prompt[:-1])
    engine.drafter.begin(prompt, step)

    def target_step():
        mx.eval(engine.target.forward(prompt[-1:]).logits)
        engine.target.rollback(1)

    def draft_step():
        mx.eval(engine.drafter.propose(prompt, 1, SamplingParams(), mx.random.key(0)).tokens)

    print(f"  c = {median_ms(draft_step, 10) / median_ms(target_step, 10):.3f}   "
          "(one assistant draft step, K/V gathered, / one target decode step)")

    runs = {"off": plain, **engines}
    for e in runs.values():
        e.tokenizer.eos_token_ids = []
    results = interleaved(runs, prompt, args.tokens)
    base = results["off"][0]
    for name, (tps, stats) in results.items():
        per_position = [round(rate, 2) for rate in stats.per_position_acceptance]
        extra = f", acceptance {stats.acceptance_rate:.0%}, per position {per_position}" if name != "off" else ""
        print(f"  {name:22s} {tps:7.2f} tok/s  {tps / base:.2f}x{extra}")


if __name__ == "__main__":
    main()
