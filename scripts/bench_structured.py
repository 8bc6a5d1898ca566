"""Constrained output on real weights: JSON-schema answers with speculation against plain constrained decoding.

    python scripts/bench_structured.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
                                       [--tokens 128 --reps 2]

Eight requests an agent might send: describe something as JSON, the schema in the prompt and in the grammar
(`mlx_spec.Grammar`, as `response_format` builds it). Plain decoding (drafting off) and each drafter (the draft
model, n-gram; adaptive draft length) answer each under its grammar, interleaved in one process after an untimed
warm-up. Prints decode tok/s per contender, the ratio to plain, acceptance (the text the grammar forces
included), how many drafts of that text were accepted, whether every output equals plain
constrained decoding token for token and is valid JSON, and whether the machine was quiet. Float32 weights from
`scripts/real_models.py`. Every run's own tok/s goes out as a raw-timings line (scripts/timings.py), which
scripts/record.py keeps apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from mlx_spec import Grammar
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from timings import raw_line  # noqa: E402

STRING, INTEGER = {"type": "string"}, {"type": "integer"}


def obj(**properties) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


REQUESTS = [
    ("the GitHub repository of NumPy", obj(name=STRING, language=STRING, stars=INTEGER,
                                             topics={"type": "array", "items": STRING, "maxItems": 4})),
    ("a Python function that merges two sorted lists", obj(name=STRING, arguments={"type": "array", "items": obj(
        name=STRING, type=STRING), "maxItems": 4}, returns=STRING, docstring=STRING)),
    ("the book Dune", obj(title=STRING, author=STRING, year=INTEGER, genres={"type": "array", "items": STRING,
                                                                           "maxItems": 3})),
    ("a meeting next Monday at 10 about the budget", obj(title=STRING, day=STRING, hour=INTEGER,
                                                         attendees={"type": "array", "items": STRING,
                                                                    "maxItems": 4})),
    ("the city of Lyon", obj(name=STRING, country=STRING, population=INTEGER, rivers={"type": "array",
                                                                                   "items": STRING})),
    ("a failing unit test in a web app", obj(test_name=STRING, file=STRING, line=INTEGER, error=STRING,
                                             severity={"enum": ["low", "medium", "high"]})),
    ("an HTTP request that creates a user", obj(method={"enum": ["GET", "POST", "PUT", "DELETE"]}, path=STRING,
                                                headers=obj(content_type=STRING), body=obj(name=STRING,
                                                                                        email=STRING))),
    ("a laptop for sale", obj(brand=STRING, model=STRING, price_usd=INTEGER, memory_gb=INTEGER,
                              in_stock={"type": "boolean"})),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", choices=sorted(real_models.MODELS))
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="a draft model of the same vocabulary, or "
                                                                        "'none'")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--requests", type=int, default=len(REQUESTS), help="how many of the eight requests")
    args = parser.parse_args()
    target, draft = real_models.converted("bench_structured", args.target, args.draft)
    engine = mlx_spec.load(str(target), draft_model=str(draft) if draft else None, drafter="off")
    contenders = {"plain": engine, **{name: engine.with_drafter(name)
                                      for name in (["draft-model"] if draft else []) + ["ngram"]}}
    requests = REQUESTS[:args.requests]
    print(f"{args.target}{f' + {args.draft}' if draft else ''}, float32, {linux_blas.describe()}; "
          f"{len(requests)} JSON-schema requests x up to {args.tokens} tokens x {args.reps} reps, greedy")
    tps = {name: [] for name in contenders}
    drafted, accepted = dict.fromkeys(contenders, 0), dict.fromkeys(contenders, 0)
    forced = {name: [0, 0] for name in contenders}  # drafts of the text the grammar forced, and those accepted
    identical, valid = True, True
    with Neighbours() as neighbours:
        for rep in range(args.reps + 1):  # the first pass, over the first request only, is untimed
            for subject, schema in requests[:1] if rep == 0 else requests:
                messages = [{"role": "user", "content": f"Describe {subject} as a JSON object of this schema:\n"
                                                        f"{json.dumps(schema)}"}]
                outputs = {}
                for name, contender in contenders.items():
                    result = contender.generate(messages, max_tokens=args.tokens,
                                                grammar=Grammar(engine.tokenizer, "json_schema", schema))
                    outputs[name] = result.tokens
                    if rep:
                        tps[name].append(result.stats.decode_tps)
                        drafted[name] += result.stats.drafted
                        accepted[name] += result.stats.accepted
                        for i, count in enumerate(result.stats.forced or (0, 0)):
                            forced[name][i] += count
                    if name == "plain" and result.stop_reason == "eos":
                        try:
                            json.loads(result.text)
                        except json.JSONDecodeError:
                            valid = False
                identical &= all(tokens == outputs["plain"] for tokens in outputs.values())
    reliable, note = neighbours.verdict()
    plain = statistics.median(tps["plain"])
    print("| contender | decode tok/s (median) | vs plain | acceptance | forced drafts accepted |")
    print("|---|---|---|---|---|")
    for name in contenders:
        rate = statistics.median(tps[name])
        share = f"{accepted[name] / drafted[name]:.0%}" if drafted[name] else "-"
        taken = f"{forced[name][1]}/{forced[name][0]}" if forced[name][0] else "-"
        print(f"| {name} | {rate:.1f} | {rate / plain:.2f}x | {share} | {taken} |")
    print(f"every output equal to plain constrained decoding: {'yes' if identical else 'NO'}; "
          f"finished answers valid JSON: {'yes' if valid else 'NO'}")
    print(note)
    print("\n".join(raw_line(name, "tok/s", runs) for name, runs in tps.items()))
    return 0 if identical and valid else 1


if __name__ == "__main__":
    sys.exit(main())
