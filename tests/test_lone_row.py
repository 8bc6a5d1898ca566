"""A server decodes a lone request as a batch of one row (at its default --batch-size of 8): while a batch has one
row, its rounds are decided as a sequence alone is, by the single-sequence policy that starts from the profile
kept on disk and keeps what it learnt, on the drafter's outlook (n-gram); rows that share a round are the batch
policy's; an n-gram drafter's rows learn into the engine's drafter, as a sequence alone does."""

import json

from helpers import PROMPT, plain_greedy

import mlx_spec
from mlx_spec.decode.batched import BatchedDecoder
from mlx_spec.decode.rounds import Job
from mlx_spec.drafters.ngram import NgramDrafter
from mlx_spec.policy.sequence import AdaptiveDraftLength


def lone_batch(engine, ids: list[int], max_tokens: int) -> mlx_spec.Done:
    waiting = [(0, Job(ids, max_tokens=max_tokens))]
    events = [event for _, event in engine.stream_many(lambda: waiting.pop() if waiting else None, 8)]
    return events[-1]


def test_a_lone_row_starts_from_the_profile_and_keeps_what_it_learnt(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SPEC_POLICY_PROFILES", str(tmp_path))

    def load():
        engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]))
        engine.tokenizer.eos_token_ids = []  # every generation runs to max_tokens
        return engine

    ids = load().encode(PROMPT)
    reference = plain_greedy(tiny["qwen3"], ids, 48)
    first = lone_batch(load(), ids, 48)
    assert first.tokens == reference and "rows" not in first.stats.policy  # the batch policy's notes count rows
    [kept] = tmp_path.glob("*.json")
    assert json.loads(kept.read_text())["profile"]["shapes"]["1"]["costs"]

    second = load()  # a later server: its lone request knows the costs and acceptance from its first round
    assert second.status().reasons[1].startswith("chains: k=1 ")
    done = lone_batch(second, ids, 48)
    assert done.tokens == reference and done.stats.policy_reasons[0].startswith("chains: k=1 ")
    assert 0 < done.stats.accepted < done.stats.drafted


class Recording(AdaptiveDraftLength):
    """The single-sequence policy, keeping the outlook each of its decisions was given."""

    def __init__(self, max_len):
        super().__init__(max_len)
        self.outlooks = []

    def next_draft_len(self, remaining, outlook=None):
        self.outlooks.append(outlook)
        return super().next_draft_len(remaining, outlook)


def test_a_lone_ngram_row_is_decided_on_its_drafters_outlook_and_shared_rounds_by_the_batch_policy(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram")
    engine.tokenizer.eos_token_ids = []  # every row runs to its max_tokens: the shorter leaves first
    copy = "for i in range(10):\n    print(i)\n" * 3
    jobs = [Job(engine.encode(copy), max_tokens=40), Job(engine.encode(PROMPT), max_tokens=8)]

    alone = Recording(engine.max_draft_len)
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len,
                             alone=alone)
    [(_, result)] = decoder.run(jobs[:1], 8)
    assert result.tokens == plain_greedy(tiny["qwen3"], jobs[0].prompt, 40)
    assert alone.outlooks and all(isinstance(outlook, list) for outlook in alone.outlooks)
    assert any(alone.outlooks)  # chains expected
    assert engine.drafter.rates != NgramDrafter().rates  # what the row learnt, the next request starts from

    alone = Recording(engine.max_draft_len)
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len,
                             alone=alone)
    results = dict(decoder.run(jobs, 8))
    for i, job in enumerate(jobs):
        assert results[i].tokens == plain_greedy(tiny["qwen3"], job.prompt, job.max_tokens), i
    assert decoder.policy.rounds > 0  # the two rows' rounds
    assert 0 < len(alone.outlooks) < results[0].stats.rounds  # the first row's once the second had left
