"""Processed distributions against an independent NumPy computation, penalties, and sampled sequences."""

import itertools

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, RandomDraftLengths, numpy_distribution, plain_sampled
from tiny import HEAD_TEXTS
from mlx_lm.utils import load
from scipy.stats import chisquare

import mlx_spec
from mlx_spec.seams.errors import SpecError
from mlx_spec.decode.batched import BatchedDecoder
from mlx_spec.decode.rounds import Job
from mlx_spec.core.sampling import SamplingParams, distributions
from mlx_spec.runners.target import Step


@pytest.mark.parametrize("temperature,top_k,top_p,min_p",
                         [(1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.1),
                          (0.9, 10, 0.9, 0.05)])
def test_processed_distribution_matches_numpy(temperature, top_k, top_p, min_p):
    logits = np.random.default_rng(1).standard_normal((3, 40)).astype(np.float32) * 2
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    ours = np.array(distributions(mx.array(logits), params, []))
    for row, logit_row in zip(ours, logits):
        np.testing.assert_allclose(row, numpy_distribution(logit_row, temperature, top_k, top_p, min_p), atol=1e-6)


def test_penalties_see_history_and_preceding_drafts():
    logits = mx.zeros((3, 10)) + 1.0
    params = SamplingParams(temperature=1.0, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    probs = np.array(distributions(logits, params, history=[4, 4], drafts=mx.array([7, 8])))
    # row 0 sees only the history; row 1 also the first draft; row 2 both drafts
    assert probs[0, 4] < probs[0, 7] == pytest.approx(probs[0, 8])
    assert probs[1, 7] < probs[1, 8] and probs[2, 8] == pytest.approx(probs[2, 7])
    # token 4: seen twice -> 1/2 (repetition), -0.5 (presence), -0.5 (frequency)
    expected = np.exp(1.0 / 2 - 0.5 - 0.5) / np.exp(1.0)
    assert probs[0, 4] / probs[0, 0] == pytest.approx(expected, rel=1e-5)


def test_penalty_window_forgets_old_tokens():
    logits = mx.ones((1, 10))
    params = SamplingParams(temperature=1.0, presence_penalty=1.0, penalty_window=2)
    probs = np.array(distributions(logits, params, history=[3, 1, 2]))[0]
    assert probs[3] == pytest.approx(probs[0]) and probs[1] < probs[0]


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2),
                                 dict(min_p=1.0), dict(repetition_penalty=0), dict(temperature=float("nan"))])
def test_nonsense_parameters_are_refused(bad):
    with pytest.raises(SpecError):
        SamplingParams(**bad)


def first_candidates(draft) -> list[int]:
    """The tokens a draft offers for its first position."""
    tokens = draft.tokens.tolist()
    if draft.parents is None:
        return tokens[:1]
    return [t for n, t in enumerate(tokens)
            if draft.parents[n] == -1 and (draft.candidates is None or draft.candidates[n])]


@pytest.mark.parametrize("family,drafter,draft", [("qwen3", "draft-model", "qwen3-noisy"), ("qwen3", "ngram", None),
                                                  ("qwen3", "suffix", None),
                                                  ("qwen3", "lookahead", None), ("deepseek_v3", "mtp", None),
                                                  ("mimo", "mtp", None),
                                                  ("qwen3", "mtp", "qwen3-mtp-head"),
                                                  ("qwen3_5-fitted-mtp", "mtp", None),
                                                  ("qwen3", "draft-model", "qwen3-eagle3"),
                                                  ("gemma4", "draft-model", "gemma4-assistant-trained"),
                                                  ("qwen3", "draft-model", "qwen3-dflash"),
                                                  ("qwen3_5", "draft-model", "qwen3_5-dspark"),
                                                  ("nemotron_h", "draft-model", "nemotron_h-draft")])
def test_sampled_sequences_follow_the_target(tiny, family, drafter, draft):
    """Three sampled tokens (T=1, top-k 2): the 8 possible sequences appear as often as the target alone
    would produce them, computed exactly from full-prefix forwards."""
    horizon, top_k, samples = 3, 2, 1200
    given = {"mtp_path" if drafter == "mtp" else "draft_model": draft and str(tiny[draft])}  # a head: mtp_path
    engine = mlx_spec.load(str(tiny[family]), drafter=drafter, draft_len=2, **given)
    prompt = engine.encode(PROMPT)
    if family.endswith("-fitted-mtp"):  # its layer drafts the continuation of a short text right, at times
        prompt = prompt_before_an_accepted_draft(engine, engine.encode(HEAD_TEXTS[1]))
    elif engine.drafter.name in ("mtp", "assistant", "eagle3", "dflash", "dspark"):  # fed by the target's states
        # each sample prefills its prompt again (the cache is not cut back under drafters that read hidden
        # states): short, but past the Gemma 4 window (16) and the 24 positions of context before every block
        # the test block drafters were trained on
        prompt = prompt[:{"assistant": 24, "dflash": 32, "dspark": 32}.get(engine.drafter.name, 8)]
    else:
        prompt = prompt_where_drafts_pass(engine, prompt)
    exact = exact_sequences(tiny[family], prompt, horizon, top_k)
    observed = dict.fromkeys(exact, 0)
    drafted = accepted = 0
    for seed in range(samples):
        result = mlx_spec.generate(engine, prompt, max_tokens=horizon, temperature=1.0, top_k=top_k, seed=seed)
        observed[tuple(result.tokens)] += 1  # a KeyError would mean a sequence the target cannot produce
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert 0 < accepted < drafted
    assert_follows(observed, exact, samples)


def prompt_where_drafts_pass(engine, prompt: list[int]) -> list[int]:
    """`prompt` and the least of its greedy continuation after which the drafter's first proposals hold the
    target's own greedy choice (so that sampled drafts are sometimes accepted)."""
    greedy = mlx_spec.generate(engine, prompt, max_tokens=60).tokens
    for cut in range(60):
        engine.drafter.begin(prompt + greedy[:cut], Step(None))
        if greedy[cut] in first_candidates(engine.drafter.propose(prompt + greedy[:cut], 1, SamplingParams(),
                                                                  mx.random.key(0))):
            break
    return prompt + greedy[:cut]


def prompt_before_an_accepted_draft(engine, prompt: list[int]) -> list[int]:
    """`prompt` and its greedy continuation up to the first round whose draft the target accepted (for drafters
    that read the target's hidden states, which cannot propose before its forward)."""
    continued = list(prompt)
    for event in mlx_spec.stream(engine, prompt, max_tokens=60):
        if isinstance(event, mlx_spec.Round) and event.accepted:
            return continued
        continued += [event.id] if isinstance(event, mlx_spec.Token) else []
    raise AssertionError("no draft was accepted")


def exact_sequences(path, prompt: list[int], horizon: int, top_k: int) -> dict[tuple[int, ...], float]:
    """The probability of every sequence of `horizon` tokens the target samples at T=1, top-k `top_k`,
    computed from full-prefix forwards of mlx-lm's own model."""
    model, _ = load(str(path))

    def next_distribution(prefix):
        logits = np.array(model(mx.array([prefix]))[0, -1], dtype=np.float64)
        return numpy_distribution(logits, 1.0, top_k)

    exact = {}
    for seq in itertools.product(range(top_k), repeat=horizon):  # walk the top-k tree
        prefix, prob = list(prompt), 1.0
        for rank in seq:
            dist = next_distribution(prefix)
            token = int(np.argsort(-dist)[rank])
            prob *= dist[token]
            prefix.append(token)
        exact[tuple(prefix[len(prompt):])] = prob
    return exact


def assert_follows(observed: dict, exact: dict, samples: int) -> None:
    """A chi-square test of sampled sequence counts against their exact probabilities."""
    keys = [k for k in exact if exact[k] > 0]
    f_exp = np.array([exact[k] for k in keys]) / sum(exact[k] for k in keys) * samples
    assert chisquare([observed[k] for k in keys], f_exp).pvalue > 1e-3


@pytest.mark.parametrize("options", [{"drafter": "ngram"}, {"drafter": "ngram", "tree_width": 3},
                                     {"drafter": "lookahead"}, {"drafter": "suffix"},
                                     {"draft_model": "qwen3-dflash", "tree_width": 2}])
def test_a_seed_draws_the_tokens_plain_sampling_draws_whatever_is_drafted(tiny, options):
    """With single-token drafts (chains, trees, DDTrees over blocks, not a block's sampled chain) a sampled run is plain sampling's, token for
    token, whatever the draft lengths and shapes (runs of random ones, drafting off for a while): each position's
    draw depends on the seed and the position only, so a seed repeats a run under the adaptive policy however busy
    the machine is. Drafts are both accepted and rejected."""
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny["qwen3"]), **options)
    prompt = engine.encode("for i in range(10):\n    print(i)\n" * 3)
    rounds = []
    for seed, (temperature, top_p) in enumerate([(0.1, 1.0), (0.2, 1.0), (0.7, 0.9), (1.0, 1.0)]):
        engine.next_policy = RandomDraftLengths(engine.max_draft_len, seed, widths=(engine.tree_width,))
        events = list(mlx_spec.stream(engine, prompt, max_tokens=60, temperature=temperature, top_p=top_p, seed=seed))
        assert events[-1].tokens == plain_sampled(tiny["qwen3"], prompt, 60, temperature, top_p, seed), seed
        rounds += [e for e in events if isinstance(e, mlx_spec.Round) and e.draft_len]
    assert any(r.accepted for r in rounds) and any(r.accepted < r.draft_len for r in rounds)


def test_every_row_of_a_sampled_batch_draws_what_plain_sampling_draws(tiny):
    """Rows joining and leaving a batch, at random draft lengths: each is plain sampling with its own seed."""
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram")
    texts = ["for i in range(10):\n    print(i)\n" * 3, PROMPT, "import os\nimport sys\n" * 2, "x = 1\ny = 2\n"]
    jobs = [Job(engine.encode(text), SamplingParams(temperature=0.2), max_tokens=40 - 5 * i, seed=10 + i)
            for i, text in enumerate(texts)]
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len)
    decoder.policy = RandomDraftLengths(engine.max_draft_len, 0)
    results = dict(decoder.run(jobs, 2))
    for i, job in enumerate(jobs):
        assert results[i].tokens == plain_sampled(tiny["qwen3"], job.prompt, job.max_tokens, 0.2, 1.0, job.seed), i
    assert 0 < sum(r.stats.accepted for r in results.values()) < sum(r.stats.drafted for r in results.values())
