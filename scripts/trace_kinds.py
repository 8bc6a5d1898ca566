"""Traces of the kinds-of-work suite (`mlx-spec bench --suite work`) on real weights, for
tests/test_policy_kinds.py to replay the adaptive policy on: every prompt's greedy answer and, at each of its
positions, what the drafter would draft there.

    python scripts/trace_kinds.py draft-1.5b [--tokens 128 --out tests/traces/kinds]
    python scripts/trace_kinds.py ngram-0.5b

draft-1.5b (Qwen2.5-Coder-1.5B with its 0.5B draft model): the target's greedy answer (every token, end of turn
included: exactly --tokens, as scripts/bench_policy.py makes them), then one forward of the draft model over the
prompt and answer (teacher forcing): at each answer position whether its greedy draft is the answer's token and
the draft's probability of it (its confidence), and at T = 0.7 the chance a sampled draft passes (sum of min(p, q)
over the vocabulary, p the target's and q the draft's distributions there). A chain from a position passes as far
as the drafts match, since each draft then sees the answer's own context. ngram-0.5b: the 0.5B's answers; the
replay's n-gram drafter drafts on them itself. Round costs are not recorded here: the replays take them from the
pinned runs of the same pair on code (tests/traces/draft-1.5b.json, ngram-0.5b.json), at the same band of
context depths.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import mlx.core as mx  # noqa: E402
import real_models  # noqa: E402
from mlx_lm import load as mlx_lm_load  # noqa: E402

from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.core.prompts import WORK, load_prompts, render_prompt  # noqa: E402

PAIRS = {"draft-1.5b": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"), "ngram-0.5b": ("qwen2.5-coder-0.5b", None)}
TEMPERATURE = 0.7


def teacher_forced(model, ids: list[int], start: int) -> mx.array:
    """The model's logits (float32) for each token of ids[start:] given the ones before it."""
    logits = model(mx.array([ids]))[0, start - 1:-1].astype(mx.float32)
    mx.eval(logits)
    return logits


def draft_verdicts(target, draft, ids: list[int], answer: list[int]) -> dict:
    """At each answer position: the greedy draft passing (0 / 1), its probability, and a sampled draft's chance."""
    full = ids + answer
    q = teacher_forced(draft, full, len(ids))
    p = teacher_forced(target, full, len(ids))
    width = min(p.shape[-1], q.shape[-1])
    p, q = p[:, :width], q[:, :width]
    greedy = mx.softmax(q, axis=-1)
    drafted = mx.argmax(q, axis=-1)
    sampled = mx.minimum(mx.softmax(p / TEMPERATURE, axis=-1), mx.softmax(q / TEMPERATURE, axis=-1)).sum(-1)
    return {"match": (drafted == mx.array(answer)).astype(mx.int32).tolist(),
            "confidence": [round(c, 4) for c in mx.max(greedy, axis=-1).tolist()],
            "overlap": [round(o, 4) for o in sampled.tolist()]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pair", choices=sorted(PAIRS))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "tests/traces/kinds")
    args = parser.parse_args()
    target_name, draft_name = PAIRS[args.pair]
    target_dir, draft_dir = real_models.converted("trace_kinds.py", target_name, draft_name)
    engine = mlx_spec.load(str(target_dir), **({"draft_model": str(draft_dir)} if draft_dir else {}))
    engine.tokenizer.eos_token_ids = []  # exactly --tokens, as the policy benchmarks make them
    target = draft = None
    if draft_dir:
        target, _ = mlx_lm_load(str(target_dir))
        draft, _ = mlx_lm_load(str(draft_dir))
    kinds = load_prompts(None, str(WORK))
    prompts, start = [], time.perf_counter()
    with Neighbours() as neighbours:
        for kind, (_, chats) in kinds.items():
            for chat in chats:
                ids = render_prompt(engine.tokenizer, chat)
                answer = mlx_spec.generate(engine, ids, max_tokens=args.tokens).tokens  # greedy: plain's tokens
                entry = {"kind": kind, "prompt_tokens": len(ids), "prompt": ids, "answer": answer}
                if draft is not None:
                    entry.update(draft_verdicts(target, draft, ids, answer))
                    print(f"{kind}: {len(ids)} prompt tokens, greedy drafts pass "
                          f"{sum(entry['match']) / len(answer):.0%}, T={TEMPERATURE} "
                          f"{sum(entry['overlap']) / len(answer):.0%}", flush=True)
                prompts.append(entry)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.pair}.json"
    path.write_text(json.dumps({"trace": f"kinds-{args.pair}", "target": target_name, "drafter":
                                "draft" if draft_dir else "ngram", "tokens": args.tokens,
                                "load": round(neighbours.share, 3), "prompts": prompts},
                               separators=(",", ":")) + "\n")
    print(f"wrote {path} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
