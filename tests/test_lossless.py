"""Greedy output equals plain decoding of the same model, for every drafter and every cache type."""

import numpy as np
import pytest
from helpers import PROMPT, CorruptedOracleDrafter, RandomDraftLengths, edited_copy, plain_greedy
from mlx_lm.models.cache import QuantizedKVCache
from test_demo import CODE as DEMO_CODE

import mlx_spec
from mlx_spec.decode.engine import Engine
from mlx_spec.loading import DEMO
from mlx_spec.runners.target import Target

FAMILIES = ["qwen3", "llama", "gemma3", "qwen3_5", "nemotron_h"]  # hybrids: Gated DeltaNet, Mamba 2
MAX_TOKENS = 160  # ten times the Gemma sliding window (16)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("drafter", ["off", "ngram", "draft-model"])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_equals_plain_decoding(tiny, family, drafter, penalty):
    """With drafts both accepted and rejected. For n-gram drafting the prompt holds the target's own continuation
    of it, then the prompt again: text it may write again, as code and chat often repeat."""
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[f"{family}-draft"]), drafter=drafter, draft_len=4)
    ids = engine.encode(PROMPT)
    if drafter == "ngram":
        ids = ids + plain_greedy(tiny[family], ids, 60, penalty) + ids
    result = mlx_spec.generate(engine, ids, max_tokens=MAX_TOKENS, repetition_penalty=penalty)
    assert result.tokens == plain_greedy(tiny[family], ids, MAX_TOKENS, penalty)
    assert result.stop_reason == "max_tokens"
    if drafter != "off":  # off: no drafts, the plain path itself against mlx-lm's
        assert 0 < result.stats.accepted < result.stats.drafted  # drafts passed, and rollback ran


@pytest.mark.parametrize("family,draft,options", [
    *[(family, f"{family}-draft", {}) for family in FAMILIES], ("qwen3", "qwen3-draft", {"tree_width": 2}),
    ("qwen3", "qwen3-eagle3", {"tree_width": 3}), ("llama", None, {"drafter": "lookahead"}),
    ("qwen3", None, {"mtp_path": "qwen3-mtp-head"}),
    ("demo", None, {"drafter": "mtp"}),  # the demo: a trained Qwen3.5 MTP layer
    ("gemma4", "gemma4-assistant-trained", {}),
    ("qwen3", "qwen3-dflash", {}), ("qwen3", "qwen3-dflash", {"tree_width": 3}),  # block drafters: dense (DDTree)
    ("qwen3_5", "qwen3_5-dspark", {})])  # and hybrid
def test_changing_draft_lengths_stay_exact(tiny, family, draft, options):
    """The adaptive policy changes the draft length (and a tree drafter's shape) every few rounds and turns
    drafting off and on (its choices follow the clock); seeded runs of every length, 0 included, and of chains
    and trees must all decode exactly as plain decoding."""
    options = {k: str(tiny[v]) if k == "mtp_path" else v for k, v in options.items()}
    path = DEMO / "demo" if family == "demo" else tiny[family]
    engine = mlx_spec.load(str(path), draft_model=draft and str(tiny[draft]), **options)
    # prompts after which each target's greedy text gives its drafter both hits and misses (the tiny Gemma 4 falls
    # into blank lines, which the distilled assistant always drafts right, after most others)
    ids = engine.encode({"demo": DEMO_CODE, "gemma4": PROMPT[:20]}.get(family, PROMPT))
    reference = plain_greedy(path, ids, MAX_TOKENS, 1.3)
    lengths, rounds = set(), []
    for seed in range(2):
        engine.next_policy = RandomDraftLengths(engine.max_draft_len, seed, widths=(1, engine.tree_width))
        events = list(mlx_spec.stream(engine, ids, max_tokens=MAX_TOKENS, repetition_penalty=1.3))
        assert events[-1].tokens == reference
        rounds += [e for e in events if isinstance(e, mlx_spec.Round) and e.draft_len]
        lengths |= {e.draft_len for e in events if isinstance(e, mlx_spec.Round)}
    assert lengths == set(range(engine.max_draft_len + 1))
    assert any(r.accepted for r in rounds) and any(r.accepted < r.draft_len for r in rounds)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_acceptance_length_rolls_back_exactly(tiny, family):
    """One wrong draft at a random position each round: every accepted count 0..k occurs, far past the window."""
    reference_engine = mlx_spec.load(str(tiny[family]), drafter="off")
    ids = reference_engine.encode(PROMPT)
    reference = plain_greedy(tiny[family], ids, MAX_TOKENS, 1.3)
    vocab = len(reference_engine.tokenizer.get_vocab())
    engine = Engine(Target(reference_engine.target.model), reference_engine.tokenizer,
                    CorruptedOracleDrafter(reference, len(ids), vocab), draft_len=5)
    events = list(mlx_spec.stream(engine, ids, max_tokens=MAX_TOKENS, repetition_penalty=1.3))
    assert events[-1].tokens == reference
    accepted_counts = {e.accepted for e in events if isinstance(e, mlx_spec.Round) and e.draft_len == 5}
    assert accepted_counts == {0, 1, 2, 3, 4, 5}


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("drafter", ["draft-model", "oracle"])
def test_quantized_kv_cache(tiny, family, drafter):
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[f"{family}-draft"]), kv_bits=8, kv_group_size=32,
                           draft_len=4)
    assert isinstance(engine.target.cache[0], QuantizedKVCache)
    assert isinstance(engine.drafter.runner.cache[0], QuantizedKVCache)
    ids = engine.encode(PROMPT)
    reference = plain_greedy(tiny[family], ids, 100, 1.3, kv_bits=8)
    if drafter == "oracle":
        engine.drafter = CorruptedOracleDrafter(reference, len(ids), len(engine.tokenizer.get_vocab()))
    result = mlx_spec.generate(engine, ids, max_tokens=100, repetition_penalty=1.3)
    assert result.tokens == reference
    assert 0 < result.stats.accepted < result.stats.drafted


def test_draft_equal_to_target_accepts_everything_greedy(tiny):
    engine = mlx_spec.load(str(tiny["gemma3"]), draft_model=str(tiny["gemma3"]), draft_len=4)
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=60, repetition_penalty=1.3)
    assert result.stats.acceptance_rate == 1.0  # no rejections: the draft is the target itself
    assert result.stats.mean_acceptance_length == pytest.approx(5.0, abs=0.2)
    assert result.tokens == plain_greedy(tiny["gemma3"], ids, 60, 1.3)
    assert sum(result.from_draft) == result.stats.accepted


def test_second_generation_reuses_nothing_stale(tiny):
    engine = mlx_spec.load(str(tiny["gemma3"]), draft_model=str(tiny["gemma3-draft"]), draft_len=4)
    ids = engine.encode(PROMPT)
    first = mlx_spec.generate(engine, ids, max_tokens=40).tokens
    mlx_spec.generate(engine, "class A:\n    pass\n", max_tokens=50)
    again = mlx_spec.generate(engine, ids, max_tokens=40)
    assert again.tokens == first == plain_greedy(tiny["gemma3"], ids, 40)
    assert 0 < again.stats.accepted < again.stats.drafted


def test_draft_with_a_padded_vocabulary(tiny, tmp_path):
    """Published drafts often pad their embedding to a round size; the extra rows must never be drafted."""
    import json

    rows = []  # the draft's own vocabulary

    def pad(weights):
        embed = weights["model.embed_tokens.weight"]
        rows.append(embed.shape[0])
        weights["model.embed_tokens.weight"] = np.concatenate([embed, embed[:64] * 3])  # rows the draft would like
        return weights
    padded = edited_copy(tiny["qwen3-draft"], tmp_path / "padded", pad)
    config = json.loads((padded / "config.json").read_text())
    config["vocab_size"] = rows[0] + 64
    (padded / "config.json").write_text(json.dumps(config))

    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(padded), draft_len=4)  # drafting every round
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=80, temperature=0.0)
    assert result.tokens == plain_greedy(tiny["qwen3"], ids, 80)
    assert 0 < result.stats.accepted < result.stats.drafted
    sampled = mlx_spec.generate(engine, ids, max_tokens=80, temperature=1.5)
    assert max(sampled.tokens) < rows[0] and sampled.stats.drafted > 0


@pytest.mark.parametrize("family,options", [
    ("qwen3", {"draft_model": "qwen3-draft"}), ("gemma3", {"draft_model": "gemma3-draft"}),
    ("qwen3_5-fitted-mtp", {"drafter": "mtp"}), ("qwen3", {"drafter": "ngram"}),
    ("gemma4", {"draft_model": "gemma4-assistant-trained"}),
])
def test_prompt_cache_is_reused_across_turns_exactly(tiny, family, options):
    """A follow-up prompt that extends the last sequence runs only its new tokens; one that diverges keeps the
    common prefix where the cache can be cut back (full KV) and starts over where it cannot. Either way the
    output is plain decoding's, with drafts both accepted and rejected."""
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), draft_len=3, **options)
    first = engine.encode(PROMPT)
    answer = mlx_spec.generate(engine, first, max_tokens=30)
    follow_up = first + answer.tokens + engine.encode("\nclass B:\n")
    extended = mlx_spec.generate(engine, follow_up, max_tokens=40)
    assert extended.stats.reused_prompt_tokens == len(first) + len(answer.tokens) - 1
    assert extended.tokens == plain_greedy(tiny[family], follow_up, 40)
    diverging = first[:20] + engine.encode("x = 1\n")
    result = mlx_spec.generate(engine, diverging, max_tokens=40)
    assert result.stats.reused_prompt_tokens == (20 if family == "qwen3" else 0)  # qwen3: full KV only
    assert result.tokens == plain_greedy(tiny[family], diverging, 40)
    accepted, drafted = (sum(getattr(r.stats, n) for r in (answer, extended, result)) for n in ("accepted", "drafted"))
    # the tiny Gemma 4 repeats its last token, which its distilled assistant always drafts right: no rejections
    assert 0 < accepted and (accepted < drafted or family == "gemma4")


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_steps_run_ahead_and_a_generation_that_ends_early_leaves_the_cache_exact(tiny, family):
    """Drafting off, each plain step is queued before the last one's token reaches the host. A generation that
    ends before max_tokens (a stop string; a consumer that stops reading) removes the step that ran for nothing:
    a follow-up then reuses exactly the positions before its last token and decodes as plain decoding does."""
    engine = mlx_spec.load(str(tiny[family]), drafter="off")  # no drafts: the plain path is under test
    first = engine.encode(PROMPT)[:30]
    reference = plain_greedy(tiny[family], first, 40)
    text = engine.tokenizer.decode(reference)

    def read_seven():
        events, answer = mlx_spec.stream(engine, first, max_tokens=40), []
        for event in events:
            answer += [event.id] if isinstance(event, mlx_spec.Token) else []
            if len(answer) == 7:
                events.close()  # the consumer stops reading: the generator ends here
        return answer

    ends = {"stop string": lambda: mlx_spec.generate(engine, first, max_tokens=40, stop=[text[20:23]]).tokens,
            "consumer gone": read_seven}
    for how, end in ends.items():
        answer = end()
        assert answer == reference[:len(answer)] and len(answer) < 40, how
        follow_up = first + answer + engine.encode("\nclass B:\n")
        result = mlx_spec.generate(engine, follow_up, max_tokens=20)
        assert result.stats.reused_prompt_tokens == len(first) + len(answer) - 1, how
        assert result.tokens == plain_greedy(tiny[family], follow_up, 20), how
