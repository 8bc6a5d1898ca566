"""The prompt cache across conversations (prompt_cache.py): conversations that alternate reuse their own earlier
turns, for every cache type and every drafter that keeps a state of its own, and decode as plain decoding does."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, plain_greedy

import mlx_spec
from mlx_spec.sampling import SamplingParams

OPENINGS = [PROMPT, "class Stack(object):\n", "def main():\n    x = 1\n", "import re\n", "x = [1, 2]\n",
            "def f(a, b):\n", "# notes\n", "for i in range(3):\n"]


def alternate(engine, path, order: list[int], max_tokens: int = 24, kv_bits: int | None = None) -> list:
    """Turns of conversations in `order` (their indices); each turn's prompt is the last one, its answer and some
    more. Checks every answer against mlx-lm's plain decoding; returns each turn's statistics and each
    conversation's tokens so far. A turn's `held`: the tokens its last turn left in a cache (all but its last)."""
    prompts, stats, contexts = {}, [], {}
    for turn, i in enumerate(order):
        prompt = prompts.get(i) or engine.encode(OPENINGS[i])
        result = mlx_spec.generate(engine, prompt, max_tokens=max_tokens)
        assert result.tokens == plain_greedy(path, prompt, max_tokens, kv_bits=kv_bits), (turn, i)
        result.stats.held = len(contexts[i]) - 1 if i in contexts else 0
        stats.append(result.stats)
        contexts[i] = prompt + result.tokens
        prompts[i] = prompt + result.tokens + engine.encode(f"\n# turn {order[:turn].count(i)}\n" + OPENINGS[i])
    return stats, contexts


def next_draft(engine, context: list[int]):
    """What the drafter proposes next, sampled (its distributions depend on all it holds)."""
    draft = engine.drafter.propose(context, 3, SamplingParams(temperature=1.0), mx.random.key(1))
    return draft.tokens.tolist(), np.array(draft.q) if draft.q is not None else None


@pytest.mark.parametrize("family,options", [
    ("qwen3", {"draft_model": "qwen3-draft"}),  # full KV, cut back
    ("qwen3", {"draft_model": "qwen3-draft", "kv_bits": 4, "kv_group_size": 32}),  # quantized KV
    ("gemma3", {"draft_model": "gemma3-draft"}),  # sliding window
    ("qwen3_5", {"drafter": "mtp"}),  # Gated DeltaNet, restored at the prompt's end
    ("qwen3", {"draft_model": "qwen3-dflash"}),  # a block drafter's context
    ("llama", {"draft_model": "llama-eagle3"}),  # an EAGLE-3 head's rows
    ("qwen3", {"drafter": "ngram"}),
])
def test_alternating_conversations_reuse_their_turns_exactly(tiny, family, options):
    """Two conversations, turn about: each returning turn runs only what its last turn did not (its prompt and
    answer held, with the drafter's own state: it drafts as it does when the conversation runs alone), and every
    answer is plain decoding's, drafts accepted and not."""
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), draft_len=3, **options)
    engine.cache_prompts(1 << 30)
    stats, contexts = alternate(engine, tiny[family], [0, 1] * 3, kv_bits=options.get("kv_bits"))
    assert [s.reused_prompt_tokens for s in stats[2:]] == [s.held for s in stats[2:]]  # returning turns
    single = mlx_spec.load(str(tiny[family]), draft_len=3, **options)
    alone, _ = alternate(single, tiny[family], [1] * 3, kv_bits=options.get("kv_bits"))
    assert [(s.drafted, s.accepted, s.reused_prompt_tokens) for s in stats[1::2]] == \
        [(s.drafted, s.accepted, s.reused_prompt_tokens) for s in alone]
    (tokens, q), (alone_tokens, alone_q) = next_draft(engine, contexts[1]), next_draft(single, contexts[1])
    assert tokens == alone_tokens and (q is None) == (alone_q is None)
    assert q is None or np.allclose(q, alone_q, atol=1e-6)  # the drafter holds what it held alone
    if options.get("drafter") != "ngram":
        assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)


def test_eight_conversations_stay_within_the_budget(tiny):
    """Eight conversations through a budget that holds about three: the least recently used go, the stored
    sequences never take more than the budget, and what is no longer stored is prefilled again, exactly."""
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), draft_len=3)
    one = engine.encode(OPENINGS[0])
    mlx_spec.generate(engine, one, max_tokens=24)
    engine.cache_prompts(1 << 30)
    mlx_spec.generate(engine, engine.encode(OPENINGS[1]), max_tokens=24)  # stores the first
    budget = int(engine.prompt_cache.nbytes * 3.5)
    engine.cache_prompts(budget)
    stats, _ = alternate(engine, tiny["qwen3"], [*range(8), *reversed(range(8))])
    assert engine.prompt_cache.nbytes <= budget and 2 <= len(engine.prompt_cache.stored) <= 4
    returning = [s.reused_prompt_tokens == s.held for s in stats[8:]]
    assert returning[:3] == [True] * 3 and returning[-3:] == [False] * 3  # the newest reused, the oldest dropped
