"""The adaptive draft length against plain decoding and every pinned length, on real weights; also records the
rounds that tests/test_policy_traces.py replays (tests/traces/).

    python scripts/bench_policy.py draft-1.5b [--tokens 64 --prompts 2 --reps 2 --trace tests/traces]
    python scripts/bench_policy.py ngram-smollm2 --context 512,2048,7680 --tokens 128 --reps 1
    python scripts/bench_policy.py mtp-smollm2 --temp 0.7 --top-p 0.9
    python scripts/bench_policy.py ngram-gemma3 --tokens 256
    python scripts/bench_policy.py ngram-0.5b --context 16384 --tokens 128 --reps 1 --pinned 2

For one target and drafter (PAIRS; float32 from scripts/real_models.py; mtp-smollm2: the MTP head that
scripts/train_compare.py trains), greedy or sampled (--temp, --top-p; each repetition its own seed: n-gram's
single-token drafts still give plain decoding's very tokens for the seed, which is checked; a drafter that samples
its drafts gives other samples, so none is checked, no trace is kept, and since each contender is timed on answers of
its own, each pinned length's speed is also predicted from every contender's rounds together), every contender
interleaved in one process after an untimed pass: plain decoding, the drafter pinned at k = 1..8 and 12 (--pinned:
fewer), the adaptive policy as a first run on this machine ("adaptive, first run": nothing
learnt) and as later runs ("adaptive": starting from the profile the earlier adaptive runs kept, as each command does
from ~/.cache/mlx-spec/policy; here kept in memory, nothing written). Prints each contender's median decode tok/s and
its ratio to plain decoding, the adaptive runs against the best pinned length chosen in hindsight, whether every output
equals plain decoding's, and the machine's load. --context: the same at each length of a long context (the start of a
real source file, a question at the end), where verifying costs and acceptance change with depth. With --trace, writes
<pair>.json there (a ladder: <pair>-context.json, one prompt a rung): the prompt's and the answer's tokens, and each
round's draft length, accepted drafts and cost in plain steps (seconds from one round's end to the next, as the engine
times them, over the median plain step of the same prompt) of the first repetition. Every run's own tok/s goes out
as a raw-timings line (scripts/timings.py), which scripts/record.py keeps apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import real_models  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.core.events import Round, Token  # noqa: E402
from mlx_spec.policy.sequence import UNTIMED_ROUNDS  # noqa: E402
from timings import raw_line, verdict  # noqa: E402

PAIRS = {  # name: (target, drafter keyword arguments of mlx_spec.load)
    "draft-1.5b": ("qwen2.5-coder-1.5b", {"draft_model": "qwen2.5-coder-0.5b"}),
    "ngram-1.5b": ("qwen2.5-coder-1.5b", {"drafter": "ngram"}),
    "ngram-0.5b": ("qwen2.5-coder-0.5b", {"drafter": "ngram"}),
    "ngram-smollm2": ("smollm2-135m", {"drafter": "ngram"}),
    "ngram-gemma3": ("gemma3-270m", {"drafter": "ngram"}),
    "mtp-smollm2": ("smollm2-135m", {"mtp_path": str(ROOT / "build/train-compare/smollm2-135m-f32/mtp")}),
}
MADE_BY = {"mtp_path": "python scripts/train_compare.py --model smollm2-135m --kinds mtp"}  # what trains a head
PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string and returns a datetime, with a docstring.",
    "Complete this code:\ndef binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n",
    "Write a Python class for a least-recently-used cache with get and put, and a short usage example.",
    "Refactor this to use a dataclass:\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n"
    "        self.y = y\n    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n",
]
MAX_K, LONGEST = 8, 12  # pinned lengths: 1..MAX_K, the range the adaptive policy is held to, and LONGEST


def rounds(engine, ids: list[int], n: int, sampling: dict) -> tuple[list[list], float, list[int]]:
    """[draft_len, accepted, seconds] of each round of a generation of n tokens (`sampling`: temperature and top-p,
    none: greedy), its decode tok/s (counted from its first token, as `mlx-spec bench` does) and its tokens."""
    out, tokens, tick, start = [], [], time.perf_counter(), None
    for event in mlx_spec.stream(engine, ids, max_tokens=n, **sampling):
        if isinstance(event, Round):
            now = time.perf_counter()
            out.append([event.draft_len, event.accepted, now - tick])
            tick = now
        elif isinstance(event, Token):
            tokens.append(event.id)
            start = start or time.perf_counter()
    return out, (len(tokens) - 1) / (time.perf_counter() - start), tokens


def long_context(tokenizer, tokens: int) -> list[dict]:
    """A chat of about `tokens` tokens: the start of a real source file (Python's own argparse.py), then a question
    about it at the end."""
    question = "\n```\nSummarize what the code above does, then write a unit test for one of its functions."
    kept, count = [], 0
    for line in Path(argparse.__file__).read_text().splitlines(keepends=True):
        count += len(tokenizer.encode(line, add_special_tokens=False))
        if count > tokens - 60:
            break
        kept.append(line)
    return [{"role": "user", "content": "```python\n" + "".join(kept) + question}]


def measure(engine, chats: list, contenders: dict, adaptive_max: int, tokens: int, reps: int, sampling: dict,
            compared: bool, learnt=None):
    """Every contender on every chat, interleaved after an untimed pass: tok/s by contender, whether every output
    equals plain decoding's, each chat's plain runs (tok/s), the first repetition's rounds, the profile the
    "adaptive" runs kept (what the next starts from), and every timed run's rounds as (draft length, accepted, cost
    in plain steps, whether the engine times it) for `model`."""
    speeds, plain_by_chat, same, traces, pooled = {}, [], True, [], []
    for p, chat in enumerate(chats):
        ids = mlx_spec.render_prompt(engine.tokenizer, chat)
        first, outputs, plain_runs, runs = {}, {}, [], []
        for rep in range(-1 if p == 0 else 0, reps):  # first an untimed pass: compilation, first touches
            seeded = {**sampling, "seed": max(rep, 0)} if sampling else sampling  # sampled: a seed a repetition
            for name, k in contenders.items():
                engine.max_draft_len = adaptive_max if k is None else LONGEST
                engine.learnt = None if name == "adaptive, first run" else learnt
                engine.pin(k)  # a fresh policy for each generation, as each command gets
                run, tps, outputs[name] = rounds(engine, ids, tokens, seeded)
                if name == "adaptive":
                    learnt = engine.learnt  # what the next command starts from
                if rep >= 0:
                    speeds.setdefault(name, []).append(tps)
                    first.setdefault(name, run)
                    plain_runs += [tps] if k == 0 else []
                    runs.append(run)
            same = same and (not compared or all(t == outputs["plain"] for t in outputs.values()))
        plain_by_chat.append(plain_runs)
        plain_step = statistics.median(seconds for _, _, seconds in first["plain"][UNTIMED_ROUNDS:])
        traces.append({"prompt_tokens": len(ids), "prompt": ids, "answer": outputs["plain"],
                       "rounds": {name: [[k, a, round(s / plain_step, 3)] for k, a, s in r]
                                  for name, r in first.items()}})
        pooled += [(k, a, s / plain_step, i >= UNTIMED_ROUNDS) for run in runs for i, (k, a, s) in enumerate(run)]
    return speeds, same, plain_by_chat, traces, learnt, pooled


def model(pooled: list[tuple], max_k: int) -> str:
    """Each pinned length's speed against plain decoding as every contender's rounds together predict it, free of
    which answers each contender happened to sample: tokens a round (by the acceptance at each draft position,
    from every round that judged it) over its median cost in plain steps (from every timed round of that length)."""
    judged, passed = [0] * LONGEST, [0] * LONGEST
    costs: dict[int, list[float]] = {}
    for k, accepted, cost, timed in pooled:
        for j in range(min(k, accepted + 1)):
            judged[j] += 1
            passed[j] += j < accepted
        if timed:
            costs.setdefault(k, []).append(cost)
    acceptance = [passed[j] / judged[j] if judged[j] else 0.0 for j in range(LONGEST)]
    plain, expected, chance, speeds = statistics.median(costs[0]), 1.0, 1.0, []
    for k in range(1, max_k + 1):
        chance *= acceptance[k - 1]
        expected += chance
        if costs.get(k):
            speeds.append(f"k={k} {expected * plain / statistics.median(costs[k]):.2f}x")
    return ("acceptance by draft position over every round: " + " ".join(f"{a:.0%}" for a in acceptance[:max_k])
            + "\npinned lengths as those rounds predict them: " + ", ".join(speeds))


def report(speeds: dict, same: bool, compared: bool, sampled: bool, max_k: int) -> None:
    plain = statistics.median(speeds["plain"])
    held = {f"k={k}" for k in range(1, max_k + 1)}  # the range the adaptive policy is compared with
    pinned = {name: statistics.median(v) for name, v in speeds.items() if name in held}
    best = max(pinned, key=pinned.get)
    print("| contender | tok/s (median) | vs plain | vs best pinned |\n|---|---|---|---|")
    for name, values in speeds.items():
        tps = statistics.median(values)
        print(f"| {name} | {tps:.2f} | {tps / plain:.2f}x | {tps / pinned[best]:.3f} |")
    print(f"best pinned in hindsight (k = 1..{max_k}): {best}; adaptive / best pinned = "
          f"{statistics.median(speeds['adaptive']) / pinned[best]:.3f}, first run "
          f"{statistics.median(speeds['adaptive, first run']) / pinned[best]:.3f}; " + (
              "sampled: outputs not compared" if not compared else
              f"{'sampled' if sampled else 'greedy'} outputs identical to plain decoding: {'all' if same else 'NO'}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pair", choices=sorted(PAIRS))
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=2, help=f"how many of the {len(PROMPTS)} code prompts")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--context", default="", help="instead, a ladder of long contexts: prompt lengths in "
                        "tokens, comma-separated (a source file, the question at the end), a table each")
    parser.add_argument("--trace", type=Path, help="a folder to write the first repetition's rounds to (greedy)")
    parser.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--pinned", type=int, default=MAX_K, choices=range(1, MAX_K + 1), metavar=f"1..{MAX_K}",
                        help=f"pin lengths 1..this only (default {MAX_K}, and {LONGEST} beside): a long context's "
                        "rung where every length past the first loses, in a third of the time")
    args = parser.parse_args()
    sampling = {"temperature": args.temp, "top_p": args.top_p, "seed": 0} if args.temp else {}
    if sampling and args.trace:
        parser.error("--trace replays greedy rounds only: leave out --temp")
    os.environ["MLX_SPEC_POLICY_PROFILES"] = ""  # profiles kept in memory only: nothing of the user's read or written
    target, drafter = PAIRS[args.pair]
    [target_dir] = real_models.converted("bench_policy.py", target)
    drafter = {key: str(real_models.converted("bench_policy.py", value)[0]) if key == "draft_model" else value
               for key, value in drafter.items()}
    for key, made_by in MADE_BY.items():
        if key in drafter and not Path(drafter[key]).exists():
            sys.exit(f"bench_policy.py: {drafter[key]} is missing: run `{made_by}` first")
    engine = mlx_spec.load(str(target_dir), **drafter)
    adaptive_max = engine.max_draft_len  # the adaptive policy's bound as users run it
    engine.tokenizer.eos_token_ids = []  # every contender makes exactly n tokens
    contenders = {"plain": 0, **{f"k={k}": k for k in range(1, args.pinned + 1)},
                  **({f"k={LONGEST}": LONGEST} if args.pinned == MAX_K else {}),
                  "adaptive, first run": None, "adaptive": None}
    kind = drafter.get("drafter") or ("draft" if "draft_model" in drafter else "mtp")
    what = {"draft": f"draft model {Path(drafter.get('draft_model', '')).name}",
            "mtp": f"MTP head {drafter.get('mtp_path')}"}.get(kind, kind)
    rungs = [int(n) for n in args.context.split(",") if n]
    shown = f"contexts of {args.context} tokens" if rungs else f"{args.prompts} prompts"
    how = f"T={args.temp}, top-p {args.top_p}" if sampling else "greedy"
    print(f"{args.pair}: {target_dir.name}, {what}; float32, BLAS: {linux_blas.describe()}; {args.tokens} tokens, "
          f"{shown} x {args.reps} repetitions, {how}, interleaved; adaptive up to {adaptive_max}", flush=True)
    plain_runs, all_same, learnt, traced = [], True, None, []
    compared = not sampling or kind == "ngram"  # single-token drafts: a seed's draws are plain sampling's
    with Neighbours() as neighbours:
        for rung in rungs or [None]:
            chats = [long_context(engine.tokenizer, rung)] if rung else PROMPTS[: args.prompts]
            speeds, same, plain_by_chat, traces, learnt, pooled = measure(
                engine, chats, contenders, adaptive_max, args.tokens, args.reps, sampling, compared, learnt)
            if rung:
                print(f"\ncontext of {traces[0]['prompt_tokens']} tokens:")
            report(speeds, same, compared, bool(sampling), args.pinned)
            if not compared:
                print(model(pooled, args.pinned))
            plain_runs += plain_by_chat
            where = f", context of {rung} tokens" if rung else ""
            print("\n".join(raw_line(name + where, "tok/s", runs) for name, runs in speeds.items()))
            traced += traces
            all_same = all_same and same
    print(verdict(neighbours, plain_runs))
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
        name = f"{args.pair}-context" if rungs else args.pair
        path = args.trace / f"{name}.json"
        path.write_text(json.dumps({"trace": name, "target": target, "drafter": kind,
                                    "tokens": args.tokens, "load": round(neighbours.share, 3), "prompts": traced},
                                   separators=(",", ":")) + "\n")
        print(f"wrote {path}")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
