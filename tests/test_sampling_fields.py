"""Every sampling field and penalty, alone and as a row of a batch, against the target alone with mlx-lm's own
logits processors (`helpers.plain_decoded`): penalties count the sequence's own prompt, output and drafts, and
a sampled sequence draws by its own seed."""

from dataclasses import fields as dataclass_fields

import pytest
from helpers import PROMPT, plain_decoded

import mlx_spec
from mlx_spec.decode.rounds import Job
from mlx_spec.core.sampling import SamplingParams

ROWS = [  # (text, the row's fields, the same without the field under test): greedy rows
    ("import os\nimport sys\n" * 2, {"repetition_penalty": 1.3}, {}),
    (PROMPT[:60], {"presence_penalty": 1.5}, {}),
    ("for i in range(10):\n    print(i)\n" * 3, {"frequency_penalty": 1.2}, {}),
    ("class Stack:\n    def push(self, item):", {"repetition_penalty": 1.8, "penalty_window": 4},
     {"repetition_penalty": 1.8}),
    ("def add(a, b):", {}, None),  # a row without penalties beside them
]
SAMPLED_ROWS = [  # and sampled ones, where drafts are one-hot (a seed then draws plain sampling's tokens)
    ("x = 1\ny = 2\n", {"temperature": 0.8, "top_k": 5, "repetition_penalty": 1.5}, {"temperature": 0.8, "top_k": 5}),
    ("for i in range(10):\n    print(i)\n" * 3, {"temperature": 0.6, "top_p": 0.8, "frequency_penalty": 1.0},
     {"temperature": 0.6, "top_p": 0.8}),
]


def given(params: SamplingParams) -> dict:
    """The fields a row sets (those that differ from the defaults), by name."""
    return {f.name: getattr(params, f.name) for f in dataclass_fields(params) if getattr(params, f.name) != f.default}


CASES = [
    ("qwen3", {"draft_model": "qwen3-draft"}, ROWS),  # a draft model (its q penalized as the target's p)
    ("qwen3_5", {"draft_model": "qwen3_5-draft"}, ROWS),  # Gated DeltaNet in both
    ("qwen3", {"drafter": "ngram"}, ROWS + SAMPLED_ROWS),  # one-hot drafts, greedy and sampled rows
]


def engine_and_jobs(tiny, family, options, rows):
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), draft_len=3, **options)  # pinned: drafts whatever the clock says
    return engine, [Job(engine.encode(text), SamplingParams(**row_fields), max_tokens=30 - 2 * i, seed=i)
                    for i, (text, row_fields, _) in enumerate(rows)]


def assert_each_is_the_target_alone(path, jobs, rows, results) -> None:
    """Each result is the target alone under its row's fields, and the field under test changes that answer."""
    for i, (job, (_, row_fields, without)) in enumerate(zip(jobs, rows)):
        expected = plain_decoded(path, job.prompt, job.max_tokens, seed=job.seed, **given(job.params))
        assert results[i].tokens == expected, row_fields
        if without is not None:
            assert expected != plain_decoded(path, job.prompt, job.max_tokens, seed=job.seed, **without)
    assert 0 < sum(r.stats.accepted for r in results.values()) < sum(r.stats.drafted for r in results.values())


@pytest.mark.parametrize("family,options,rows", CASES)
def test_each_rows_sampling_and_penalties_are_its_own(tiny, family, options, rows):
    engine, jobs = engine_and_jobs(tiny, family, options, rows)
    results = dict(engine.generate_many(jobs, 3))  # rows join and leave
    assert max(r.stats.batch_size for r in results.values()) == 3
    assert_each_is_the_target_alone(tiny[family], jobs, rows, results)


@pytest.mark.parametrize("family,options,rows", CASES)
def test_every_sampling_field_alone_is_the_target_alone(tiny, family, options, rows):
    engine, jobs = engine_and_jobs(tiny, family, options, rows)
    results = {i: mlx_spec.generate(engine, job.prompt, max_tokens=job.max_tokens, seed=job.seed,
                                    **given(job.params)) for i, job in enumerate(jobs)}
    assert_each_is_the_target_alone(tiny[family], jobs, rows, results)
