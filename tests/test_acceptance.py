"""Measured acceptance at T > 0 is what the distributions imply. Exactness alone cannot show it: a drafter that
drew its drafts greedily and reported no q would still decode exactly, only accepting far less.

A draft model equal to its target has every sampled draft accepted, one at a time and in batches. For every
drafter kind, the first draft of a round is accepted as often as the sum over tokens of min(p, q): p computed
here by mlx-lm's model on the round's context, q the distribution the drafter reports for that draft (one-hot at
its token for a deterministic drafter); drafters that run a model report a q at T > 0."""

import math

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT
from mlx_lm.utils import load

import mlx_spec
from mlx_spec.decode.rounds import Job
from mlx_spec.core.sampling import SamplingParams

SAMPLED = SamplingParams(temperature=1.0)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])  # full attention; sliding windows
def test_a_draft_equal_to_its_target_has_every_sampled_draft_accepted(tiny, family):
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[family]), draft_len=4)  # none can be rejected
    ids = engine.encode(PROMPT)
    for seed in range(3):
        stats = mlx_spec.generate(engine, ids, max_tokens=40, temperature=1.0, seed=seed).stats
        assert stats.drafted > 0 and stats.accepted == stats.drafted, seed
    jobs = [Job(ids[:20 + 5 * seed], SAMPLED, max_tokens=30, seed=seed) for seed in range(3)]
    for _, result in engine.generate_many(jobs, 3):
        assert result.stats.drafted > 0 and result.stats.accepted == result.stats.drafted


class Recorded:
    """The engine's own drafter, keeping what each round drafted and how much of it was accepted: rounds of
    (context, draft) one at a time, of (contexts, drafts) for a batch, paired with the accepted counts that the
    engine reports back to the drafter right after."""

    def __init__(self, drafter):
        self.inner, self.rounds = drafter, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, context, k, params, key):
        draft = self.inner.propose(context, k, params, key)
        self.rounds.append([[list(context)], [draft], None])
        return draft

    def accept(self, context, accepted, step):
        if self.rounds and self.rounds[-1][2] is None:
            self.rounds[-1][2] = [accepted]
        self.inner.accept(context, accepted, step)

    def batched(self, target_batch):
        return RecordedRows(self.inner.batched(target_batch), self.rounds)


class RecordedRows:
    def __init__(self, rows, rounds):
        self.inner, self.rounds = rows, rounds

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, contexts, lengths, params, keys):
        drafts = self.inner.propose(contexts, lengths, params, keys)
        self.rounds.append([[list(c) for c in contexts], drafts, None])
        return drafts

    def accept(self, contexts, accepted, hidden=None, tree_logits=None):
        if self.rounds and self.rounds[-1][2] is None:
            self.rounds[-1][2] = list(accepted)
        self.inner.accept(contexts, accepted, hidden, tree_logits)


def first_draft_verdicts(model, rounds) -> tuple[list[float], list[bool], int]:
    """Per drafted position 1: (the acceptance probability sum_x min(p, q), whether it was accepted), and how
    many of those drafts came with a q."""
    expected, observed, with_q = [], [], 0
    for contexts, drafts, accepted in rounds:
        for context, draft, count in zip(contexts, drafts, accepted):
            if draft.tokens.size == 0:
                continue
            logits = np.array(model(mx.array([context]))[0, -1], dtype=np.float64)
            p = np.exp(logits - logits.max())
            p /= p.sum()
            token = int(draft.tokens[0].item())
            if draft.q is None:
                q = np.zeros_like(p)
                q[token] = 1.0
            else:
                q, with_q = np.array(draft.q[0], dtype=np.float64), with_q + 1
            expected.append(float(np.minimum(p, q).sum()))
            observed.append(count >= 1)
    return expected, observed, with_q


DRAFTERS = [("qwen3", "draft-model", "qwen3-noisy"), ("qwen3", "ngram", None), ("qwen3_5", "mtp", None),
            ("deepseek_v3", "mtp", None), ("qwen3", "mtp", "qwen3-mtp-head"), ("qwen3", "draft-model", "qwen3-eagle3"),
            ("qwen3", "draft-model", "qwen3-medusa"), ("gemma4", "draft-model", "gemma4-assistant-trained"),
            ("qwen3", "draft-model", "qwen3-dflash"), ("qwen3_5", "draft-model", "qwen3_5-dspark")]


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("family,drafter,draft", DRAFTERS)
def test_first_drafts_are_accepted_as_often_as_their_distributions_imply(tiny, family, drafter, draft, batch):
    given = {"mtp_path" if drafter == "mtp" else "draft_model": draft and str(tiny[draft])}
    engine = mlx_spec.load(str(tiny[family]), drafter=drafter, draft_len=2, tree_width=1, **given)
    engine.drafter = recorded = Recorded(engine.drafter)
    ids = engine.encode(PROMPT)
    jobs = [Job(ids[:8 + 4 * (seed % 4)], SAMPLED, max_tokens=40, seed=seed) for seed in range(8)]
    if batch == 1:
        for job in jobs:
            mlx_spec.generate(engine, job.prompt, max_tokens=job.max_tokens, temperature=1.0, seed=job.seed)
    else:
        assert engine.batch_problem() is None
        list(engine.generate_many(jobs, batch))
    expected, observed, with_q = first_draft_verdicts(load(str(tiny[family]))[0], recorded.rounds)
    assert len(expected) >= 40
    assert with_q == (0 if drafter == "ngram" or draft == "qwen3-medusa" else len(expected))  # model drafters: q
    spread = math.sqrt(sum(a * (1 - a) for a in expected)) / len(expected)
    assert abs(np.mean(observed) - np.mean(expected)) <= 4.5 * spread + 0.01, (np.mean(observed), np.mean(expected))
