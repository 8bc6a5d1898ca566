"""Batched speculative decoding: every row exact against decoding it alone, rows joining and leaving, one row's
rollback leaving the others untouched, the sampled distribution with B > 1, and the refusals."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, FlatCostBatchPolicy, RandomDraftLengths, assert_one_line_error, run_cli
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load
from test_sampling import assert_follows, exact_sequences, prompt_where_drafts_pass

import mlx_spec
from mlx_spec.batched import BatchedDecoder, Job
from mlx_spec.errors import SpecError
from mlx_spec.ragged import RaggedBatch
from mlx_spec.sampling import SamplingParams

TEXTS = ["def add(a, b):", PROMPT, "class Stack:\n    def push(self, item):", "for i in range(10):\n    print(i)\n" * 3,
         "import os\nimport sys\n", "x"]


def jobs_for(engine, sampled: bool = False) -> list[Job]:
    """Prompts of different lengths and answers of different lengths, so that rows leave and join mid-batch;
    with `sampled`, every other job samples (each with its own seed)."""
    return [Job(engine.encode(text), SamplingParams(temperature=0.8 if sampled and i % 2 else 0.0),
                max_tokens=47 - 7 * i, seed=i) for i, text in enumerate(TEXTS)]


@pytest.mark.parametrize("family,drafter,draft,draft_len", [
    ("qwen3", "ngram", None, 3), ("qwen3", "ngram", None, None), ("qwen3", "draft-model", "qwen3-draft", 2),
    ("llama", "draft-model", "llama-draft", None), ("qwen3", "off", None, None), ("llama", "draft-model", "llama-draft", 4)])
def test_every_row_equals_decoding_it_alone(tiny, family, drafter, draft, draft_len):
    """Greedy rows equal plain decoding; sampled rows (pinned draft lengths) equal decoding them alone with the
    same seed, token for token: each row's keys and verdicts are its own. The adaptive policy runs on a flat cost
    model, so that how much it drafts does not depend on how busy the machine is."""
    engine = mlx_spec.load(str(tiny[family]), draft_model=draft and str(tiny[draft]), drafter=drafter,
                           draft_len=draft_len)
    jobs = jobs_for(engine, sampled=draft_len is not None)
    plain = engine.with_drafter("off")
    alone = [(plain if job.params.greedy else engine).generate(job.prompt, job.params, job.max_tokens, [], job.seed)
             for job in jobs]
    if draft_len is None and drafter != "off":
        decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len)
        decoder.policy = FlatCostBatchPolicy(engine.max_draft_len)
        finished = list(decoder.run(jobs, 3))
    else:
        finished = list(engine.generate_many(jobs, 3))
    assert sorted(i for i, _ in finished) == list(range(len(jobs)))
    assert [i for i, _ in finished] != list(range(len(jobs)))  # short answers leave first, queued jobs join
    results = dict(finished)
    for i, job in enumerate(jobs):
        assert results[i].tokens == alone[i].tokens, i
        assert results[i].text == alone[i].text and results[i].stop_reason == alone[i].stop_reason
    if drafter != "off":
        assert 0 < sum(r.stats.accepted for r in results.values()) < sum(r.stats.drafted for r in results.values())


def test_changing_draft_lengths_in_a_batch_stay_exact(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), drafter="draft-model")
    jobs = jobs_for(engine)
    plain = engine.with_drafter("off")
    for seed in range(3):
        decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, 5)
        decoder.policy = RandomDraftLengths(5, seed)
        for i, result in decoder.run(jobs, 4):
            assert result.tokens == plain.generate(jobs[i].prompt, max_tokens=jobs[i].max_tokens).tokens


def alone_logits(model, tokens: list[int]) -> mx.array:
    return model(mx.array([tokens]), cache=make_prompt_cache(model))[0, -1]


def test_one_rows_rollback_leaves_the_others_untouched(tiny):
    """A batch of three prompts; each round every row feeds drafts of its own length and keeps its own count
    (all, some, none), rows leave, a row joins, the holes are squeezed out: after every step each row's logits
    equal the model run on that row's tokens alone, and keeping fewer in one row changes no other row's K/V."""
    model, _ = load(str(tiny["qwen3"]))
    rng = np.random.default_rng(0)
    rows = [[int(t) for t in rng.integers(0, 500, n)] for n in (5, 17, 2)]
    batch = RaggedBatch(model)
    for tokens in rows:
        alone = RaggedBatch(model, rows=1)
        alone.forward(mx.array([tokens[:-1]]), [len(tokens) - 1])
        batch.join(alone)
    for step in range(24):
        drafts = [[int(t) for t in rng.integers(0, 500, rng.integers(0, 5))] for _ in rows]
        width = 1 + max(map(len, drafts))
        inputs = np.zeros((len(rows), width), dtype=np.int32)
        for i, (tokens, draft) in enumerate(zip(rows, drafts)):
            inputs[i, :1 + len(draft)] = [tokens[-1], *draft]
        earlier = batch.columns
        batch.mark()
        logits = batch.forward(mx.array(inputs), [1 + len(d) for d in drafts])
        kept = [int(rng.integers(0, len(d) + 1)) for d in drafts]
        kept[step % len(rows)] = 0  # one row rejects everything
        before = [(c.keys[:, :, :earlier], c.values[:, :, :earlier]) for c in batch.caches]
        batch.keep([k + 1 for k in kept])
        for (keys, values), cache in zip(before, batch.caches):  # nothing written before this round moved
            assert mx.array_equal(keys, cache.keys[:, :, :earlier]) and mx.array_equal(values, cache.values[:, :, :earlier])
        for i, (tokens, draft, k) in enumerate(zip(rows, drafts, kept)):
            for j in range(k + 1):
                assert mx.allclose(logits[i, j], alone_logits(model, tokens + draft[:j]), atol=1e-4), (step, i, j)
            tokens += draft[:k] + [int(rng.integers(0, 500))]
        if step == 8:
            batch.select([2, 0])
            rows = [rows[2], rows[0]]
        if step == 14:
            tokens = [int(t) for t in rng.integers(0, 500, 30)]
            alone = RaggedBatch(model, rows=1)
            alone.forward(mx.array([tokens[:-1]]), [len(tokens) - 1])
            batch.join(alone)
            rows.append(tokens)
        if step == 18:
            holes = batch.columns - batch.valid.sum(axis=1).max()
            batch.compact()
            assert holes > 0 and batch.columns == batch.valid.sum(axis=1).max()
    assert [int(n) for n in batch.offsets] == [len(t) - 1 for t in rows]


def test_sampled_batches_follow_the_target(tiny):
    """Three sampled tokens (T=1, top-k 2) from 800 rows decoded 8 at a time with a draft model that is close
    to the target but not equal: the 8 possible sequences appear as often as the target alone makes them."""
    horizon, top_k, samples = 3, 2, 800
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-noisy"]), drafter="draft-model",
                           draft_len=2)
    prompt = prompt_where_drafts_pass(engine, engine.encode(PROMPT))
    exact = exact_sequences(tiny["qwen3"], prompt, horizon, top_k)
    jobs = [Job(prompt, SamplingParams(temperature=1.0, top_k=top_k), horizon, seed=seed) for seed in range(samples)]
    observed = dict.fromkeys(exact, 0)
    drafted = accepted = 0
    for _, result in engine.generate_many(jobs, 8):
        observed[tuple(result.tokens)] += 1  # a KeyError would mean a sequence the target cannot produce
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert 0 < accepted < drafted
    assert_follows(observed, exact, samples)


def test_drafters_and_caches_that_cannot_batch_are_refused(tiny):
    head = mlx_spec.load(str(tiny["qwen3"]), mtp_path=str(tiny["qwen3-mtp-head"]))
    assert "does not draft in batches" in head.batch_problem()
    with pytest.raises(SpecError, match="use a batch size of 1"):
        list(head.generate_many(jobs_for(head)[:2], 2))
    assert list(head.generate_many(jobs_for(head)[:1], 1))[0][1].tokens  # one at a time still works
    assert "RotatingKVCache" in mlx_spec.load(str(tiny["gemma3"]), drafter="ngram").batch_problem()
    assert mlx_spec.load(str(tiny["qwen3"]), drafter="ngram").batch_problem() is None


def test_batch_cli_sizes_and_refusals(tiny, tmp_path):
    import json

    requests = tmp_path / "in.jsonl"
    requests.write_text("".join(json.dumps({"id": f"r{i}", "prompt": text, "raw": True, "max_tokens": 10 + 3 * i})
                                + "\n" for i, text in enumerate(TEXTS)))
    outputs = {}
    for size in ("1", "3"):
        out = tmp_path / f"out{size}.jsonl"
        proc = run_cli("batch", str(requests), "-o", str(out), "--model", str(tiny["qwen3"]), "--drafter", "ngram",
                       "--batch-size", size, "--quiet")
        assert proc.returncode == 0, proc.stderr
        outputs[size] = {r["id"]: r["text"] for r in map(json.loads, out.read_text().splitlines())}
    assert outputs["1"] == outputs["3"] and len(outputs["1"]) == len(TEXTS)
    head = ["--model", str(tiny["qwen3"]), "--mtp-path", str(tiny["qwen3-mtp-head"]), "--quiet"]
    proc = run_cli("batch", str(requests), "-o", str(tmp_path / "head.jsonl"), *head, "--batch-size", "2")
    assert_one_line_error(proc, "--batch-size 2", "does not draft in batches", "--batch-size 1")
    assert not (tmp_path / "head.jsonl").exists() or not (tmp_path / "head.jsonl").read_text()
    proc = run_cli("batch", str(requests), "-o", str(tmp_path / "head.jsonl"), *head)  # default: told, one at a time
    assert proc.returncode == 0 and "batch: one request at a time: the mtp drafter" in proc.stderr
    proc = run_cli("batch", str(requests), "-o", str(tmp_path / "zero.jsonl"), "--model", str(tiny["qwen3"]),
                   "--batch-size", "0")
    assert_one_line_error(proc, "--batch-size must be a whole number >= 1")
