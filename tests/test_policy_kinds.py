"""The adaptive policy replayed on every kind of work a chat sees (`mlx-spec bench --suite work`: writing,
rewriting, translation, short questions, questions over a passage, summaries, math, code, multi-turn chat), from
traces recorded on real weights (`scripts/trace_kinds.py`): each prompt's greedy answer and, at each position,
whether the draft model's greedy draft there is the answer's token and the draft model's probability of it (an
n-gram drafter drafts on the answer itself). Each round is charged what a round of its length cost on that
machine (the pinned runs of the same pair, `tests/traces/draft-1.5b.json`, `ngram-0.5b.json`), so the default
is compared with plain decoding and every pinned length without timing anything here."""

import json
import statistics
from pathlib import Path

import pytest
from test_policy_traces import Pinned, Replay, overall

from mlx_spec.drafters.ngram import NgramDrafter
from mlx_spec.policy.sequence import UNTIMED_ROUNDS, AdaptiveDraftLength

TRACES = Path(__file__).parent / "traces"
KINDS = sorted((TRACES / "kinds").glob("*.json"))
COSTS = {"draft": "draft-1.5b.json", "ngram": "ngram-0.5b.json"}  # the pinned runs whose round costs are charged
MAX_LEN = 8


class KindReplay(Replay):
    """One recorded answer of a kind, its first `tokens`; a draft model's chains stopped where the policy says
    (`go_on`) on the recorded probabilities."""

    def __init__(self, entry: dict, tokens: int, drafter: str, costs: dict):
        self.kind, self.depth, self.costs = entry["kind"], entry["prompt_tokens"], costs
        self.text = (entry["prompt"], entry["answer"][:tokens]) if drafter == "ngram" else None
        self.confidence, self.runs, run = entry.get("confidence", [])[:tokens], [0] * tokens, 0
        for p in reversed(range(tokens)):  # a chain from p passes as far as its drafts are the answer's
            run = run + 1 if self.text is None and entry["match"][p] else 0
            self.runs[p] = run
        self.offered = [tokens] * tokens

    def speed(self, policy, tokens=None, drafter=None) -> float:
        if self.text:
            return super().speed(policy, tokens, drafter)
        tokens, done, spent, used = len(self.runs), 0, 0.0, {}
        if hasattr(policy, "begin"):
            policy.begin(self.depth)
        for i in range(10 * tokens):
            if done >= tokens:
                break
            asked, k, confidence = policy.next_draft_len(tokens - done), 0, []
            while k < asked:  # past a rejected draft the recorded probability is the answer's: nearly so
                confidence.append(self.confidence[done + k])
                k += 1
                if k < asked and hasattr(policy, "go_on") and not policy.go_on([confidence]):
                    break
            accepted = min(k, self.runs[done])
            cost = self.costs[k][used.get(k, 0) % len(self.costs[k])]
            used[k] = used.get(k, 0) + 1
            policy.observe(k, accepted, cost if i >= UNTIMED_ROUNDS else None, asked=asked)
            spent, done = spent + cost, done + accepted + 1
        return tokens / spent


def pinned_costs(name: str) -> dict:
    """Each draft length's recorded round costs (plain steps) in the pinned runs of a trace, past the untimed
    rounds; "none": n-gram rounds that asked and found nothing."""
    costs = {}
    for prompt in json.loads((TRACES / name).read_text())["prompts"]:
        for contender, rounds in prompt["rounds"].items():
            if contender == "plain" or contender.startswith("k="):
                for k, _, cost in rounds[UNTIMED_ROUNDS:]:
                    costs.setdefault("none" if k == 0 and contender != "plain" else k, []).append(cost)
    return costs


def answers(path: Path, tokens: int) -> list[KindReplay]:
    trace = json.loads(path.read_text())
    costs = pinned_costs(COSTS[trace["drafter"]])
    return [KindReplay(entry, tokens, trace["drafter"], costs) for entry in trace["prompts"]]


def commands(replays: list[KindReplay], profile: dict | None, disable=()) -> tuple[list[float], dict | None]:
    """Each answer as a command of its own, from the profile the one before kept (the n-gram drafter's
    estimates too); `disable`: policy methods replaced by the default interface's (the policy without them)."""
    speeds = []
    for replay in replays:
        policy, drafter = AdaptiveDraftLength(MAX_LEN, profile=profile), NgramDrafter()
        for method in disable:
            setattr(policy, method, lambda *args: True)
        drafter.start_from((profile or {}).get("drafter"))
        speeds.append(replay.speed(policy, drafter=drafter))
        if learnt := policy.profile():
            profile = {**learnt, "drafter": drafter.estimates()}
    return speeds, profile


def kind_speeds(path: Path, tokens: int, disable=()) -> dict[str, dict[str, list[float]]]:
    """Per kind, per prompt, against plain decoding: the default as the first command after the other kinds (from
    the profile they kept, twice over them), and as a first run on the machine (from none)."""
    replays = answers(path, tokens)
    out = {}
    for kind in dict.fromkeys(r.kind for r in replays):
        mine, others = [r for r in replays if r.kind == kind], [r for r in replays if r.kind != kind]
        profile = commands(others, commands(others, None, disable)[1], disable)[1]
        plain = [r.speed(Pinned(0)) for r in mine]
        after = [commands([r], profile, disable)[0][0] / p for r, p in zip(mine, plain)]
        cold = [commands([r], None, disable)[0][0] / p for r, p in zip(mine, plain)]
        out[kind] = {"after other kinds": after, "first run": cold}
    return out


# Known short of the goal (issue 65), strict: passing turns these into failures to remove from here.
SHORT = {("ngram-0.5b", 48): "n-gram on the third code prompt after the other kinds: 0.962 of plain decoding (its "
                             "outlook from one matching token, learnt on the other kinds' repeats, drafts 4 where "
                             "the code's lookups rarely pass)"}
CASES = [pytest.param(path, tokens, marks=pytest.mark.xfail(strict=True, reason=SHORT[path.stem, tokens]))
         if (path.stem, tokens) in SHORT else pytest.param(path, tokens) for path in KINDS for tokens in (48, 128)]


@pytest.mark.parametrize("path,tokens", CASES, ids=lambda value: value.stem if isinstance(value, Path) else value)
def test_the_default_never_loses_to_plain_decoding_on_any_kind_of_work(path, tokens):
    """On every prompt of every kind, >= 0.97 of plain decoding: as the first command after the other kinds (a
    profile learnt on them) and as a first run; without the draft model's stops it falls below (figures:
    scripts/replay_kinds.py)."""
    speeds = kind_speeds(path, tokens)
    worst = {kind: min(min(v) for v in by.values()) for kind, by in speeds.items()}
    assert min(worst.values()) >= 0.97, worst


@pytest.mark.parametrize("path", KINDS, ids=lambda path: path.stem)
def test_the_default_overall_reaches_the_best_single_pinned_length(path):
    """Over every prompt of every kind (128 tokens, tokens per plain step's time over the whole workload), the
    default as a chat runs them (each command from the profile the one before kept) reaches >= 0.98 of the best
    length pinned in hindsight for the whole workload."""
    replays = answers(path, 128)
    best = max(overall([r.speed(Pinned(k)) for r in replays]) for k in range(1, MAX_LEN + 1))
    speeds, _ = commands(replays, commands(replays, None)[1])
    assert overall(speeds) >= 0.98 * best, (overall(speeds), best)


def test_stopping_where_the_draft_model_is_unsure_pays_on_prose():
    """Over the draft model's prose kinds (writing, rewriting, translation, short questions, chat), the stops
    make the default faster than the same policy drafting chains as long as asked (geometric mean)."""
    path = TRACES / "kinds" / "draft-1.5b.json"
    prose = ("writing", "rewriting", "translation", "short QA", "chat")
    ratios = []
    for tokens in (48, 128):
        stops, whole = kind_speeds(path, tokens), kind_speeds(path, tokens, disable=("go_on",))
        ratios += [statistics.geometric_mean(stops[k]["after other kinds"]) /
                   statistics.geometric_mean(whole[k]["after other kinds"]) for k in prose]
    assert statistics.geometric_mean(ratios) > 1.0, ratios
