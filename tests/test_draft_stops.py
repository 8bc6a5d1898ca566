"""A draft model stops its chain where it is unsure: after each draft the adaptive policy is asked, given the
draft model's own probability of each draft so far, whether one more is worth its cost (`DraftPolicy.go_on`).
The probabilities are the draft model's own (mlx-lm's forward of it over the context and its greedy chain), the
chains stop where the rule says, and the output stays the target's."""

import math

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, loaded, plain_greedy

import mlx_spec
from mlx_spec.decode.batched import BatchedDecoder
from mlx_spec.decode.rounds import Job
from mlx_spec.policy.sequence import AdaptiveDraftLength

LONGEST = 4


class Unsure(AdaptiveDraftLength):
    """Asks for LONGEST drafts a round and stops a chain once its drafts all pass with less than `bar` chance by
    the drafter's estimates; keeps what each round's rule was given."""

    def __init__(self, bar: float):
        super().__init__(LONGEST)
        self.bar, self.asked = bar, []

    def next_draft_len(self, remaining, outlook=None):
        self.draft_len = min(LONGEST, remaining - 1)
        self.asked.append((self.draft_len, []))
        return self.draft_len

    def go_on(self, confidence):
        self.asked[-1][1][:] = confidence
        return math.prod(confidence) >= self.bar


def own_probabilities(path, context: list[int], count: int) -> list[float]:
    """The draft model's probability of each of its first `count` greedy drafts after `context` (mlx-lm)."""
    model, _ = loaded(str(path))
    chain = plain_greedy(path, context, count) if count else []
    logits = model(mx.array([context + chain]))[0, len(context) - 1:].astype(mx.float32)
    chances = np.array(mx.softmax(logits, axis=-1))
    return [float(chances[i, token]) for i, token in enumerate(chain)]


@pytest.mark.parametrize("lone_row", [False, True], ids=["alone", "lone-batch-row"])
@pytest.mark.parametrize("family,bar", [("qwen3", 0.1), ("gemma3", 0.5)])  # each tiny draft model's own range
def test_a_draft_model_stops_its_chain_where_it_is_unsure(tiny, family, bar, lone_row):
    """Alone, and as a batch's lone row (a server's lone request: the batched draft model's chain)."""
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[f"{family}-draft"]), drafter="draft-model")
    engine.tokenizer.eos_token_ids = []
    ids = engine.encode(PROMPT)
    engine.next_policy = policy = Unsure(bar)
    if lone_row:
        decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len,
                                 engine.target.read_hidden, alone=policy)
        waiting = [(0, Job(ids, max_tokens=48))]
        events = [event for _, event in decoder.stream(lambda: waiting.pop() if waiting else None, 8)]
    else:
        events = list(mlx_spec.stream(engine, ids, max_tokens=48))
    assert events[-1].tokens == plain_greedy(tiny[family], ids, 48)
    context, stopped, whole = list(ids), 0, 0
    for event in events:
        if isinstance(event, mlx_spec.Round):
            k, given = policy.asked.pop(0)
            if k > 1:  # asked after each draft but the last
                np.testing.assert_allclose(given, own_probabilities(tiny[f"{family}-draft"], context, len(given)),
                                           atol=2e-5)
                assert all(math.prod(given[:j]) >= bar for j in range(1, len(given)))
                if event.draft_len < k:
                    assert event.draft_len == len(given) and math.prod(given) < bar
                    stopped += 1
                else:
                    assert len(given) == k - 1 and math.prod(given) >= bar
                    whole += 1
        elif isinstance(event, mlx_spec.Token):
            context.append(event.id)
    assert stopped and whole and not policy.asked
    assert 0 < events[-1].stats.accepted < events[-1].stats.drafted


def test_sampled_sequences_follow_the_target_when_chains_stop_on_their_sampled_drafts(tiny):
    """Three sampled tokens (T=1, top-k 2) from chains of two drafts stopped after a first draft the draft model
    sampled with less than even chance: where a chain stops depends on what was drafted, and the 8 possible
    sequences still appear as often as the target alone produces them (test_sampling's exact probabilities)."""
    from test_sampling import assert_follows, exact_sequences, prompt_where_drafts_pass

    horizon, top_k, samples = 3, 2, 1200
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-noisy"]), drafter="draft-model")
    prompt = prompt_where_drafts_pass(engine, engine.encode(PROMPT))
    engine.next_policy = policy = Unsure(0.5)
    exact = exact_sequences(tiny["qwen3"], prompt, horizon, top_k)
    observed, rounds = dict.fromkeys(exact, 0), []
    for seed in range(samples):
        events = list(mlx_spec.stream(engine, prompt, max_tokens=horizon, temperature=1.0, top_k=top_k, seed=seed))
        observed[tuple(events[-1].tokens)] += 1
        rounds += [event for event in events if isinstance(event, mlx_spec.Round) and event.draft_len]
    assert any(r.accepted for r in rounds) and any(r.accepted < r.draft_len for r in rounds)
    assert all(len(given) == 1 for k, given in policy.asked if k == 2)  # a chain of two: asked after its first
    firsts = [given[0] for k, given in policy.asked if k == 2]
    assert min(firsts) < 0.5 <= max(firsts)  # chains stopped and whole
    assert_follows(observed, exact, samples)


def test_a_chain_goes_on_while_one_more_sure_draft_beats_the_rounds_rate():
    """With rounds costing 1 + k / 2 plain steps, by hand: after drafts passing with chances c_1..c_j, one more is
    drafted while P_j (T(j + 1) - T(j))^-1 >= E_j / T(j) (P_j = c_1...c_j, E_j = 1 + P_1 + ... + P_j); the reasons
    count the chains stopped."""
    costs = {"fixed": 0.0, "slope": 0.5, "costs": {str(k): 1 + k / 2 for k in range(1, 5)}}
    policy = AdaptiveDraftLength(8, profile={"plain_time": 0.1, "band": 0, "bands": {},
                                             "shapes": {"1": {"acceptance": [0.9] * 8, **costs}}})
    assert policy.go_on([0.6])  # 0.6 x 1.5 = 0.9 >= 1.6 x 0.5 = 0.8
    assert policy.go_on([0.5])  # 0.75 >= 0.75
    assert not policy.go_on([0.4])  # 0.6 < 0.7
    assert policy.go_on([0.9, 0.8])  # 0.72 x 2 = 1.44 >= 2.62 x 0.5 = 1.31
    assert not policy.go_on([0.9, 0.5])  # 0.45 x 2 = 0.9 < 2.35 x 0.5 = 1.175
    assert "  2 chains stopped where the drafter was unsure of its next draft" in policy.explain()
    assert AdaptiveDraftLength(8).go_on([0.01])  # nothing timed yet: as long as asked
