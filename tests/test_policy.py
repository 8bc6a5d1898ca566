"""The draft-length policy: off when drafts are useless, back on when they are good, pinned when asked."""

import random
import statistics

import mlx.core as mx
import pytest
from helpers import PROMPT, CorruptedOracleDrafter, ModelledCostPolicy, plain_greedy

import mlx_spec
from mlx_spec.drafters.protocol import Draft
from mlx_spec.decode.engine import Engine
from mlx_spec.decode.batched import BatchedDecoder
from mlx_spec.decode.rounds import Job
from mlx_spec.policy.batch import BatchDraftLength
from mlx_spec.policy.sequence import AdaptiveDraftLength, FixedDraftLength, depth_band
from mlx_spec.runners.target import Target


def run_rounds(policy, rounds, acceptance_of, plain=1.0, per_draft=0.08):
    """Drive the policy with a synthetic round: drafts pass while acceptance_of(round) says so."""
    chosen = []
    for r in range(rounds):
        k = policy.next_draft_len(remaining=1000)
        accepted = min(k, acceptance_of(r))
        policy.observe(k, accepted, plain + per_draft * k)
        chosen.append(k)
    return chosen


def test_turns_off_for_useless_drafts_and_back_on_for_good_ones():
    policy = AdaptiveDraftLength(max_len=5, probe_every=8)
    chosen = run_rounds(policy, 60, lambda r: 0)
    assert chosen[-20:].count(0) >= 16  # off, but for the occasional probe (two rounds)
    assert policy.note.startswith("drafting off: recent first-draft acceptance") and "break-even 8%" in policy.note
    chosen = run_rounds(policy, 60, lambda r: 5)  # the text became predictable
    assert min(chosen[-20:]) >= 4 and policy.note.startswith("draft length")


def test_a_sequence_is_readied_to_draft_until_the_costs_measured_say_no_draft_pays():
    """`drafts_at`: whether the next sequence's drafter does its work on the prompt. Yes before anything is
    measured, no once useless drafts turned drafting off, yes again once the text became predictable."""
    policy = AdaptiveDraftLength(max_len=5, probe_every=8)
    assert policy.drafts_at()
    run_rounds(policy, 60, lambda r: 0)
    assert not policy.drafts_at()
    run_rounds(policy, 60, lambda r: 5)
    assert policy.drafts_at()


def test_noisy_acceptance_keeps_drafting():
    """42% first-draft acceptance (23%, 19% after it), drafts at 0.2 of a plain step: one draft a round pays
    (1.42 / 1.2), so rejections in a row, common at this rate, must not keep drafting off."""
    drafting = []
    for seed in range(5):  # one run's share swings with a few long streaks: five seeded runs (0.8 drafted 48%)
        draws = random.Random(seed)

        def accepted(_):
            count = 0
            for chance in (0.42, 0.23, 0.19):
                if draws.random() >= chance:
                    break
                count += 1
            return count

        chosen = run_rounds(AdaptiveDraftLength(max_len=3), 600, accepted, per_draft=0.2)[100:]
        drafting.append(sum(k > 0 for k in chosen) / len(chosen))
    assert statistics.mean(drafting) >= 0.6, drafting


def test_draft_length_follows_acceptance_and_cost():
    cheap, dear = AdaptiveDraftLength(max_len=8), AdaptiveDraftLength(max_len=8)
    half = run_rounds(cheap, 80, lambda r: [0, 1, 2, 3][r % 4], per_draft=0.02)
    costly = run_rounds(dear, 80, lambda r: [0, 1, 2, 3][r % 4], per_draft=0.3)
    assert 1 <= statistics.median(costly[-20:]) < statistics.median(half[-20:])  # dearer drafts: shorter


@pytest.mark.parametrize("fixed,slope", [(0.5, 0.05), (0.0, 0.3)])
def test_a_rounds_fixed_cost_is_learnt_apart_from_each_drafts(fixed, slope):
    """A block draft costs one forward whatever its length (measured on Qwen2.5-Coder-0.5B: 0.45 + 0.02 k
    plain steps, scripts/block_cost.py); a draft model's grows with every draft. With 90% of drafts passing the
    policy settles where expected tokens / (1 + fixed + slope k) is highest, not where a cost per draft fitted at
    one length would put it (for the block drafter, at most 3 drafts)."""
    policy = AdaptiveDraftLength(max_len=15)
    rates = {k: sum(0.9 ** i for i in range(k + 1)) / (1 + fixed + slope * k) for k in range(1, 16)}
    draws = random.Random(0)
    chosen = []
    for _ in range(200):
        k = policy.next_draft_len(remaining=1000)
        accepted = next((i for i in range(k) if draws.random() >= 0.9), k)
        policy.observe(k, accepted, 1.0 + (fixed + slope * k if k else 0.0))
        chosen.append(k)
    best = max(rates, key=rates.get)
    late = statistics.median(chosen[-50:])
    assert abs(policy.shapes[1].fixed - fixed) < 0.02 and abs(policy.shapes[1].slope - slope) < 0.01
    assert rates[round(late)] >= 0.95 * rates[best], (late, best)


def test_chooses_trees_where_they_pay():
    def run(policy, accepted_by_width, cost_by_width, rounds=80):
        chosen = []
        for _ in range(rounds):
            k = policy.next_draft_len(remaining=1000)
            policy.observe(k, min(k, accepted_by_width[policy.width]), 1.0 + cost_by_width[policy.width] * k)
            chosen.append((k, policy.width if k else 0))
        return chosen[-20:]

    # trees get 3 drafts accepted a round, chains 1; a tree's position costs twice a chain's: trees pay
    late = run(AdaptiveDraftLength(max_len=4, widths=(1, 3)), {1: 1, 3: 3}, {1: 0.05, 3: 0.1})
    assert {w for k, w in late if k} == {3}
    policy = AdaptiveDraftLength(max_len=4, widths=(1, 3))
    late = run(policy, {1: 2, 3: 3}, {1: 0.05, 3: 1.0})  # a tree position costs a whole plain step: chains
    assert {w for k, w in late if k} == {1} and statistics.mode(k for k, w in late) == 2  # a longer one now and then
    assert policy.note.startswith("draft length") and "trees" not in policy.note


class SwitchingDrafter(CorruptedOracleDrafter):
    """Wrong at every position for the first `bad_tokens` generated tokens, then the exact reference."""

    def __init__(self, reference, prompt_len, vocab, bad_tokens):
        super().__init__(reference, prompt_len, vocab)
        self.bad_tokens = bad_tokens

    def propose(self, context, k, params, key):
        done = len(context) - self.prompt_len
        tokens = list(self.reference[done:done + k])
        if done < self.bad_tokens:
            tokens = [(t + 1) % self.vocab for t in tokens]
        return Draft(mx.array(tokens, dtype=mx.int32)) if tokens else Draft.empty()


def test_engine_turns_drafting_off_and_on_again(tiny):
    plain = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    ids = plain.encode(PROMPT)
    reference = plain_greedy(tiny["qwen3"], ids, 300)
    drafter = SwitchingDrafter(reference, len(ids), len(plain.tokenizer.get_vocab()), bad_tokens=80)
    engine = Engine(Target(plain.target.model), plain.tokenizer, drafter, draft_len=None, max_draft_len=4)
    engine.next_policy = ModelledCostPolicy(max_len=4, probe_every=8)
    rounds = [e for e in mlx_spec.stream(engine, ids, max_tokens=300) if isinstance(e, mlx_spec.Round)]
    assert [e.draft_len for e in rounds[50:80]].count(0) >= 20  # useless drafts: mostly plain decoding
    late = rounds[-20:]
    assert sum(e.accepted for e in late) >= 2 * len(late)  # good drafts again: several tokens per round
    assert [e.draft_len for e in rounds[-20:]].count(0) <= 2


def test_pinned_draft_length_is_honoured(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), draft_len=3)
    rounds = [e for e in mlx_spec.stream(engine, PROMPT, max_tokens=60) if isinstance(e, mlx_spec.Round)]
    assert {e.draft_len for e in rounds[:-3]} == {3}
    assert engine.policy.note == "draft length 3 (pinned)"


def test_drafts_dearer_than_a_plain_step_are_named_as_such():
    policy = AdaptiveDraftLength(max_len=3, probe_every=8)
    run_rounds(policy, 43, lambda r: 3, per_draft=1.5)  # always right, but each draft costs 1.5 plain steps
    assert policy.draft_len == 0  # round 43: not a probe
    assert policy.note == ("drafting off: one draft costs 1.50 plain steps here, more than even an always-right "
                           "draft gains")


def test_drafting_off_still_probes_when_drafts_are_dear():
    """Drafts dearer than a plain step: off, but probing 8x more rarely than every 16 rounds, not never (every
    128th round was also a plain steps' re-measure, which took precedence); each probe two rounds."""
    chosen = run_rounds(AdaptiveDraftLength(max_len=3), 400, lambda r: 3, per_draft=1.5)
    assert 4 <= sum(k > 0 for k in chosen[20:]) <= 8


def drive_batch_policy(cost, rows: int, acceptance: float, rounds: int = 200, policy=None,
                       drafting: float = 1.0) -> list[int]:
    """BatchDraftLength (`policy`, or a new one) over `rounds` rounds of `rows` rows whose drafts pass with
    probability `acceptance` (seeded), a round of n forward tokens taking cost(n) seconds; returns the draft
    lengths it chose. A row drafts with probability `drafting` (an n-gram drafter may find nothing)."""
    import random

    rng, policy, chosen = random.Random(0), policy or BatchDraftLength(4), []
    policy.resize(rows)
    for _ in range(rounds):
        k = policy.next_draft_len(1000)
        chosen.append(k)
        drafts = [k if drafting == 1.0 or rng.random() < drafting else 0 for _ in range(rows)]
        accepted = [next((j for j in range(d) if rng.random() > acceptance), d) for d in drafts]
        policy.observe(k, 0, cost(rows * (1 + k)), rows=list(zip(drafts, accepted)))
    return chosen


def test_batches_draft_while_forwards_are_bandwidth_bound_and_stop_when_compute_bound():
    flat = drive_batch_policy(lambda tokens: 1.0, rows=4, acceptance=0.8)  # a GPU with a small batch
    assert statistics.mean(flat[20:]) > 3
    proportional = drive_batch_policy(lambda tokens: 0.01 * tokens, rows=8, acceptance=0.8)  # compute-bound
    assert statistics.mean(k > 0 for k in proportional[20:]) < 0.15  # off but for the probes
    knee = drive_batch_policy(lambda tokens: max(1.0, 0.05 * tokens), rows=4, acceptance=0.8)  # flat to 20 tokens
    assert statistics.mean(knee[20:]) == pytest.approx(4, abs=0.5)  # 4 x (1 + 4) = 20: still flat
    # 16 rows: at the knee already; one draft costs 0.6 of a plain step and brings 0.8 of a token, two cost 1.4
    assert statistics.mean(drive_batch_policy(lambda tokens: max(1.0, 0.05 * tokens), rows=16,
                                              acceptance=0.8)[20:]) == pytest.approx(1, abs=0.2)


def drive_tree_batch_policy(cost, rows: int, chain: float, tree: float, width: int = 3,
                            rounds: int = 200) -> list[tuple[int, int]]:
    """BatchDraftLength choosing chains or trees `width` wide over `rounds` rounds of `rows` rows, a chain's drafts
    passing with probability `chain` and a tree's levels with `tree` (seeded), a tree of depth k holding k x width
    nodes, a round of n forward tokens taking cost(n) seconds; returns the (draft length, width) it chose."""
    import random

    rng, policy, chosen = random.Random(0), BatchDraftLength(4, widths=(1, width)), []
    policy.resize(rows)
    for _ in range(rounds):
        k = policy.next_draft_len(1000)
        w, passing = (policy.width, tree if policy.width > 1 else chain) if k else (1, chain)
        chosen.append((k, w))
        accepted = [next((j for j in range(k) if rng.random() > passing), k) for _ in range(rows)]
        policy.observe(k * w, 0, cost(rows * (1 + k * w)), rows=[(k, a) for a in accepted])
    return chosen


def test_a_batch_drafts_trees_where_forwards_are_bandwidth_bound_and_chains_where_not():
    """4 rows, a drafter whose trees 3 wide pass a level 90% of the time where its chains pass 60%: with flat costs
    (a GPU with a small batch) four levels of trees, 4.1 tokens a row a round against 2.3. With costs flat to 20
    tokens and then in proportion (a CPU), trees 85% and chains 70%: four chained drafts stay within the flat part
    (2.8 tokens a row a plain step's time) where two levels of a tree run 28 tokens (1.8), so chains, once trees
    were tried."""
    flat = drive_tree_batch_policy(lambda tokens: 1.0, rows=4, chain=0.6, tree=0.9)
    assert statistics.mean(choice == (4, 3) for choice in flat[40:]) > 0.9
    knee = drive_tree_batch_policy(lambda tokens: max(1.0, 0.05 * tokens), rows=4, chain=0.7, tree=0.85)
    assert any(w == 3 for _, w in knee[:40]) and statistics.mean(w == 1 for k, w in knee[40:] if k) > 0.9


def test_a_batch_that_tried_trees_no_better_than_chains_goes_back_to_chains():
    """Trees that pass no more often than chains (the untried ones weighed as if each of their 3 candidates passed
    as a chain's draft does) are tried, then left for chains: the same tokens for a third of the forward."""
    chosen = drive_tree_batch_policy(lambda tokens: 1.0 + 0.01 * tokens, rows=4, chain=0.7, tree=0.7)
    assert any(w == 3 for _, w in chosen[:40])
    assert statistics.mean(w == 1 for k, w in chosen[60:] if k) > 0.9


@pytest.mark.parametrize("curve", [{4: 1.0, 8: 1.06, 12: 1.3, 16: 1.16, 20: 1.47},  # the 0.5B's, scaled
                                   {4: 1.0, 8: 1.06, 12: 1.71, 16: 0.9, 20: 1.5}])  # the 1.5B's: 4 x 4 beats 4 x 1
def test_a_batch_finds_a_draft_length_past_a_cost_curve_that_is_not_monotone(curve):
    """4 rows, the curves OpenBLAS gives the Qwen2.5-Coder 0.5B and 1.5B on this CPU: 4 x 4 tokens cost less than
    4 x 3. With 60% acceptance, three drafts make the most tokens per second. Each length past the counts measured
    is tried at the optimist's guess, the least growth measured drawn from the largest count measured or the one
    before, whichever gives less (drawn from 4 x 3 alone, 4 x 4 would look dearer than one draft on the 1.5B's, and
    never be tried), so the policy settles on three."""
    chosen = drive_batch_policy(lambda tokens: curve[tokens], rows=4, acceptance=0.6, rounds=150,
                                policy=BatchDraftLength(4))
    assert statistics.mean(k == 3 for k in chosen[40:]) > 0.8


def test_a_batch_near_its_end_does_not_try_lengths_it_has_not_measured():
    """8 rows, 90% acceptance, the costs the 1.5B with its 0.5B draft model showed at 8 rows (two drafts already
    cost 2.2 plain steps; every draft adds a draft-model step). With 32 tokens a row the policy tries two drafts
    and keeps one: three and four, worth trying while enough rounds remain to repay their measuring (256 tokens),
    were not then (traced, they took 4 of its 13 rounds)."""
    import random

    def run(tokens: int) -> list[int]:
        rng, policy, chosen, left = random.Random(0), BatchDraftLength(4), [], tokens
        policy.resize(8)
        while left > 0:
            chosen.append(k := policy.next_draft_len(left))
            accepted = [next((j for j in range(k) if rng.random() > 0.9), k) for _ in range(8)]
            policy.observe(k, 0, {8: 1.0, 16: 1.17, 24: 2.2, 32: 2.8, 40: 3.4}[8 * (1 + k)],
                           rows=[(k, a) for a in accepted])
            left -= 1 + min(accepted)
        return chosen
    short, long = run(32), run(256)
    assert max(short) == 2 and statistics.mode(short) == 1
    assert max(long) == 4 and statistics.mode(long) == 1


@pytest.mark.parametrize("acceptance", [0.6, 0.7])
def test_rows_that_draft_nothing_and_unlucky_rounds_do_not_hold_a_batch_at_one_draft(acceptance):
    """The same curve; half the rows draft nothing (no n-gram suffix found). That half counts as fewer rows
    drafting, not as rejections (else, at 60% acceptance, the policy stays at one draft), and a position no round
    judged of late (STALE) is tried again (else, at 70%, a few unlucky early rounds hold it at one for good): it
    settles on three drafts."""
    curve = {4: 1.0, 8: 1.06, 12: 1.3, 16: 1.16, 20: 1.47}
    chosen = drive_batch_policy(lambda tokens: curve[tokens], rows=4, acceptance=acceptance, rounds=150,
                                drafting=0.5)
    assert statistics.mean(k == 3 for k in chosen[40:]) > 0.8


def test_a_batch_that_grows_past_the_counts_measured_near_its_end_decodes_plainly():
    """Measured at 2 rows (up to 2 x 5 tokens), the batch grows to 16 (rows joined) with 4 tokens left: a plain
    step of 16 rows is past the counts measured and no length is worth trying so near the end: it decodes plainly."""
    policy = BatchDraftLength(4)
    drive_batch_policy(lambda tokens: 1.0, rows=2, acceptance=0.8, rounds=20, policy=policy)
    assert max(policy.seconds) == 10
    policy.resize(16)
    assert policy.next_draft_len(4) == 0


def test_a_batch_whose_rows_leave_does_not_take_fewer_tokens_for_free():
    """Compute-bound, 8 rows: off. When half the rows leave, a round of 4 rows x 2 tokens costs what the plain
    8-row rounds cost, and 4 plain rows, never measured, are not assumed to cost as much: drafting stays off."""
    policy, cost = BatchDraftLength(4), lambda tokens: 0.01 * tokens
    drive_batch_policy(cost, rows=8, acceptance=0.7, rounds=100, policy=policy)
    assert statistics.mean(k > 0 for k in drive_batch_policy(cost, rows=4, acceptance=0.7, policy=policy)) < 0.15


def test_the_row_left_when_others_leave_drafts_at_once_where_forwards_are_bandwidth_bound():
    """Bandwidth-bound (a round costs 1 + 0.01 per token), 4 rows draft. When three leave, the last row, its
    forwards never measured, drafts from its first round: below the counts measured a round's time falls along the
    least growth measured (in proportion, 1 x 1 would look four times cheaper than 4 x 1, and every draft dear)."""
    policy, cost = BatchDraftLength(4), lambda tokens: 1.0 + 0.01 * tokens
    drive_batch_policy(cost, rows=4, acceptance=0.7, rounds=100, policy=policy)
    assert drive_batch_policy(cost, rows=1, acceptance=0.7, rounds=3, policy=policy) == [4, 4, 4]


def test_rows_join_readied_to_draft_until_the_costs_measured_say_drafting_does_not_pay_at_their_batch_size():
    """A joining row's drafter does its prompt work (`drafts_at`) while the policy knows nothing, and where
    drafting pays; not at a batch size whose measured costs (compute-bound, 8 rows) turned drafting off."""
    policy = BatchDraftLength(4)
    assert policy.drafts_at(8)
    drive_batch_policy(lambda tokens: 1.0, rows=2, acceptance=0.8, rounds=50, policy=policy)  # bandwidth-bound
    assert policy.drafts_at(2)
    policy = BatchDraftLength(4)
    drive_batch_policy(lambda tokens: 0.01 * tokens, rows=8, acceptance=0.7, rounds=50, policy=policy)
    assert not policy.drafts_at(8) and not policy.drafts_at(4)


def test_a_machine_that_slows_down_as_a_whole_does_not_turn_drafting_on():
    """A draft costs a plain step here, so even always-right drafts gain nothing. Once both are measured, other
    work on the cores makes every round twice as slow. The cost of a draft is learnt in plain steps, so drafting
    stays off but for the probes, two rounds each (seconds learnt apart made it look half as dear, and 66%
    acceptance pay)."""
    import random

    policy, rng, chosen = AdaptiveDraftLength(4), random.Random(0), []
    for r in range(400):
        k = policy.next_draft_len(1000)
        accepted = next((j for j in range(k) if rng.random() > 0.66), k)
        policy.observe(k, accepted, (1.0 if r < 10 else 2.0) * (1 + k))
        chosen.append(k)
    assert chosen[:10].count(0) < 10 and sum(k > 0 for k in chosen[10:]) <= 8


def test_a_draft_cost_once_overestimated_is_measured_again_by_the_probes():
    """Drafts cost 0.05 of a plain step and pass 80% of the time, but the first round that could measure a draft's
    cost was slow (3 plain steps: other work on the cores), so drafting turns off. A probe resumes drafting, which
    says nothing of the cost, so its second round measures it again: drafting comes back on. (With one-round
    probes the slope stayed at 2.0 and drafting off for good.)"""
    import random

    policy, rng, chosen, slow = AdaptiveDraftLength(4), random.Random(0), [], None
    for r in range(600):
        k = policy.next_draft_len(1000)
        accepted = next((j for j in range(k) if rng.random() > 0.8), k)
        if slow is None and k and policy.shapes[1].slope is None and chosen and chosen[-1]:
            slow = r  # the first draft round after a draft round: the one whose time sets the slope
        policy.observe(k, accepted, 3.0 if r == slow else 1.0 + 0.05 * k)
        chosen.append(k)
    assert slow is not None and policy.shapes[1].slope < 0.1
    assert statistics.mean(k > 0 for k in chosen[-100:]) > 0.9


def test_a_round_whose_time_is_not_known_teaches_acceptance_but_not_cost():
    """The engine gives no time for a generation's first rounds (they straddle the prefill): the policy's
    acceptance moves, its plain step and a draft's cost do not."""
    policy = AdaptiveDraftLength(4)
    run_rounds(policy, 40, lambda r: 4)
    plain, slope, first = policy.plain_time, policy.shapes[1].slope, policy.shapes[1].acceptance[0]
    for k in (0, 2, 2):
        policy.observe(k, 0, None)
    assert (policy.plain_time, policy.shapes[1].slope) == (plain, slope) and policy.shapes[1].acceptance[0] < first


class TimesSeen(FixedDraftLength):
    """Plain decoding that keeps the seconds each round's `observe` gives it."""

    def __init__(self):
        super().__init__(0)
        self.seconds = []

    def observe(self, draft_len, accepted, seconds, rows=None, asked=None):
        self.seconds.append(seconds)


def test_a_round_that_asked_for_drafts_and_found_none_is_not_a_plain_step():
    """A drafter without an outlook (suffix, lookahead) that finds nothing to draft runs a round of no drafts,
    dearer than a plain step (which runs one ahead). From a profile (plain steps of 1 s there), three such rounds
    (3 s each) neither end its calibration nor set this run's plain step: the drafting rounds after them do, on a
    machine twice as fast (before: the first such round set it, 3 s)."""
    profile = {"plain_time": 1.0, "shapes": {"1": {"acceptance": [0.8] * 4, "fixed": 0.0, "slope": 0.2,
                                                   "costs": {"2": 1.4}}}}
    policy = AdaptiveDraftLength(4, profile=profile)
    for found in [0, 0, 0, None, None, None, None]:  # the first drafting round compiles: untimed
        k = policy.next_draft_len(1000)
        drafted = k if found is None else found
        assert k > 0
        policy.observe(drafted, drafted, 3.0 if found == 0 else 0.5 * policy.shapes[1].cost(k), asked=k)
    assert policy.plain_time == pytest.approx(0.5) and policy.calibration is None


def test_a_run_of_plain_steps_is_timed_by_its_middle_rounds(tiny):
    """Plain steps run one ahead, so a run's last round can find its step already done (0 ms on this CPU) and its
    first wait for the second's too: alone, the last round's time is not learnt; in a batch (two rows of ten
    tokens, ten rounds), neither the first's nor the last's."""
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    engine.tokenizer.eos_token_ids = []  # every generation runs its ten rounds
    engine.next_policy = alone = TimesSeen()
    engine.generate(engine.encode(PROMPT), max_tokens=10)
    assert len(alone.seconds) == 10 and alone.seconds[-1] is None and None not in alone.seconds[3:-1]
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer)
    decoder.policy = batch = TimesSeen()
    list(decoder.run([Job(engine.encode(text), max_tokens=10) for text in (PROMPT, "def add(a, b):")], 2))
    assert len(batch.seconds) == 8 and None not in batch.seconds


def test_round_costs_are_learnt_per_band_of_context_depths(tiny):
    """Drafts cheap at short contexts and dear past 4K tokens (as on a CPU, where a verify's attention grows
    with depth): the policy drafts at the one and not at the other, each from its own band's costs, also in a
    later policy started from the profile (which keeps both bands); the engine tells the policy each prompt's
    depth, a batch each row's that decodes alone."""
    policy = AdaptiveDraftLength(max_len=4)
    policy.begin(300)
    assert max(run_rounds(policy, 40, lambda r: 2, per_draft=0.1)[-10:]) >= 2
    policy.begin(5000)
    assert run_rounds(policy, 60, lambda r: 2, per_draft=1.5)[-20:].count(0) >= 16
    assert "at contexts of 4K-8K tokens" in policy.explain()[2]
    later = AdaptiveDraftLength(max_len=4, profile=policy.profile())
    later.begin(600)
    assert max(run_rounds(later, 10, lambda r: 2, per_draft=0.1)[3:]) >= 2  # drafts at once: its costs were kept
    later.begin(6000)
    assert run_rounds(later, 10, lambda r: 2, per_draft=1.5)[3:].count(0) >= 6
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram", draft_len=None)
    mlx_spec.generate(engine, engine.encode(PROMPT * 40), max_tokens=4)
    assert engine.policy.band == depth_band(len(engine.encode(PROMPT * 40))) > 0
    alone = AdaptiveDraftLength(max_len=4)  # a batch's lone rows too: a short prompt, then a long one
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, 4, alone=alone)
    list(decoder.run([Job(engine.encode(text), max_tokens=6) for text in (PROMPT, PROMPT * 40)], 1))
    assert alone.band == depth_band(len(engine.encode(PROMPT * 40))) > 0
