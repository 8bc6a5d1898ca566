"""Predicted Outputs on code edits, on real weights: the model re-emits a source file from the standard library
(its first 200-400 tokens) with a one-line change, given the file before the change as the prediction. Plain
decoding, n-gram drafting without the prediction, and the prediction (drafting otherwise off, and with n-gram),
interleaved file by file in one process, greedy, every output checked against plain.

    python scripts/bench_prediction.py [--model qwen2.5-coder-1.5b --files 3 --reps 1]

Prints, per file, decode tok/s (first token to last) and the ratio to plain for each, and the prediction's
accepted / rejected tokens (OpenAI's `accepted_prediction_tokens` / `rejected_prediction_tokens`).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
from pathlib import Path

import mlx_spec  # first, before mlx: it points MLX at the system OpenBLAS on Linux

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from timings import raw_line  # noqa: E402

MODULES = ["colorsys", "bisect", "fnmatch", "linecache", "genericpath", "queue"]
WAYS = ("plain", "ngram", "prediction", "prediction + ngram")


def source(module: str, tokenizer, longest: int = 400) -> tuple[str, str]:
    """The module's first lines up to `longest` tokens, and the first `def` line among them."""
    lines, kept = inspect.getsource(__import__(module)).splitlines(keepends=True), []
    for line in lines:
        if len(tokenizer.encode("".join(kept + [line]))) > longest:
            break
        kept.append(line)
    text = "".join(kept)
    return text, next(line.strip() for line in kept if line.lstrip().startswith("def "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", choices=sorted(real_models.MODELS))
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    [path] = real_models.converted("bench_prediction.py", args.model)
    plain = mlx_spec.load(str(path), drafter="off")
    ngram = plain.with_drafter("ngram")
    print(f"python scripts/bench_prediction.py --model {args.model} --files {args.files} --reps {args.reps}")
    print(f"{args.model} float32, BLAS: {linux_blas.describe()}; greedy; decode tok/s, first token to last")
    print("| file | tokens | plain | n-gram | prediction | prediction + n-gram | accepted / rejected | same as plain |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = {way: [] for way in WAYS[1:]}
    with Neighbours() as neighbours:
        for module in MODULES[:args.files]:
            text, line = source(module, plain.tokenizer)
            messages = [{"role": "user", "content": f"Here is a Python file:\n```python\n{text}```\nAdd the comment "
                         f"`# reviewed` at the end of the line `{line}` and change nothing else. Reply with the "
                         "whole file in one ```python block and nothing else."}]
            prediction = f"```python\n{text}```"
            budget = len(plain.tokenizer.encode(prediction)) + 32
            rates, outputs = {way: [] for way in WAYS}, {}
            for _ in range(args.reps):
                for way in WAYS:
                    engine = ngram if "ngram" in way else plain
                    result = engine.generate(messages, max_tokens=budget,
                                             prediction=prediction if "prediction" in way else None)
                    rates[way].append(result.stats.decode_tps)
                    outputs[way] = result
                    print(raw_line(f"{module}, {way}", "tok/s", [result.stats.decode_tps]), flush=True)
            tps = {way: statistics.median(values) for way, values in rates.items()}
            for way in WAYS[1:]:
                ratios[way].append(tps[way] / tps["plain"])
            same = all(outputs[way].tokens == outputs["plain"].tokens for way in WAYS)
            accepted, rejected = outputs["prediction"].stats.prediction
            print(f"| {module}.py | {len(outputs['plain'].tokens)} | {tps['plain']:.2f} | "
                  + " | ".join(f"{tps[way]:.2f} ({tps[way] / tps['plain']:.2f}x)" for way in WAYS[1:])
                  + f" | {accepted} / {rejected} | {'yes' if same else 'NO'} |", flush=True)
    print("geometric mean over files: " + ", ".join(
        f"{way} {statistics.geometric_mean(values):.2f}x plain" for way, values in ratios.items()))
    print(neighbours.verdict()[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
