"""How often each exact verification rule accepts a draft, on real weights: rejection sampling against
sample-and-match, the Qwen2.5-Coder 1.5B target with its 0.5B sibling as draft (float32, scripts/real_models.py).

    python scripts/acceptance_rules.py [--prompts 4 --tokens 32 --k 4 --temps 0.7,1.0]

Every rule here is exact: what it emits follows the target's distribution. They differ in how often a draft
passes. With p the target's and q the draft's distribution at a position (both at temperature T):
  rejection sampling (mlx-spec), a draft sampled from q, accepts it with probability  sum_x min(p(x), q(x));
  sample-and-match (mlx-lm: the target samples its own token, the draft passes if it is the same) accepts a
  draft sampled from q with probability  sum_x p(x) q(x);
  a greedy draft (argmax q, as llama.cpp's server and vLLM's default draft) passes either rule with  p(argmax q).
For coding prompts from scripts/code_prompts.py (documented functions of Python's standard library, chat-
templated), mlx-lm's speculative_generate_step and mlx-spec (draft model pinned at k) generate at the same k on
the same weights. Expected: those three, computed with NumPy from both models' logits along the text mlx-lm
generated (every token of it the target's own sample, drafted or not). Observed, in each engine's own
generations: the share of rounds whose first draft passed (a measurement of the per-position rate above, with
its 95% interval), accepted / drafted over all positions, and tokens per round.
Acceptance is not a timing: the figures do not depend on how busy the machine is.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import sysconfig
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

import mlx.core as mx
import numpy as np
from mlx_lm.generate import speculative_generate_step
from mlx_lm.sample_utils import make_sampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import code_prompts  # noqa: E402
import real_models  # noqa: E402
from mlx_spec.core.events import Round  # noqa: E402
from mlx_spec.core.sampling import SamplingParams  # noqa: E402

STDLIB_PACKAGES = ("asyncio", "email", "http", "json", "logging", "urllib", "xml")  # not site-packages


def chosen_prompts(count: int, seed: int) -> list[str]:
    """`count` coding prompts drawn from documented functions of some standard-library packages."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = sorted({p for package in STDLIB_PACKAGES for p in code_prompts.prompts(stdlib / package)})
    return random.Random(seed).sample(found, min(count, len(found)))


def distributions(model, ids: list[int], start: int, temperature: float, vocab: int) -> np.ndarray:
    """The model's next-token distributions at temperature T (float64) for positions start .. len(ids) - 1,
    each predicting the token after it, from one forward pass without a cache."""
    logits = model(mx.array(ids)[None])[0, start:, :vocab].astype(mx.float32)
    scaled = np.array(logits, dtype=np.float64) / temperature
    scaled -= scaled.max(axis=-1, keepdims=True)
    probs = np.exp(scaled)
    return probs / probs.sum(axis=-1, keepdims=True)


def expected_rates(p: np.ndarray, q: np.ndarray) -> dict[str, np.ndarray]:
    """Per position, the probability that each rule accepts a draft there."""
    return {"rejection": np.minimum(p, q).sum(-1), "match": (p * q).sum(-1),
            "greedy": p[np.arange(len(p)), q.argmax(-1)]}


def match_rounds(from_draft: list[bool], k: int, max_tokens: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per round of mlx-lm's speculative_generate_step, from its from_draft flags: a round
    drafts min(k, tokens left), yields its accepted drafts (True), then one token of the target's (False)
    unless the generation is complete."""
    rounds, i, made = [], 0, 0
    while i < len(from_draft):
        drafted, accepted = min(k, max_tokens - made), 0
        while i < len(from_draft) and from_draft[i] and accepted < drafted:
            accepted, i = accepted + 1, i + 1
        made += accepted
        if made < max_tokens:
            assert not from_draft[i], "a round ends with the target's own token"
            i, made = i + 1, made + 1
        rounds.append((drafted, accepted))
    return rounds


def observed(rounds: list[tuple[int, int]], tokens: int) -> tuple[str, str, str]:
    """Table cells: first-draft acceptance with its 95% interval, accepted / drafted, tokens per round."""
    drafting = [accepted for drafted, accepted in rounds if drafted]
    first = sum(a > 0 for a in drafting) / len(drafting)
    half_width = 1.96 * math.sqrt(first * (1 - first) / len(drafting))
    rate = sum(a for _, a in rounds) / sum(d for d, _ in rounds)
    return f"{first:.3f} ± {half_width:.3f} ({len(drafting)} rounds)", f"{rate:.3f}", f"{tokens / len(rounds):.2f}"


def measure(engine, prompts: list[list[int]], temperature: float, n: int, k: int, seed: int):
    """At one temperature: each rule's expected acceptance per position (mean over every position of every
    prompt), and the (drafted, accepted) rounds of mlx-spec's generations and of mlx-lm's."""
    model, draft = engine.target.model, engine.drafter.weights  # mlx-lm runs the same weights, with its own code
    expected, ours, theirs = {}, [], []
    for i, ids in enumerate(prompts):
        mx.random.seed(seed + i)
        out = list(speculative_generate_step(mx.array(ids), model, draft, num_draft_tokens=k, max_tokens=n,
                                             sampler=make_sampler(temp=temperature)))
        theirs += match_rounds([bool(f) for _, _, f in out], k, n)
        text = [int(t) for t, _, _ in out]  # the target's samples: each is one, whether drafted or not
        p, q = (distributions(m, ids + text[:-1], len(ids) - 1, temperature, engine.drafter.vocab_size)
                for m in (model, draft))
        for rule, rates in expected_rates(p, q).items():
            expected.setdefault(rule, []).extend(rates)
        ours += [(e.draft_len, e.accepted) for e in engine.stream(
            ids, SamplingParams(temperature=temperature), n, seed=seed + i) if isinstance(e, Round)]
    return {rule: float(np.mean(rates)) for rule, rates in expected.items()}, ours, theirs


def report(temperature: float, tokens: int, mean: dict, ours: list, theirs: list) -> None:
    """One temperature's table; `tokens`: what each engine generated in all, as many as the text has positions."""
    print(f"\nT={temperature} ({tokens} positions)")
    print("| rule | draft | expected acceptance per position | observed first-draft acceptance | "
          "observed accepted / drafted | tokens per round |")
    print("|---|---|---|---|---|---|")
    print(f"| rejection sampling (mlx-spec) | sampled from q | Σ min(p, q) = {mean['rejection']:.3f} | "
          + " | ".join(observed(ours, tokens)) + " |")
    print(f"| sample and match (mlx-lm) | sampled from q | Σ p·q = {mean['match']:.3f} | "
          + " | ".join(observed(theirs, tokens)) + " |")
    print(f"| either rule | argmax q | p(argmax q) = {mean['greedy']:.3f} | - | - | - |")
    print(f"rejection sampling accepts {mean['rejection'] / mean['match']:.2f}x what sample-and-match does "
          f"per position at T={temperature}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="per prompt, generation and sampled text alike")
    parser.add_argument("--k", type=int, default=4, help="draft length, both engines")
    parser.add_argument("--temps", default="0.7,1.0")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    target_dir, draft_dir = (real_models.mlx_dir(n) for n in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"))
    if not (target_dir.exists() and draft_dir.exists()):
        print("fetch the models first: python scripts/real_models.py qwen2.5-coder-1.5b qwen2.5-coder-0.5b")
        return 2
    engine = mlx_spec.load(str(target_dir), draft_model=str(draft_dir))
    engine.tokenizer.eos_token_ids = []  # every generation makes exactly --tokens, as mlx-lm's does
    engine.pin(args.k)
    prompts = [mlx_spec.render_prompt(engine.tokenizer, [{"role": "user", "content": text}])
               for text in chosen_prompts(args.prompts, args.seed)]
    print(f"target {target_dir.name}, draft {draft_dir.name}; {len(prompts)} code prompts x {args.tokens} tokens, "
          f"k={args.k}; expected: mean over the positions of text the target sampled; observed: each engine's own "
          f"generations")
    for temperature in (float(t) for t in args.temps.split(",")):
        mean, ours, theirs = measure(engine, prompts, temperature, args.tokens, args.k, args.seed)
        report(temperature, args.tokens * len(prompts), mean, ours, theirs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
