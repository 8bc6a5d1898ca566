"""Batched speculative decoding against mlx-lm's batched decoding, on real weights, greedy.

    python scripts/bench_batch.py [--models qwen2.5-coder-0.5b,demo --sizes 1,4,8,16 --tokens 32 --reps 1]
                                  [--draft-model qwen2.5-coder-0.5b]   # also the draft-model drafter (for 1.5B)
                                  [--pins 0,1]   # also the MTP layer (else n-gram) with every job pinned to each

For each model (float32, from scripts/real_models.py, or "demo": the built-in one) and batch size B, on the demo's
held-out code prompts (max(8, B) of them, every one made to write exactly --tokens tokens), interleaved in one
process: mlx-lm `batch_generate` (completion and prefill batch size B), mlx-spec batched with drafting off, and
mlx-spec batched with the adaptive policy per batch size for each drafter (n-gram; the checkpoint's MTP layer when
it has one, as the demo does; the draft model when given).
Prints total tokens/s (every token generated over the whole wall time, prefills included), the ratio to mlx-lm
batched, acceptance, and how many outputs equal mlx-spec's own one-at-a-time plain decoding; then whether the
machine was quiet enough to trust the figures. Every run's own tok/s goes out as a raw-timings line
(scripts/timings.py), which scripts/record.py keeps apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx_spec  # first, before mlx: it points MLX at the system OpenBLAS on Linux

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from mlx_lm import batch_generate  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.decode.rounds import Job  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from timings import raw_line  # noqa: E402

PROMPTS = Path(mlx_spec.__file__).parent / "demo" / "prompts.jsonl"


def code_prompts(engine, n: int) -> list[list[int]]:
    """n raw code prompts: the demo's held-out ones, then their first halves."""
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    texts += [t[: len(t) // 2] for t in texts]
    return [engine.encode(t) for t in texts[:n]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b,demo")
    parser.add_argument("--sizes", default="1,4,8,16")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--draft-model", help="a real model (name) to draft with as well, e.g. qwen2.5-coder-0.5b")
    parser.add_argument("--pins", default="", help="draft lengths to also run the MTP layer (else n-gram) pinned "
                        "to, every job's own (0: what the drafter costs when it drafts nothing)")
    args = parser.parse_args()
    sizes = [int(b) for b in args.sizes.split(",") if b]
    for model in args.models.split(","):
        path = None if model == "demo" else real_models.mlx_dir(model)
        if path is not None and not path.exists():
            print(f"fetch the model first: python scripts/real_models.py {model}")
            return 2
        plain = mlx_spec.load(str(path) if path else None, drafter="off")
        if problem := plain.batch_problem():
            print(f"\n{model}: not benchmarked: {problem}")
            continue
        contenders = {"mlx-spec, drafting off": plain, "mlx-spec, ngram": plain.with_drafter("ngram")}
        if "mtp" in plain.drafters:
            contenders["mlx-spec, mtp"] = plain.with_drafter("mtp")
            contenders["mlx-spec, mtp"].pin(None)
        if args.draft_model and model != args.draft_model:
            draft = mlx_spec.load(str(path) if path else None, draft_model=str(real_models.mlx_dir(args.draft_model)),
                                  drafter="draft-model", draft_len=None)
            contenders["mlx-spec, draft model"] = draft
        contenders["mlx-spec, ngram"].pin(None)
        pinned = "mtp" if "mtp" in plain.drafters else "ngram"
        pins = {f"mlx-spec, {pinned} pinned {k}": int(k) for k in args.pins.split(",") if k}
        contenders.update((name, contenders[f"mlx-spec, {pinned}"]) for name in pins)
        plain.tokenizer.eos_token_ids = []  # every request makes exactly --tokens tokens
        for engine in contenders.values():
            engine.tokenizer.eos_token_ids = []
        prompts = code_prompts(plain, max(8, max(sizes)))
        reference = [plain.generate(p, max_tokens=args.tokens).tokens for p in prompts]  # one at a time
        print(f"\n{model}: BLAS {linux_blas.describe()}; {args.tokens} tokens per request, greedy, "
              f"{args.reps} repetition(s)", flush=True)
        # untimed, once: first uses (self-checks, the first forwards of each shape) would count against B=1
        batch_generate(plain.target.model, plain.tokenizer, prompts[:2], max_tokens=4, completion_batch_size=2,
                       prefill_batch_size=2)
        for engine in contenders.values():
            dict(engine.generate_many([Job(p, max_tokens=4) for p in prompts[:2]], 2))
        speeds, same, acceptance = {}, {}, {}
        with Neighbours() as neighbours:
            for rep in range(args.reps):
                for size in sizes:
                    batch = prompts[:max(8, size)]
                    start = time.perf_counter()
                    out = batch_generate(plain.target.model, plain.tokenizer, batch, max_tokens=args.tokens,
                                         completion_batch_size=size, prefill_batch_size=size, return_token_ids=True)
                    seconds = time.perf_counter() - start
                    speeds.setdefault(("mlx-lm batch_generate", size), []).append(len(batch) * args.tokens / seconds)
                    print(raw_line(f"B={size} mlx-lm batch_generate", "tok/s",
                                   speeds[("mlx-lm batch_generate", size)][-1:]), flush=True)
                    same[("mlx-lm batch_generate", size)] = sum(
                        list(t) == r for t, r in zip(out.token_ids, reference))
                    for name, engine in contenders.items():
                        jobs = [Job(p, max_tokens=args.tokens, draft_len=pins.get(name)) for p in batch]
                        start = time.perf_counter()
                        results = dict(engine.generate_many(jobs, size))
                        seconds = time.perf_counter() - start
                        speeds.setdefault((name, size), []).append(len(batch) * args.tokens / seconds)
                        same[(name, size)] = sum(results[i].tokens == reference[i] for i in range(len(batch)))
                        drafted = sum(r.stats.drafted for r in results.values())
                        acceptance[(name, size)] = (sum(r.stats.accepted for r in results.values()) / drafted
                                                    if drafted else None)
                        print(raw_line(f"B={size} {name}", "tok/s", speeds[(name, size)][-1:]), flush=True)
        print("| B | contender | total tok/s | vs mlx-lm batched | acceptance | same as one-at-a-time plain |")
        print("|---|---|---|---|---|---|")
        for size in sizes:
            base = statistics.median(speeds[("mlx-lm batch_generate", size)])
            for name in ["mlx-lm batch_generate", *contenders]:
                tps = statistics.median(speeds[(name, size)])
                rate = acceptance.get((name, size))
                print(f"| {size} | {name} | {tps:.1f} | {tps / base:.2f}x | "
                      f"{'-' if rate is None else f'{rate:.0%}'} | {same[(name, size)]}/{max(8, size)} |")
        print(neighbours.verdict()[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
