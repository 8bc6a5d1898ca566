"""The adaptive policy replayed on rounds recorded on real weights (`scripts/bench_policy.py PAIR --trace
tests/traces`): for every position of each recorded answer, the drafts offered and accepted from there, and what
each round of each draft length cost in plain steps on that machine. A replay charges the policy's choices those
costs, so its choices are checked against every pinned length without timing anything here. The n-gram drafter,
which needs no model, drafts in the replay itself on the recorded prompt and answer (greedy: a draft passes where
it is the answer's token), its outlook weighed as the engine weighs it."""

import json
import statistics
from pathlib import Path

import pytest

from mlx_spec.drafters.kinds import DRAFTERS
from mlx_spec.drafters.ngram import NgramDrafter
from mlx_spec.policy.sequence import UNTIMED_ROUNDS
from mlx_spec.policy.sequence import AdaptiveDraftLength
from mlx_spec.core.sampling import SamplingParams

TRACES = sorted((Path(__file__).parent / "traces").glob("*.json"))
PINNED = range(1, 9)  # the lengths the best pinned is chosen from, those of them a trace recorded (`--pinned`)
# Known short of the goal (issue 42), strict: passing turns these into failures to remove from here.
SHORT_OF_THE_BEST = {"mtp-smollm2": "at break-even (k = 1 2% over plain) the default from a profile drafts a "
                                    "fifth to a third of the rounds: "
                                    "0.966 of k = 1 replayed (0.986 in the recorded run)"}
WITH_A_PROFILE = [pytest.param(path, marks=pytest.mark.xfail(strict=True, reason=SHORT_OF_THE_BEST[path.stem]))
                  if path.stem in SHORT_OF_THE_BEST else path for path in TRACES]


def answer_positions(generations: dict[str, list], tokens: int) -> tuple[list[int], list[int]]:
    """For every position of an answer, the drafts the drafter offers from there and how many of them the target
    accepts, from the rounds of generations of it at every pinned length. A round from p that accepted L < k of k
    drafts says L at p and, greedy drafts from a context being a prefix of the longer draft from the same context,
    L - d at p + d; one that accepted all k says at least k - d (nothing of p + k, where the target's own token
    came). A round that drafted fewer than its pinned length (n-gram found no more) says what is offered at p;
    where no round says, the drafter is taken to offer all that is asked."""
    exact, at_least, offered = {}, [0] * tokens, {}
    for name, rounds in generations.items():
        pinned, p = int(name[2:]) if name.startswith("k=") else None, 0
        for k, accepted, _ in rounds:
            if pinned and k < min(pinned, tokens - 1 - p):
                offered.setdefault(p, k)
            for d in range(accepted + (accepted < k)):
                if accepted < k:
                    exact.setdefault(p + d, accepted - d)
                elif p + d < tokens:
                    at_least[p + d] = max(at_least[p + d], accepted - d)
            p += accepted + 1
    return [exact.get(p, at_least[p]) for p in range(tokens)], [offered.get(p, tokens) for p in range(tokens)]


class Replay:
    """One recorded answer: at each position, the drafts offered and accepted (`answer_positions`), or for n-gram
    its prompt and answer (`text`); `costs[k]`, the recorded costs of rounds of k drafts (after each generation's
    untimed rounds), replayed in turn; "none": rounds that asked for drafts and got none (an n-gram lookup that
    found nothing costs more than a plain step, which runs one ahead)."""

    def __init__(self, prompt: dict, tokens: int, drafter: str):
        self.runs, self.offered = answer_positions(prompt["rounds"], tokens)
        self.depth = prompt["prompt_tokens"]
        self.pinned = {int(name[2:]) for name in prompt["rounds"] if name.startswith("k=")}.intersection(PINNED)
        self.text = (prompt["prompt"], prompt["answer"]) if drafter == "ngram" and "answer" in prompt else None
        self.costs: dict[int | str, list[float]] = {}
        for name, rounds in prompt["rounds"].items():
            for k, _, cost in rounds[UNTIMED_ROUNDS:]:
                self.costs.setdefault("none" if k == 0 and name != "plain" else k, []).append(cost)

    def speed(self, policy, tokens: int | None = None, drafter: NgramDrafter | None = None) -> float:
        """Tokens per plain step's time of a generation of `tokens` (all recorded) under `policy`; n-gram drafts by
        `drafter` (None: one from the prior)."""
        tokens = tokens or len(self.runs)
        done, spent, used, seen = 0, 0.0, {}, None
        if hasattr(policy, "begin"):
            policy.begin(self.depth)
        if self.text:
            drafter, context, answer = drafter or NgramDrafter(), list(self.text[0]), self.text[1]
            drafter.begin(context, None)
            seen = drafter.outlook
        for i in range(10 * tokens):
            if done >= tokens:
                break
            asked = policy.next_draft_len(tokens - done, seen)
            if self.text and asked:
                draft = drafter.propose(context, asked, SamplingParams(), None)
                drafted = draft.tokens.tolist()[: policy.cut(draft.confidence.tolist()) if hasattr(policy, "cut")
                                                else asked]
                k = len(drafted)
                accepted = next((j for j, token in enumerate(drafted) if token != answer[done + j]), k)
            else:
                k = min(asked, self.offered[done])
                accepted = min(k, self.runs[done])
            kind = "none" if asked and not k and "none" in self.costs else k
            cost = self.costs[kind][used.get(kind, 0) % len(self.costs[kind])]
            used[kind] = used.get(kind, 0) + 1
            policy.observe(k, accepted, cost if i >= UNTIMED_ROUNDS else None, asked=asked)
            spent += cost
            done += accepted + 1
            if self.text:  # a plain round decides the next before its token is known: on the outlook before it
                seen = drafter.outlook
                context += answer[done - accepted - 1:done]
                drafter.accept(context, accepted, None)
                seen = seen if asked == 0 else drafter.outlook
        return tokens / spent


class Pinned:
    def __init__(self, k):
        self.k = k

    def next_draft_len(self, remaining, outlook=None):
        return min(self.k, remaining - 1)

    def observe(self, *args, **kwargs):
        pass


def replays(path: Path) -> tuple[int, list[Replay]]:
    """The adaptive policy's longest draft for the trace's drafter (as users run it now), and its answers."""
    trace = json.loads(path.read_text())
    kind = DRAFTERS["draft-model" if trace["drafter"] == "draft" else trace["drafter"]]
    return kind.max_draft_len, [Replay(prompt, trace["tokens"], trace["drafter"]) for prompt in trace["prompts"]]


def overall(speeds: list[float]) -> float:
    """Tokens per plain step's time over answers of equal length."""
    return len(speeds) / sum(1 / speed for speed in speeds)


def pinned_speeds(answers: list[Replay]) -> dict[int, float]:
    """Each length recorded pinned for every answer: its overall speed."""
    return {k: overall([replay.speed(Pinned(k)) for replay in answers])
            for k in sorted(set.intersection(*(replay.pinned for replay in answers)))}


def commands(replays: list[Replay], max_len: int, profile: dict | None,
             estimates: bool = True) -> tuple[float, dict | None]:
    """Each answer as a command of its own, starting from the profile the one before kept (an n-gram drafter's
    estimates of its drafts included, as the engine keeps them; `estimates` False: its drafter from the prior)."""
    speeds = []
    for replay in replays:
        policy, drafter = AdaptiveDraftLength(max_len, profile=profile), NgramDrafter()
        if estimates:
            drafter.start_from((profile or {}).get("drafter"))
        speeds.append(replay.speed(policy, drafter=drafter))
        if learnt := policy.profile():
            profile = {**learnt, "drafter": drafter.estimates()}
    return overall(speeds), profile


@pytest.mark.parametrize("path", WITH_A_PROFILE, ids=lambda path: path.stem)
def test_adaptive_nears_the_best_pinned_length_once_it_has_a_profile(path):
    """Commands that start from what earlier ones learnt (the profile kept on disk, here from one pass over the
    answers) run at >= 0.98 of the best length pinned in hindsight for them all (the policy before profiles and
    cost curves: 0.80 on the 1.5B's draft model; before its optimism past the first draft position, 0.94 on the
    trace recorded at 0b18e4a), and
    >= 0.97 of plain decoding."""
    max_len, answers = replays(path)
    pinned = pinned_speeds(answers)
    plain = overall([replay.speed(Pinned(0)) for replay in answers])
    _, profile = commands(answers, max_len, None)
    adaptive, _ = commands(answers, max_len, profile)
    assert adaptive >= 0.98 * max(pinned.values()) and adaptive >= 0.97 * plain, (adaptive, plain, pinned)


@pytest.mark.parametrize("path", TRACES, ids=lambda path: path.stem)
def test_a_first_generation_finds_its_length_at_a_bounded_cost(path):
    """From nothing (a first run on this machine): a plain step, a draft and a longer draft measured on the way,
    then one length past the longest measured at a time: >= 0.88 of the best pinned length (the 1.5B's draft
    model 0.90 and 0.91; before the optimism past the first draft position, 0.85 and 0.88; the profile is what
    closes the gap)."""
    max_len, answers = replays(path)
    pinned = pinned_speeds(answers)
    plain = overall([replay.speed(Pinned(0)) for replay in answers])
    cold = overall([replay.speed(AdaptiveDraftLength(max_len)) for replay in answers])
    assert cold >= 0.88 * max(pinned.values()) and cold >= 0.97 * plain, (cold, plain, pinned)


@pytest.mark.parametrize("path", [path for path in TRACES if path.stem.startswith("ngram")], ids=lambda path: path.stem)
def test_the_ngram_outlook_nears_the_best_pinned_length_from_what_earlier_commands_learnt(path):
    """n-gram's drafts pass in bursts, which no one length fits: with the drafter's outlook (what it expects of
    its next chain, by match length) the default from a profile reaches >= 0.97 of the best length pinned in
    hindsight (SmolLM2 and the 0.5B beyond it; Gemma 3 0.98, the 1.5B 0.99), and the drafter's estimates kept
    in the profile are worth it (started from the prior instead, each command: the 1.5B 0.92, Gemma 3 0.94). A
    first run on a machine, from nothing at all, >= 0.92."""
    max_len, answers = replays(path)
    best = max(pinned_speeds(answers).values())
    _, profile = commands(answers, max_len, None)
    warm, _ = commands(answers, max_len, profile)
    forgetful, _ = commands(answers, max_len, profile, estimates=False)
    cold = overall([replay.speed(AdaptiveDraftLength(max_len)) for replay in answers])
    assert warm >= 0.97 * best and warm > forgetful and cold >= 0.92 * best, (warm, forgetful, cold, best)


def test_the_ngram_outlook_beats_the_acceptance_by_position_over_the_recorded_answers():
    """Over every n-gram trace, the default from a profile with the drafter's outlook runs faster than the
    policy that weighs the acceptance by position alone (optimistic past the first position; the same rounds,
    as derived from the pinned runs): 1.045 times as fast (geometric mean; from 0.98 on Gemma 3, where the hindsight
    pick is within its noise, to 1.11 on the 0.5B)."""
    ratios = []
    for path in TRACES:
        max_len, answers = replays(path)
        if path.stem.startswith("ngram"):
            warm, _ = commands(answers, max_len, commands(answers, max_len, None)[1])
            for replay in answers:
                replay.text = None  # the policy sees no outlook
            blind, _ = commands(answers, max_len, commands(answers, max_len, None)[1])
            ratios.append(warm / blind)
    assert len(ratios) >= 4 and statistics.geometric_mean(ratios) >= 1.02, ratios


def test_a_profile_kept_at_short_prompts_does_not_mislead_a_long_context():
    """Round costs grow with the context's depth (the 0.5B with n-gram: one draft 0.12 of a plain step at 55 tokens,
    0.47 at 8K, where every pinned length is below plain decoding), so the policy learns them per band of depths: a
    command at 8K tokens from a profile kept at short prompts runs >= 0.97 of plain decoding (with the short
    prompts' costs: 0.92), and short prompts after it run from their own costs again."""
    traces = Path(__file__).parent / "traces"
    max_len, short = replays(traces / "ngram-0.5b.json")
    _, deep = replays(traces / "ngram-0.5b-8k.json")
    plain = overall([replay.speed(Pinned(0)) for replay in deep])
    _, profile = commands(short, max_len, None)
    again, _ = commands(short, max_len, profile)
    long_context, profile = commands(deep, max_len, profile)
    after, _ = commands(short, max_len, profile)
    assert long_context >= 0.97 * plain and after >= 0.97 * again, (long_context, plain, after, again)
