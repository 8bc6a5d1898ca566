"""The default against plain decoding on every kind of work (`mlx-spec bench --suite work`), on real weights, as
a chat meets them: each kind's prompts in turn, each a command that starts from the profile the commands before
it kept, the first from one learnt on code.

    python scripts/bench_kinds.py draft-1.5b --tokens 48 [--kinds writing,translation] [--temp 0.7] [--warm 1]
                                             [--rows 3]   # batches of 3 rows, each a different kind

For one target and drafter (scripts/bench_policy.py's PAIRS), interleaved in one process after an untimed pass
over the code prompts (--warm: the first few; compilation, and the adaptive contenders' profiles learnt there):
plain decoding, the default (the adaptive policy, a draft model's chains stopped where it is unsure:
`DraftPolicy.go_on`) and, where the drafter stops its chains, the default without those stops (the policy before
them), each adaptive contender going on from the profile (and batch policy) its own runs kept, in memory. With
--rows N, the chosen kinds go N at a time into batches (`Engine.stream_many`, as a server decodes a burst of
requests), a row per kind, its p-th prompt, plain decoding being the same batch with every row pinned to 0.
With --reps R, each contender runs each prompt (or batch) R times in turn, every run from the same profile.
Prints per kind (or batch) each contender's median decode tok/s and its ratio to plain decoding per prompt (or
batch; the worst and the median; of median runs), overall, whether greedy outputs equal plain decoding's, and the
machine's load. Every run's tok/s goes out as a raw-timings line (scripts/timings.py).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import real_models  # noqa: E402
from bench_policy import PAIRS  # noqa: E402
from timings import raw_line, verdict  # noqa: E402

from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.core.events import Token  # noqa: E402
from mlx_spec.core.prompts import load_prompts, render_prompt  # noqa: E402
from mlx_spec.core.sampling import SamplingParams  # noqa: E402
from mlx_spec.decode.rounds import Job  # noqa: E402
from mlx_spec.policy.batch import BatchDraftLength  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402

CONTENDERS = ("plain", "default", "without stops")


def run(engine, prompts: list[list[int]], tokens: int, sampling: dict, pin: int | None) -> tuple[float, list]:
    """Decode tok/s (every token but each row's first, from the first token on, as `mlx-spec bench` counts) and
    the tokens of one generation (one prompt) or of one batch of them (several: `Engine.stream_many`, each job
    pinned to `pin`, as the engine is)."""
    outs, start = [[] for _ in prompts], None
    seed, params = sampling.get("seed", 0), {key: value for key, value in sampling.items() if key != "seed"}
    if len(prompts) == 1:
        events = ((0, event) for event in mlx_spec.stream(engine, prompts[0], max_tokens=tokens, **sampling))
    else:
        waiting = [(i, Job(ids, SamplingParams(**params), tokens, seed=seed + i, draft_len=pin))
                   for i, ids in enumerate(prompts)]
        events = engine.stream_many(lambda: waiting.pop(0) if waiting else None, len(prompts))
    for row, event in events:
        if isinstance(event, Token):
            outs[row].append(event.id)
            start = start or time.perf_counter()
    return sum(len(out) - 1 for out in outs) / (time.perf_counter() - start), outs


def contend(engine, name: str, learnt: dict, prompts: list[list[int]], tokens: int, sampling: dict) -> tuple:
    """One command of contender `name`, from (and keeping) its own profile and batch policy in `learnt`."""
    engine.learnt, engine.batch_policy = copy.deepcopy(learnt.get(name, (None, None)))
    pin = 0 if name == "plain" else None
    engine.pin(pin)
    if name == "without stops":
        engine.batch_policy = engine.batch_policy or BatchDraftLength(engine.max_draft_len)
        engine.next_policy.go_on = engine.batch_policy.go_on = lambda confidences: True
    result = run(engine, prompts, tokens, sampling, pin)
    learnt[name] = (engine.learnt, engine.batch_policy)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pair", choices=sorted(PAIRS))
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--kinds", default="", help="comma-separated kinds of the suite (default: every one)")
    parser.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--warm", type=int, default=3, help="code prompts run untimed first (default: all 3)")
    parser.add_argument("--rows", type=int, default=1,
                        help="decode batches of this many rows, each row a different kind (default: 1, one at a time)")
    parser.add_argument("--reps", type=int, default=1,
                        help="runs of each prompt by each contender, every one from the same profile (default: 1)")
    args = parser.parse_args()
    os.environ["MLX_SPEC_POLICY_PROFILES"] = ""  # profiles kept in memory only: nothing of the user's read or written
    target, drafter = PAIRS[args.pair]
    [target_dir] = real_models.converted("bench_kinds.py", target)
    drafter = {key: str(real_models.converted("bench_kinds.py", value)[0]) if key == "draft_model" else value
               for key, value in drafter.items()}
    engine = mlx_spec.load(str(target_dir), **drafter)
    engine.tokenizer.eos_token_ids = []  # every contender makes exactly --tokens
    kinds = load_prompts("work", None)
    chosen = [kind for kind in args.kinds.split(",") if kind] or list(kinds)
    sampling = {"temperature": args.temp, "top_p": 0.9} if args.temp else {}
    what = ", ".join(f"{key} {Path(value).name}" for key, value in drafter.items())
    unit = f"batches of {args.rows} rows (one per kind), {args.reps} run(s) per batch" if args.rows > 1 else \
        f"{args.reps} run(s) per prompt"
    print(f"{args.pair}: {target_dir.name}, {what}; float32, BLAS: {linux_blas.describe()}; {args.tokens} tokens, "
          f"{'T=%g, top-p 0.9' % args.temp if sampling else 'greedy'}, {unit} and contender, interleaved, each "
          "adaptive contender from the profile (and batch policy) its runs kept (the first learnt on code, untimed)",
          flush=True)
    contenders = CONTENDERS if {"draft_model", "mtp_path"} & set(drafter) else CONTENDERS[:2]  # the rest never stop
    learnt, same, speeds, raw, plain_runs = {}, True, {}, {}, []
    warm = [render_prompt(engine.tokenizer, chat) for chat in kinds["code"][1][:max(args.warm, args.rows)]]
    for start in range(0, len(warm), args.rows):  # untimed: compilation, and the profiles a chat has after code
        for name in contenders:
            contend(engine, name, learnt, warm[start:start + args.rows], args.tokens, {**sampling, "seed": 0})
    groups = [chosen[i:i + args.rows] for i in range(0, len(chosen), args.rows)]  # a batch's rows: one kind each
    with Neighbours() as neighbours:
        for group in groups:
            label = " + ".join(group)
            for p in range(min(len(kinds[kind][1]) for kind in group)):
                prompts = [render_prompt(engine.tokenizer, kinds[kind][1][p]) for kind in group]
                outputs, runs, before = {}, {name: [] for name in contenders}, dict(learnt)
                for _ in range(args.reps):
                    for name in contenders:
                        learnt[name] = before.get(name, (None, None))
                        seeded = {**sampling, "seed": p} if sampling else {}
                        speed, outputs[name] = contend(engine, name, learnt, prompts, args.tokens, seeded)
                        runs[name].append(speed)
                for name, speeds_now in runs.items():
                    speeds.setdefault(label, {}).setdefault(name, []).append(statistics.median(speeds_now))
                    raw.setdefault(label, {}).setdefault(name, []).extend(speeds_now)
                plain_runs.append(runs["plain"])
                same = same and (bool(sampling) or all(out == outputs["plain"] for out in outputs.values()))
            print(f"{label}: " + ", ".join(f"{name} {speeds[label][name][-1]:.2f}" for name in contenders), flush=True)
    print(f"\n| {'kinds, a row each' if args.rows > 1 else 'kind'} | plain tok/s | "
          + " | ".join(f"{name} / plain (median, worst prompt)" for name in contenders[1:])
          + " |\n|---|---|" + "---|" * len(contenders[1:]))
    ratios = {name: [] for name in contenders[1:]}
    for kind, by_name in speeds.items():
        cells = []
        for name in contenders[1:]:
            mine = [s / p for s, p in zip(by_name[name], by_name["plain"])]
            ratios[name] += mine
            cells.append(f"{statistics.median(mine):.2f}x, {min(mine):.2f}x")
        print(f"| {kind} | {statistics.median(by_name['plain']):.2f} | " + " | ".join(cells) + " |")
    print("| overall (geometric mean of prompts) | | " + " | ".join(
        f"{statistics.geometric_mean(r):.2f}x, {min(r):.2f}x" for r in ratios.values()) + " |")
    print("greedy outputs identical to plain decoding: " + ("not compared (sampled)" if sampling else
                                                             "all" if same else "NO"))
    for kind, by_name in raw.items():
        print("\n".join(raw_line(f"{name}, {kind}", "tok/s", runs) for name, runs in by_name.items()))
    print(verdict(neighbours, plain_runs))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
