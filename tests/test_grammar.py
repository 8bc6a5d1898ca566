"""Constrained output under speculation (mlx_spec.core.grammar): greedy output equals plain constrained decoding, the
reference being mlx-lm's own `generate_step` with a logits processor that masks each step by an llguidance
matcher fed what was generated, for chains, trees, block drafters and a hybrid target; sampled output follows
the masked target distribution (chi-square against the exact probabilities of every allowed sequence)."""

import json

import llguidance
import llguidance.hf
import llguidance.numpy
import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, assert_one_line_error, numpy_distribution, plain_greedy, run_cli
from mlx_lm.generate import generate_step
from mlx_lm.utils import load
from scipy.stats import chisquare
from test_sampling import prompt_where_drafts_pass

import mlx_spec
from mlx_spec.decode.rounds import Job
from mlx_spec.seams.errors import SpecError
from mlx_spec.core.grammar import Grammar

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}, "tags": {"type": "array", "maxItems": 2,
                                                                              "items": {"enum": ["a", "bc"]}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


def from_schema(schema: dict) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults={"whitespace_flexible": False})


CONSTRAINTS = {  # name: (kind, value, llguidance's own compiler of it)
    "schema": ("json_schema", PERSON, from_schema),
    "regex": ("regex", r"(def|class) [a-z_]{1,12}\((self|x)?\):", llguidance.LLMatcher.grammar_from_regex),
    "lark": ("lark", 'start: item (", " item)*\nitem: /[0-9]{1,3}/ | "os" | "sys"',
             llguidance.LLMatcher.grammar_from_lark),
    "no hash": ("regex", "[^#]{0,200}", llguidance.LLMatcher.grammar_from_regex),  # what the model says anyway,
}  # but a comment: drafters that learnt the target's own choices are accepted under it


def own_drafts(results) -> tuple[int, int]:
    """(drafted, accepted) over `results`, the drafter's own drafts only (the grammar's forced ones apart)."""
    forced = [r.stats.forced or (0, 0) for r in results]
    return (sum(r.stats.drafted for r in results) - sum(f[0] for f in forced),
            sum(r.stats.accepted for r in results) - sum(f[1] for f in forced))


def reference(path, prompt: list[int], grammar: str, max_tokens: int) -> list[int]:
    """Plain constrained greedy decoding: mlx-lm's generate_step, each step masked by llguidance's matcher of
    `grammar` (what llguidance's LLMatcher.grammar_from_* makes)."""
    model, tokenizer = load(str(path))
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer._tokenizer,
                                                                eos_token=sorted(tokenizer.eos_token_ids)),
                                   grammar, log_level=0)
    consumed = []

    def mask(tokens, logits):
        for token in tokens[len(prompt) + len(consumed):].tolist():  # generate_step runs one step ahead
            assert matcher.consume_token(token)
            consumed.append(token)
        bits = llguidance.numpy.allocate_token_bitmask(1, logits.shape[-1])
        llguidance.numpy.fill_next_token_bitmask(matcher, bits)
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :logits.shape[-1]]
        return mx.where(mx.array(allowed.astype(bool)), logits, -mx.inf)

    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens, logits_processors=[mask]):
        out.append(int(token))
        if out[-1] in tokenizer.eos_token_ids:
            break
    return out


DRAFTERS = {  # target, load() options
    "draft model": ("qwen3", {"draft_model": "qwen3-draft"}),
    "n-gram": ("qwen3", {"drafter": "ngram"}),
    "draft-model tree": ("qwen3", {"draft_model": "qwen3-draft", "tree_width": 3}),
    "EAGLE-3 tree": ("qwen3", {"draft_model": "qwen3-eagle3", "tree_width": 3}),
    "DFlash block": ("qwen3", {"draft_model": "qwen3-dflash"}),
    "hybrid MTP": ("qwen3_5", {"drafter": "mtp"}),
    "drafting off": ("qwen3", {"drafter": "off"}),
}


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_constrained_output_equals_plain_constrained_decoding(tiny, drafter):
    family, options = DRAFTERS[drafter]
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), draft_len=4, **options)
    prompt = engine.encode(PROMPT)
    results = []
    for name, (kind, value, compile_grammar) in CONSTRAINTS.items():
        result = engine.generate(prompt, max_tokens=40, grammar=Grammar(engine.tokenizer, kind, value))
        assert result.tokens == reference(tiny[family], prompt, compile_grammar(value), 40)[:len(result.tokens)]
        assert result.stop_reason == "eos" or len(result.tokens) == 40
        results.append(result)
        if name == "schema" and result.stop_reason == "eos":
            person = json.loads(result.text)
            assert set(person) == {"name", "age", "tags"} and isinstance(person["age"], int)
    drafted, accepted = own_drafts(results)
    if drafter != "drafting off":
        assert accepted < drafted and (accepted > 0 or drafter == "hybrid MTP")  # the random MTP layer: rarely right
    assert engine.generate(prompt, max_tokens=8).tokens == plain_greedy(tiny[family], prompt, 8)  # unconstrained
    # again: the grammar ended with its generation


@pytest.mark.parametrize("drafter", ["draft model", "n-gram", "draft-model tree", "EAGLE-3 tree", "hybrid MTP",
                                     "drafting off"])
def test_constrained_rows_of_a_batch_equal_plain_constrained_decoding(tiny, drafter):
    """Rows of one batch, each under its own constraint and one under none, decode as plain constrained decoding
    does, each row masked by its own grammar along its own drafts."""
    family, options = DRAFTERS[drafter]
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), draft_len=4, **options)
    prompt = engine.encode(PROMPT)
    jobs = [Job(prompt, max_tokens=40, grammar=Grammar(engine.tokenizer, kind, value))
            for kind, value, _ in CONSTRAINTS.values()] + [Job(prompt[:24], max_tokens=40)]
    results = dict(engine.generate_many(jobs, len(jobs)))
    for i, (kind, value, compile_grammar) in enumerate(CONSTRAINTS.values()):
        tokens = results[i].tokens
        assert tokens == reference(tiny[family], prompt, compile_grammar(value), 40)[:len(tokens)], kind
        assert results[i].stop_reason == "eos" or len(tokens) == 40
    assert results[len(CONSTRAINTS)].tokens == plain_greedy(tiny[family], prompt[:24], 40)
    assert max(result.stats.batch_size for result in results.values()) == len(jobs)
    drafted, accepted = own_drafts(results.values())
    if drafter != "drafting off":
        assert accepted < drafted and (accepted > 0 or drafter == "hybrid MTP")


@pytest.mark.parametrize("batch", [1, 3], ids=["alone", "batch"])
@pytest.mark.parametrize("drafter", ["draft model", "DFlash block"])
def test_drafters_draft_within_the_grammar(tiny, drafter, batch):
    """Drafters that draft one token at a time from logits mask each step by the grammar (the engine's
    `constrain`; in a batch each row's own), so under a schema their drafts are not wasted: without the mask the
    random draft heads propose what the schema forbids, which is cut before verification, and hardly any draft
    is accepted."""
    family, options = DRAFTERS[drafter]
    engine = mlx_spec.load(str(tiny[family]), draft_len=4, draft_model=str(tiny[options["draft_model"]]))
    prompt = engine.encode(PROMPT)
    jobs = [Job(prompt[:len(prompt) - 3 * i], max_tokens=40, grammar=Grammar(engine.tokenizer, "json_schema", PERSON))
            for i in range(batch)]
    results = [result for _, result in engine.generate_many(jobs, batch)]
    assert max(result.stats.batch_size for result in results) == batch
    drafted, accepted = own_drafts(results)
    assert accepted > 0.15 * drafted > 0


@pytest.mark.parametrize("drafter, rank, batch", [("draft model", 0, 1), ("n-gram", 2, 1), ("draft model", 0, 8)])
def test_sampled_constrained_output_follows_the_masked_target(tiny, drafter, rank, batch):
    """Two tokens sampled at T = 1, top-k 5, under a grammar that bans a character of the target's rank-th likeliest
    first token (and of none of its other four likeliest). Rank 0, the token the draft model also likes best:
    drafts the grammar rejects come with a q that also covers allowed tokens, the case where the rejected draft's
    q must shape the residual. Rank 2 for n-gram, whose one-hot drafts then pass now and then. Every allowed
    sequence's count against its exact probability, the product of the target's masked, top-k, renormalised
    distributions. Alone, and as the rows of batches of eight."""
    family, options = DRAFTERS[drafter]
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), draft_len=2, **options)
    model, tokenizer = load(str(tiny[family]))
    prompt = prompt_where_drafts_pass(engine, engine.encode(PROMPT))
    top = [tokenizer.decode([int(t)]) for t in np.argsort(-np.array(model(mx.array([prompt]))[0, -1]))[:5]]
    banned = next(c for c in top[rank] if not any(c in t for t in top[:rank] + top[rank + 1:]))
    regex = f"[^\\x{{{ord(banned):x}}}]{{0,40}}"
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer._tokenizer, eos_token=0),
                                   llguidance.LLMatcher.grammar_from_regex(regex), log_level=0)

    def masked(prefix):
        matcher.reset()
        assert matcher.consume_tokens(prefix)
        bits = llguidance.numpy.allocate_token_bitmask(1, 512)
        llguidance.numpy.fill_next_token_bitmask(matcher, bits)
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:512].astype(bool)
        logits = np.array(model(mx.array([prompt + prefix]))[0, -1], dtype=np.float64)
        return numpy_distribution(np.where(allowed, logits, -np.inf), 1.0, top_k=5)

    exact, first = {}, masked([])
    for a in np.flatnonzero(first):
        second = masked([int(a)])
        exact.update({(int(a), int(b)): first[a] * second[b] for b in np.flatnonzero(second)})
    samples, observed, drafted, accepted = 400, dict.fromkeys(exact, 0), 0, 0
    jobs = [Job(prompt, mlx_spec.SamplingParams(temperature=1.0, top_k=5), max_tokens=2, seed=seed,
                grammar=Grammar(engine.tokenizer, "regex", regex)) for seed in range(samples)]
    for _, result in engine.generate_many(jobs, batch):
        observed[tuple(result.tokens)] += 1  # a KeyError: a sequence the masked target cannot produce
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    keys = [k for k in exact if exact[k] > 0]
    expected = np.array([exact[k] for k in keys]) / sum(exact[k] for k in keys) * samples
    assert chisquare([observed[k] for k in keys], expected).pvalue > 1e-3
    assert len(keys) > 4 and 0 < accepted < drafted


@pytest.mark.parametrize("kind, value, fragment", [
    ("json_schema", {"type": "nope"}, "the json schema cannot be used"),
    ("json_schema", "not a schema", "must be an object"),
    ("regex", "(", "the regex cannot be used"),
    ("lark", "start: x", "the lark cannot be used"),
    ("yaml", "a: 1", "unknown constraint 'yaml'"),
])
def test_bad_constraints_are_refused_in_one_line(tiny, kind, value, fragment):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    with pytest.raises(SpecError) as error:
        Grammar(engine.tokenizer, kind, value)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_generate_constrains_output_from_the_command_line(tiny, tmp_path):
    """`mlx-spec generate --json-schema FILE` prints what plain constrained decoding gives; bad files are refused
    in one line."""
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-draft"]), "--prompt",
                   PROMPT, "--raw", "--max-tokens", "40", "--json-schema", str(schema), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    plain = reference(tiny["qwen3"], engine.encode(PROMPT), from_schema(PERSON), 40)
    assert out["tokens"] == plain[:len(out["tokens"])]
    assert out["text"].startswith('{"name":"')
    (tmp_path / "bad.json").write_text("{not json")
    for flags, fragment in ((["--json-schema", str(tmp_path / "bad.json")], "is not JSON"),
                            (["--json-schema", str(tmp_path / "missing.json")], "cannot read it"),
                            (["--regex", "("], "the regex cannot be used")):
        assert_one_line_error(run_cli("generate", "--model", str(tiny["qwen3"]), "--prompt", "x", *flags), fragment)
