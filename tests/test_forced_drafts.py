"""Drafts of the text a grammar forces (`Grammar.forced`, `RoundLoop.force`): after each chain, the tokens of
what the grammar allows there and nothing else (a JSON schema's keys and punctuation). The masked target takes
them unless it writes that text in other tokens, so they are verified as any one-hot draft: greedy output is
plain constrained decoding's, sampled output plain constrained sampling's own tokens for the seed, alone and in
batches, and the tiny targets' own tokenizations reject some of them. Drafting off drafts nothing."""

import llguidance
import llguidance.hf
import llguidance.numpy
import mlx.core as mx
import numpy as np
import pytest
from helpers import plain_greedy, plain_sampled
from test_grammar import DRAFTERS, PERSON, from_schema
from test_grammar import reference as constrained_reference
from tiny import PROMPT

import mlx_spec
from mlx_spec import SamplingParams
from mlx_spec.core.grammar import Grammar
from mlx_spec.decode.rounds import Job


def forced_totals(results) -> tuple[int, int]:
    """(forced drafts, of them accepted) over `results`."""
    pairs = [r.stats.forced for r in results if r.stats.forced]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def test_the_forced_text_is_the_schemas_keys_and_punctuation(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    grammar = Grammar(engine.tokenizer, "json_schema", PERSON)
    assert engine.tokenizer.decode(grammar.forced([])) == '{"name":"'
    ada = grammar.forced([]) + engine.tokenizer.encode('Ada",', add_special_tokens=False)
    assert engine.tokenizer.decode(grammar.forced(ada)) == '"age":'
    assert grammar.forced(ada, 1) == grammar.forced(ada)[:1] and grammar.forced(ada, 0) == []
    assert grammar.forced(engine.tokenizer.encode('{"name":"A', add_special_tokens=False)) == []  # free text
    assert engine.tokenizer.decode(grammar.forced([])) == '{"name":"'  # reading ahead left the grammar as it was
    assert grammar.valid_prefix(ada) == len(ada)


@pytest.mark.parametrize("batch", [1, 3], ids=["alone", "batch"])
@pytest.mark.parametrize("drafter", ["n-gram", "draft model", "hybrid MTP"])
def test_greedy_output_with_forced_drafts_is_plain_constrained_decoding(tiny, drafter, batch):
    family, options = DRAFTERS[drafter]
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), **options)
    prompt = engine.encode(PROMPT)
    prompts = [prompt[:len(prompt) - 3 * i] for i in range(batch)]
    jobs = [Job(p, max_tokens=40, grammar=Grammar(engine.tokenizer, "json_schema", PERSON)) for p in prompts]
    finished = dict(engine.generate_many(jobs, batch))
    results = [finished[i] for i in range(batch)]
    for p, result in zip(prompts, results):
        assert result.tokens == constrained_reference(tiny[family], p, from_schema(PERSON), 40)[:len(result.tokens)]
    forced, taken = forced_totals(results)
    assert 0 < taken < forced  # accepted, and rejected where the target tokenizes the forced text otherwise
    assert max(r.stats.batch_size for r in results) == batch


def test_sampled_output_with_forced_drafts_is_plain_constrained_sampling(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram")
    model_path, tokenizer = tiny["qwen3"], engine.tokenizer
    prompt = engine.encode(PROMPT)
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer._tokenizer,
                                                                eos_token=sorted(tokenizer.eos_token_ids)),
                                   from_schema(PERSON), log_level=0)

    def allowed(tokens: list[int]) -> np.ndarray:
        matcher.reset()
        assert matcher.consume_tokens(tokens)
        bits = llguidance.numpy.allocate_token_bitmask(1, 512)
        llguidance.numpy.fill_next_token_bitmask(matcher, bits)
        return np.unpackbits(bits.view(np.uint8), bitorder="little")[:512].astype(bool)

    results = []
    for seed in range(3):
        result = engine.generate(prompt, SamplingParams(temperature=0.8), max_tokens=30, seed=seed,
                                 grammar=Grammar(tokenizer, "json_schema", PERSON))
        assert result.tokens == plain_sampled(model_path, prompt, 30, 0.8, seed=seed, allowed=allowed)
        results.append(result)
    forced, taken = forced_totals(results)
    assert 0 < taken < forced


def test_drafting_off_drafts_nothing_forced(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    result = engine.generate(engine.encode(PROMPT), max_tokens=20,
                             grammar=Grammar(engine.tokenizer, "json_schema", PERSON))
    assert result.stats.forced is None and result.stats.drafted == 0


def test_a_batched_draft_model_keeps_only_its_own_fed_drafts(tiny):
    """A row that accepted tokens it did not draft (a prediction's, a grammar's) keeps none of the draft model's
    steps for them: its next chain is the draft model's greedy continuation of its context, as mlx-lm decodes it."""
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]))
    rows, key = engine.drafter.batched(None), mx.random.key(0)
    contexts = [engine.encode(PROMPT), engine.encode("def add(a, b):")]
    for context in contexts:
        rows.join(context)
    drafts = rows.propose(contexts, [0, 3], [SamplingParams()] * 2, [key, key])
    contexts = [contexts[0] + [11, 12, 13, 14, 15], contexts[1] + drafts[1].tokens[:1].tolist() + [16]]
    rows.accept(contexts, [4, 1])
    again = rows.propose(contexts, [3, 3], [SamplingParams()] * 2, [key, key])
    for context, draft in zip(contexts, again):
        assert draft.tokens.tolist() == plain_greedy(tiny["qwen3-draft"], context, 3)[:3]
