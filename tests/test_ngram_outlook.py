"""The n-gram drafter's own estimate of its drafts (`NgramDrafter.outlook`, `Draft.confidence`): learnt from what
the text became, by match length, and weighed by the adaptive policy, which then drafts long into a copy and not
where only a token matches; decoding stays exact."""

import random

import pytest
from helpers import PROMPT, ModelledCostPolicy, plain_greedy

import mlx_spec
from mlx_spec.drafters.ngram import MATCH_CLASSES, NgramDrafter, match_class
from mlx_spec.policy.sequence import AdaptiveDraftLength
from mlx_spec.core.sampling import SamplingParams


def text_with_copies(seed: int) -> tuple[list[int], list[int]]:
    """A prompt of 40 distinct tokens; then text that copies stretches of 12 of them (from a random point) between
    runs of 6 fresh tokens (each of which the prompt holds once, so a one-token match drafts it wrongly)."""
    rng = random.Random(seed)
    prompt = rng.sample(range(1000, 2000), 40)
    text = []
    for _ in range(20):
        start = rng.randrange(len(prompt) - 12)
        text += prompt[start:start + 12] + [rng.choice(prompt) for _ in range(6)]
    return prompt, text


def test_the_outlook_is_learnt_from_the_text_while_nothing_is_drafted():
    """Fed the text token by token as plain rounds (drafting off: `propose` never called), the drafter judges
    the chain it would have drafted at every position against what came: a draft three to seven tokens into a copy
    is right (each copy runs 12), one from a lone matching token rarely (a fresh token follows a random one)."""
    prompt, text = text_with_copies(0)
    drafter = NgramDrafter()
    drafter.begin(prompt, None)
    context, outlooks = list(prompt), []
    for token in text:
        context.append(token)
        drafter.accept(context, 0, None)
        outlooks.append((drafter._match(context, drafter._ends(context[-4:], 1)[0]), drafter.outlook))
    rates = [drafter.rate(match_class(match)) for match in MATCH_CLASSES]
    assert min(rates[2:5]) > 0.85 and rates[0] < 0.3, rates
    in_copies = [outlook[0] for match, outlook in outlooks[-100:] if 3 <= match < 8]
    lone = [outlook[0] for match, outlook in outlooks[-100:] if match == 1]
    assert in_copies and lone and min(in_copies) > 2 * max(lone)


def test_a_drafted_chain_carries_the_outlook_as_its_confidence():
    prompt, text = text_with_copies(1)
    drafter = NgramDrafter()
    drafter.begin(prompt, None)
    context = prompt + text[:100]
    drafter.accept(context, 0, None)
    draft = drafter.propose(context, 8, SamplingParams(), None)
    assert draft.confidence.tolist() == pytest.approx(drafter.outlook[:draft.tokens.shape[0]])
    assert draft.tokens.shape[0] == 8


def test_the_adaptive_policy_drafts_by_the_outlook_without_probes():
    """Costs modelled (a draft 0.1 of a plain step): with the drafter expecting its chain to pass, the policy drafts
    the longest length; expecting its first draft to fail, it drafts nothing and, unlike a policy without an
    outlook, spends no probes on finding out (the drafter keeps judging its chains against the text)."""
    max_len = 6
    with_outlook, without = ModelledCostPolicy(max_len), ModelledCostPolicy(max_len)
    for policy, outlook in [(with_outlook, [0.05] * max_len), (without, None)]:
        chosen = []
        for _ in range(200):
            chosen.append(k := policy.next_draft_len(1000, outlook))
            policy.observe(k, 0, None)
        late = chosen[50:]
        assert late.count(0) == len(late) if outlook else 0 < len(late) - late.count(0) < len(late) / 4, chosen
    assert "the drafter expects its next first draft to pass 5% of the time" in with_outlook.note
    chosen = []  # then a copy: drafts expected to pass, and passing; longer lengths timed one at a time
    for _ in range(8):
        chosen.append(k := with_outlook.next_draft_len(1000, [0.95] * max_len))
        with_outlook.observe(k, k, None)
    assert chosen[0] > 1 and chosen[-3:] == [max_len] * 3, chosen
    assert with_outlook.next_draft_len(1000, [0.95, 0.9, 0.05]) == 2


def test_a_cost_overestimated_in_a_profile_is_timed_again_where_the_outlook_expects_a_copy():
    """A profile that kept one slow round (a draft costing 2.67 plain steps, where it costs 0.1 now): where the
    drafter expects its chains to pass, the policy re-times drafting now and then (at most two rounds a probe
    interval) and drafts again; where it expects them to fail, it spends nothing on probes."""
    profile = {"plain_time": 1.0, "shapes": {"1": {"acceptance": [0.2] * 6, "fixed": 0.0, "slope": 1.67,
                                                   "costs": {"1": 2.67}}}}
    for outlook, drafts in [([0.9] * 6, True), ([0.05] * 6, False)]:
        policy, chosen = ModelledCostPolicy(6, profile=profile), []
        for _ in range(300):
            chosen.append(k := policy.next_draft_len(1000, outlook))
            policy.observe(k, k if outlook[0] > 0.5 else 0, None)
        late = chosen[150:]
        assert (late.count(0) < len(late) / 4) if drafts else late.count(0) == len(late), chosen


def test_nothing_is_asked_of_a_drafter_that_expects_nothing_to_draft():
    """Before any draft is timed (a first run), the policy measures a draft's cost only where the drafter has a
    chain to draft: asking one with nothing to draft costs a round that does not run one ahead as plain steps do,
    and times nothing."""
    policy, chosen = AdaptiveDraftLength(4), []
    for i in range(12):
        chosen.append(k := policy.next_draft_len(1000, [] if i < 8 else [0.9] * 4))
        policy.observe(k, k, 1.0 + 0.1 * k)
        if i == 7:
            assert policy.note == "drafting off: the drafter has nothing to draft here"
    assert chosen[:8] == [0] * 8 and chosen[8] == 1, chosen


def test_decoding_under_the_outlook_stays_exact(tiny):
    """The n-gram drafter under the adaptive policy (costs modelled, so that its choices follow the outlook, not
    the clock) on a prompt that holds the target's own continuation, then the prompt again: every token equals
    mlx-lm's plain greedy decoding, drafts both accepted and rejected, and the policy says what the drafter
    expected."""
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram", draft_len=None)
    ids = engine.encode(PROMPT)
    ids = ids + plain_greedy(tiny["qwen3"], ids, 60) + ids
    engine.next_policy = ModelledCostPolicy(engine.max_draft_len)
    done = mlx_spec.generate(engine, ids, max_tokens=120)
    assert done.tokens == plain_greedy(tiny["qwen3"], ids, 120)
    assert 0 < done.stats.accepted < done.stats.drafted
    assert any(line.startswith("  the drafter expects of its next chain") for line in done.stats.policy_reasons)
