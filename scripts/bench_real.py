"""Speed on real weights: the Qwen2.5-Coder 1.5B target with its 0.5B sibling as draft (float32, from
scripts/real_models.py), every contender interleaved in one process, greedy, each output checked against plain.

    python scripts/bench_real.py [--tokens 40 --reps 3 --ks 1,2,3,4,5,6 --temp 0]

After one untimed pass of every contender, in rounds: mlx-lm's plain `generate_step` (the baseline); mlx-spec with
drafting off; at each k, mlx-lm's `speculative_generate_step` and mlx-spec's draft model pinned at k; the draft
model and n-gram under the adaptive policy; the draft model with trees of each width allowed (the adaptive
policy chooses chain or tree each round).
Prints the median and spread (max - min over median, the worst prompt's) of decode tok/s per contender (every
contender timed alike, from its first token to its last), the ratio to the baseline, acceptance, whether every
greedy output equals plain decoding, mlx-spec over mlx-lm at each k, and whether the machine was quiet enough
to trust the figures. Every run's own tok/s goes out as a raw-timings line (scripts/timings.py), which
scripts/record.py keeps apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.sample_utils import make_sampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.drafters.draft_model import DraftModelDrafter  # noqa: E402
from mlx_spec.decode.engine import Engine  # noqa: E402
from mlx_spec.core.events import Done, Token  # noqa: E402
from mlx_spec.core.sampling import SamplingParams  # noqa: E402
from mlx_spec.runners.target import Target  # noqa: E402
from timings import raw_lines_by_prompt, spread_cell, verdict  # noqa: E402

PROMPTS = [
    [{"role": "user", "content": "Write a Python function that parses an ISO 8601 date string and returns a "
                                 "datetime, with a docstring."}],
    [{"role": "user", "content": "Complete this code:\ndef binary_search(items, target):\n    lo, hi = 0, "
                                 "len(items) - 1\n"}],
]


def rate(tokens_as_they_come) -> tuple[list[int], float]:
    """Tokens and decode tok/s, counted alike for every contender: the tokens after the first over the time
    from the first to the last. (mlx-lm's speculative generator yields its first round's tokens at once, so a
    clock started at its first token counts them free; mlx-spec's own `decode_tps` counts that round too.)"""
    tokens, start = [], None
    for token in tokens_as_they_come:
        tokens.append(token)
        start = start or time.perf_counter()
    return tokens, (len(tokens) - 1) / (time.perf_counter() - start)


def mlx_spec_tokens(events, acceptance: list):
    """The token ids of an mlx-spec stream; its acceptance rate goes to `acceptance`."""
    for event in events:
        if isinstance(event, Token):
            yield event.id
        elif isinstance(event, Done):
            acceptance.append(event.stats.acceptance_rate)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ks", default="1,2,3,4,5,6", help="draft lengths to measure, pinned, in both engines")
    parser.add_argument("--widths", default="2,3", help="token-tree widths to allow (adaptive length and shape)")
    parser.add_argument("--temp", type=float, default=0.0, help="temperature (top-p 0.9 when > 0)")
    args = parser.parse_args()
    target_dir, draft_dir = (real_models.mlx_dir(n) for n in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"))
    if not (target_dir.exists() and draft_dir.exists()):
        print("fetch the models first: python scripts/real_models.py qwen2.5-coder-1.5b qwen2.5-coder-0.5b")
        return 2
    n, greedy = args.tokens, args.temp == 0
    params = SamplingParams(temperature=args.temp, top_p=1.0 if greedy else 0.9)
    sampler = make_sampler(temp=args.temp, top_p=params.top_p)

    draft_engine = mlx_spec.load(str(target_dir), draft_model=str(draft_dir))
    model, draft_model = draft_engine.target.model, draft_engine.drafter.weights  # mlx-lm runs the same weights
    ngram = draft_engine.with_drafter("ngram")
    ks = [int(k) for k in args.ks.split(",")]
    engines = {"mlx-spec off": (draft_engine.with_drafter("off"), 0)}  # name -> (engine, pinned length or None)
    engines.update({f"mlx-spec draft k={k}": (draft_engine, k) for k in ks})
    engines.update({"mlx-spec draft adaptive": (draft_engine, None), "mlx-spec ngram adaptive": (ngram, None)})
    for width in (int(w) for w in args.widths.split(",") if w):  # trees on the same weights
        drafter = DraftModelDrafter(draft_model, draft_engine.drafter.vocab_size, width=width)
        engines[f"mlx-spec chain or tree w={width} adaptive"] = (Engine(Target(model), draft_engine.tokenizer, drafter, None,
                                                               draft_engine.max_draft_len), None)
    for engine, _ in engines.values():
        engine.tokenizer.eos_token_ids = []  # every contender makes exactly n tokens

    print(f"target {target_dir.name}, draft {draft_dir.name}, float32, BLAS: {linux_blas.describe()}; {n} tokens, "
          f"{len(PROMPTS)} prompts x {args.reps} repetitions, T={args.temp}", flush=True)
    speeds, by_prompt, outputs, acceptance = {}, {}, {}, {}
    with Neighbours() as neighbours:
        for p, prompt in enumerate(PROMPTS):
            ids = mlx_spec.render_prompt(draft_engine.tokenizer, prompt)
            contenders = {"mlx-lm plain": lambda: rate(int(out[0]) for out in generate_step(
                mx.array(ids), model, max_tokens=n, sampler=sampler))}
            for k in ks:
                contenders[f"mlx-lm speculative k={k}"] = lambda k=k: rate(int(out[0]) for out in (
                    speculative_generate_step(mx.array(ids), model, draft_model, num_draft_tokens=k, max_tokens=n,
                                              sampler=sampler)))
            for name, (engine, k) in engines.items():
                def run(name=name, engine=engine, k=k):
                    engine.pin(k)  # a fresh policy for each generation, as each command gets
                    return rate(mlx_spec_tokens(engine.stream(ids, params, n, seed=0),
                                                acceptance.setdefault(name, [])))
                contenders[name] = run
            if p == 0:  # one untimed pass: compilation, first touches of the weights
                for run in contenders.values():
                    run()
            for _ in range(args.reps):
                for name, run in contenders.items():
                    tokens, tps = run()
                    speeds.setdefault(name, []).append(tps)
                    by_prompt.setdefault(name, {}).setdefault(p, []).append(tps)
                    outputs.setdefault((name, p), tokens)
    baseline = statistics.median(speeds["mlx-lm plain"])
    print("| contender | tok/s (median) | spread | vs mlx-lm plain | acceptance | same tokens as plain |")
    print("|---|---|---|---|---|---|")
    for name, values in speeds.items():
        same = all(outputs[(name, p)] == outputs[("mlx-lm plain", p)] for p in range(len(PROMPTS)))
        accepted = f"{statistics.mean(acceptance[name]):.2f}" if acceptance.get(name) and "off" not in name else "-"
        print(f"| {name} | {statistics.median(values):.2f} | {spread_cell(by_prompt[name].values())} | "
              f"{statistics.median(values) / baseline:.2f}x | {accepted} | {same if greedy else 'n/a (sampled)'} |")
    ratios = [statistics.median(speeds[f"mlx-spec draft k={k}"])
              / statistics.median(speeds[f"mlx-lm speculative k={k}"]) for k in ks]
    print("mlx-spec draft pinned / mlx-lm speculative: " + ", ".join(f"k={k} {r:.2f}x" for k, r in zip(ks, ratios)))
    print(verdict(neighbours, by_prompt["mlx-lm plain"].values()))
    print(raw_lines_by_prompt(by_prompt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
