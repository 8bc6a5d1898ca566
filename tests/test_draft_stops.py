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
from mlx_spec.policy.batch import BatchDraftLength
from mlx_spec.policy.sequence import AdaptiveDraftLength

LONGEST = 4


class Asking:
    """A policy that asks for LONGEST drafts a round, stops chains whose drafts pass with less than `bar` chance
    by the drafter's estimates, and keeps what each round's rule was given."""

    def __init__(self, bar: float):
        super().__init__(LONGEST)
        self.bar, self.asked = bar, []

    def next_draft_len(self, remaining, outlook=None):
        self.draft_len = min(LONGEST, remaining - 1)
        self.asked.append((self.draft_len, []))
        return self.draft_len


class Unsure(Asking, AdaptiveDraftLength):
    """One sequence's: its chain stops once its drafts all pass with less than `bar` chance."""

    def go_on(self, confidences):
        [confidence] = confidences
        self.asked[-1][1][:] = confidence
        return math.prod(confidence) >= self.bar


class UnsureRows(Asking, BatchDraftLength):
    """A batch's: the rows' chains stop once their drafts all pass with less than `bar` chance on average."""

    def go_on(self, confidences):
        self.asked[-1][1].append([list(c) for c in confidences])
        return sum(map(math.prod, confidences)) >= self.bar * len(confidences)


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


@pytest.mark.parametrize("pin", [None, 2], ids=["every-row-chosen", "a-row-pinned"])
def test_a_batchs_chains_stop_together_where_their_draft_model_is_unsure(tiny, pin):
    """Three rows, each its own text, drafted by one batched draft model: after each step the batch's policy is
    given every row's probabilities of its drafts so far, its rows' chains stop together or go on together, and
    each row's output is mlx-lm's plain decoding of it. A row with a pinned length drafts on (and the others
    with it: their drafts cost nothing past its own) until it has its drafts."""
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), drafter="draft-model")
    engine.tokenizer.eos_token_ids = []
    texts = [PROMPT, "Once upon a time, in a land far away,", "def fibonacci(n):\n    if n < 2:"]
    prompts = [engine.encode(text) for text in texts]
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, LONGEST,
                             engine.target.read_hidden, policy=(policy := UnsureRows(0.1)))
    waiting = [(i, Job(ids, max_tokens=40, draft_len=pin if i == 2 else None)) for i, ids in enumerate(prompts)]
    events = list(decoder.stream(lambda: waiting.pop(0) if waiting else None, 8))
    contexts = {i: list(ids) for i, ids in enumerate(prompts)}
    rounds = [[] for _ in prompts]  # per row: (its context before the round, its Round)
    for key, event in events:
        if isinstance(event, mlx_spec.Round):
            rounds[key].append((list(contexts[key]), event))
        elif isinstance(event, mlx_spec.Token):
            contexts[key].append(event.id)
        elif isinstance(event, mlx_spec.Done):
            assert event.tokens == plain_greedy(tiny["qwen3"], prompts[key], 40)
    stopped = whole = 0
    for r, (k, given) in enumerate(policy.asked):  # the rule's steps replayed: which rows draft, who is asked
        active = [i for i in range(len(prompts)) if r < len(rounds[i])]  # rows leave as they finish
        wanted = {i: min(pin if i == 2 and pin else k, 40 - (len(rounds[i][r][0]) - len(prompts[i])) - 1)
                  for i in active}
        j, stop, steps = 0, None, iter(given)
        while stop is None and any(j < wanted[i] - 1 for i in active):
            going = [i for i in active if j < wanted[i] - 1]
            if not (pin and 2 in going):  # a pinned row still drafting: every row drafts on, none asked
                confidences = next(steps)
                assert [len(c) for c in confidences] == [j + 1] * len(going)
                for i, confidence in zip(going, confidences):
                    np.testing.assert_allclose(confidence, own_probabilities(tiny["qwen3-draft"], rounds[i][r][0],
                                                                             j + 1), atol=2e-5)
                if sum(map(math.prod, confidences)) < 0.1 * len(going):
                    stop = j
            j += 1
        assert next(steps, None) is None
        assert [rounds[i][r][1].draft_len for i in active] == [
            wanted[i] if stop is None else min(wanted[i], stop + 1) for i in active]
        stopped, whole = stopped + (stop is not None), whole + (stop is None and bool(given))
    assert stopped and whole and len(policy.asked) == max(map(len, rounds))
    assert all(0 < sum(v.accepted for _, v in r) < sum(v.draft_len for _, v in r) for r in rounds)


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
    assert policy.go_on([[0.6]])  # 0.6 x 1.5 = 0.9 >= 1.6 x 0.5 = 0.8
    assert policy.go_on([[0.5]])  # 0.75 >= 0.75
    assert not policy.go_on([[0.4]])  # 0.6 < 0.7
    assert policy.go_on([[0.9, 0.8]])  # 0.72 x 2 = 1.44 >= 2.62 x 0.5 = 1.31
    assert not policy.go_on([[0.9, 0.5]])  # 0.45 x 2 = 0.9 < 2.35 x 0.5 = 1.175
    assert "  2 chains stopped where the drafter was unsure of its next draft" in policy.explain()
    assert AdaptiveDraftLength(8).go_on([[0.01]])  # nothing timed yet: as long as asked


def test_a_batchs_chains_go_on_while_one_more_sure_draft_each_beats_the_rounds_rate():
    """Three rows whose rounds cost 1 + tokens / 12 seconds, by hand: the rows drafting (chances c of their drafts
    so far) draft one more each while sum(P) (T(j + 1) - T(j))^-1 >= (sum(E) + others) / T(j), T(j) the time of a
    forward of 3 (1 + j) tokens; the reasons count the rounds stopped."""
    policy = BatchDraftLength(8)
    policy.resize(3)
    policy.seconds = {n: 1 + n / 12 for n in (3, 6, 9, 12)}
    assert policy.go_on([[0.5], [0.5], [0.3]])  # 1.3 x 1.5 = 1.95 >= 4.3 x 0.25 = 1.075
    assert not policy.go_on([[0.3], [0.2]])  # 0.5 x 1.5 = 0.75 < (2.5 + 1) x 0.25 = 0.875: the third row counts
    assert policy.go_on([[0.9, 0.8], [0.9, 0.8], [0.9, 0.8]])  # 2.16 x 1.75 = 3.78 >= 7.86 x 0.25 = 1.965
    assert not policy.go_on([[0.6, 0.3], [0.5, 0.4], [0.3, 0.2]])  # 0.44 x 1.75 = 0.77 < 4.84 x 0.25 = 1.21
    assert policy.explain()[1:] == ["  2 rounds' chains stopped where their drafters were unsure of their next drafts"]
    assert BatchDraftLength(8).go_on([[0.01], [0.01]])  # nothing timed yet: as long as asked
