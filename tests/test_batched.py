"""Batched speculative decoding: every row exact against mlx-lm's plain decoding (and plain sampling with its seed),
drafting in a batch as alone, rows joining and leaving, one row's rollback leaving the others untouched, the
sampled distribution with B > 1, and the refusals."""

from collections import deque

import mlx.core as mx
import numpy as np
import pytest
from helpers import (PROMPT, FlatCostBatchPolicy, RandomDraftLengths, Unreadied, assert_one_line_error, mlx_lm_text,
                     plain_greedy, plain_sampled, run_cli)
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load
from test_gemma4 import PENALTY, with_centroid_head
from test_sampling import assert_follows, exact_sequences, prompt_where_drafts_pass

import mlx_spec
from mlx_spec.decode.batched import BatchedDecoder, together
from mlx_spec.decode.rounds import Job, Row
from mlx_spec.drafters.qwen_mtp import PROMPT_ROWS
from mlx_spec.seams.errors import SpecError
from mlx_spec.loading import DEMO
from mlx_spec.policy.sequence import FixedDraftLength
from mlx_spec.runners.ragged import RaggedBatch
from mlx_spec.core.sampling import SamplingParams

TEXTS = ["def add(a, b):", PROMPT, "class Stack:\n    def push(self, item):", "for i in range(10):\n    print(i)\n" * 3,
         "import os\nimport sys\n", "x"]


def jobs_for(engine, sampled: bool = False) -> list[Job]:
    """Prompts of different lengths and answers of different lengths, so that rows leave and join mid-batch;
    with `sampled`, every other job samples (each with its own seed)."""
    return [Job(engine.encode(text), SamplingParams(temperature=0.8 if sampled and i % 2 else 0.0),
                max_tokens=47 - 7 * i, seed=i) for i, text in enumerate(TEXTS)]


@pytest.mark.parametrize("family,drafter,draft,draft_len", [
    ("qwen3", "ngram", None, 3), ("qwen3", "ngram", None, None), ("qwen3", "draft-model", "qwen3-draft", 2),
    ("llama", "draft-model", "llama-draft", None), ("qwen3", "off", None, None), ("llama", "draft-model", "llama-draft", 4),
    ("qwen3_5", "draft-model", "qwen3_5-draft", None), ("qwen3_5", "draft-model", "qwen3_5-draft", 3),  # GDN, both
    ("gemma3", "draft-model", "gemma3-draft", None), ("gemma3", "ngram", None, 2),  # sliding windows (16)
    ("qwen3_5", "off", None, 0), ("gemma3", "off", None, 0),  # plain steps run ahead, sampled rows too
    ("qwen3", "draft-model", "qwen3-dflash", 3), ("qwen3_5", "draft-model", "qwen3_5-dspark", 2),  # blocks
    ("qwen3", "suffix", None, None), ("gemma3", "suffix", None, None),  # drafts from earlier rows: greedy only
    ("deepseek_v32", "mtp", None, 2), ("glm_moe_dsa", "ngram", None, None),  # sparse attention (CacheLists)
    ("nemotron_h", "draft-model", "nemotron_h-draft", None), ("nemotron_h", "draft-model", "nemotron_h-draft", 3)])
def test_every_row_equals_decoding_it_alone(tiny, family, drafter, draft, draft_len):
    """Greedy rows equal mlx-lm's plain decoding; sampled rows (pinned draft lengths) with one-hot drafts (n-gram,
    none) equal plain sampling with their own seeds, token for token: each row's keys and verdicts are its own.
    Sampled rows with drafts of a dense q (draft models, blocks) draw other tokens than plain sampling for a seed
    (the law is the same: test_sampled_batches_follow_the_target), so they equal decoding them alone. The adaptive
    policy runs on a flat cost model, so that how much it drafts does not depend on how busy the machine is."""
    engine = mlx_spec.load(str(tiny[family]), draft_model=draft and str(tiny[draft]), drafter=drafter,
                           draft_len=draft_len)
    jobs = jobs_for(engine, sampled=draft_len is not None)
    alone = [plain_greedy(tiny[family], job.prompt, job.max_tokens) if job.params.greedy else
             plain_sampled(tiny[family], job.prompt, job.max_tokens, job.params.temperature, seed=job.seed)
             if drafter in ("ngram", "off") else
             engine.generate(job.prompt, job.params, job.max_tokens, [], job.seed).tokens for job in jobs]
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
        assert results[i].tokens == alone[i], i
        ended = alone[i][-1] in engine.tokenizer.eos_token_ids
        assert results[i].stop_reason == ("eos" if ended else "max_tokens"), i
        assert results[i].text == mlx_lm_text(engine.tokenizer, alone[i][:-1] if ended else alone[i]), i
    if drafter != "off":
        assert 0 < sum(r.stats.accepted for r in results.values()) < sum(r.stats.drafted for r in results.values())


@pytest.mark.parametrize("target,options", [
    ("demo", {}),  # the demo's own MTP layer over its Gated DeltaNet target
    ("qwen3", {"mtp_path": "qwen3-mtp-head"}),  # a trained head
    ("glm4_moe", {"drafter": "mtp"}),  # a nextn layer
    ("glm4_moe_lite", {"drafter": "mtp"}),  # a nextn layer over MLA
    ("mimo", {"drafter": "mtp"}),  # a nextn layer that reads the target's pre-norm states
    ("exaone_moe", {"drafter": "mtp"}),  # Qwen3.5's layout over sliding-window and global layers
    ("ernie4_5_moe", {"drafter": "mtp"}),  # scored through the target's final norm
    ("mimo_v2_flash", {"drafter": "mtp"}),  # a sliding-window layer, its cache a window's
    ("step3p5", {"drafter": "mtp"}),  # its own head, zero-centred norms
    ("longcat_flash", {"drafter": "mtp"}),  # its own embedding, over a target of two MLA sublayers a layer
    ("bailing_hybrid", {"drafter": "mtp"}),  # over a target whose gated linear attention layers replay to roll back
    ("nemotron_h", {"drafter": "mtp"}),  # sublayers in a chain, over Mamba 2 layers
    ("kimi_k3", {"drafter": "mtp"}),  # over delta attention layers and attention residuals, its config nested
    ("qwen3", {"draft_model": "qwen3-eagle3"}),  # an EAGLE-3 head, chains
    ("qwen3", {"draft_model": "qwen3-medusa"}),  # Medusa heads, chains
    ("qwen3", {"draft_model": "qwen3-draft", "kv_bits": 8, "kv_group_size": 32}),  # quantized KV, target and draft
    ("gemma3", {"drafter": "ngram", "kv_bits": 8, "kv_group_size": 32}),  # quantized full-attention layers only
    ("gemma4", {"draft_model": "gemma4-assistant-trained"}),  # a Gemma 4 assistant over the target's K/V
])
def test_pinned_rows_draft_in_a_batch_as_alone(tiny, target, options):
    """With a pinned draft length every row runs the rounds it runs alone, so a drafter drafting for the batch
    (here those that read the target's hidden states, and quantized KV caches) must propose what it proposes
    alone: every row's tokens, and which of them came from accepted drafts, equal decoding it alone with the same
    engine (greedy and sampled rows)."""
    path = str(DEMO / "demo") if target == "demo" else str(tiny[target])
    engine = mlx_spec.load(path, draft_len=2, **{k: str(tiny[v]) if k in ("mtp_path", "draft_model") else v
                                                 for k, v in options.items()})
    assert engine.batch_problem() is None
    jobs = jobs_for(engine, sampled=True)
    results = dict(engine.generate_many(jobs, 3))
    for i, job in enumerate(jobs):
        alone = engine.generate(job.prompt, job.params, job.max_tokens, [], job.seed)
        assert results[i].tokens == alone.tokens and results[i].from_draft == alone.from_draft, i
        assert results[i].stats.batch_size > 1  # decoded beside others (the last may find only one left)
        if job.params.greedy:
            assert alone.tokens == plain_greedy(path, job.prompt, job.max_tokens, kv_bits=options.get("kv_bits")), i
    assert max(r.stats.batch_size for r in results.values()) == 3 and sum(r.stats.accepted for r in results.values())


class PausingPolicy(FixedDraftLength):
    """Two drafts a round, but none in rounds 3 to PROMPT_ROWS + 10 (a pause of PROMPT_ROWS + 8 positions): by
    round, so a row alone and the rows of a batch that all started together pause in the same rounds."""

    def __init__(self):
        super().__init__(2)
        self.rounds = 0

    def next_draft_len(self, remaining: int, outlook=None) -> int:
        self.rounds += 1
        return 0 if 3 <= self.rounds < 3 + PROMPT_ROWS + 8 else min(2, remaining - 1)


def test_the_mtp_layer_starts_over_after_a_pause_in_a_batch_as_alone(monkeypatch):
    """After more positions without drafting than it keeps rows for on a prompt (PROMPT_ROWS), the MTP layer
    starts over on the last PROMPT_ROWS of them rather than building rows for the whole pause: in a batch as
    alone, so every row's tokens and drafts equal decoding it alone (greedy and sampled rows)."""
    engine = mlx_spec.load(str(DEMO / "demo"), drafter="mtp")
    engine.tokenizer.eos_token_ids = []  # every row lives through the pause
    jobs = [Job(job.prompt, job.params, 48, seed=job.seed) for job in jobs_for(engine, sampled=True)[:3]]
    forgotten, forget = [], RaggedBatch.forget
    monkeypatch.setattr(RaggedBatch, "forget", lambda self, row: forgotten.append(row) or forget(self, row))
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len,
                             engine.target.read_hidden, hidden_tail=engine.target.hidden_tail)
    decoder.policy = PausingPolicy()
    results = dict(decoder.run(jobs, 3))
    assert sorted(forgotten) == [0, 1, 2]  # every row, once: after the pause
    for i, job in enumerate(jobs):
        engine.next_policy = PausingPolicy()
        alone = engine.generate(job.prompt, job.params, job.max_tokens, [], job.seed)
        assert results[i].tokens == alone.tokens and results[i].from_draft == alone.from_draft, i
        assert any(results[i].from_draft[-16:]), i  # drafts pass after the pause


def test_a_row_joining_where_drafting_does_not_pay_skips_its_prompt_rows_and_drafts_from_what_it_decodes(monkeypatch):
    """A row that joins a batch size where drafting does not pay is prefilled without the hidden states the MTP
    layer's prompt rows need (the target's last layer is not run in full over the prompt's tail); when drafting
    turns on, the layer drafts from the positions the row decoded, and every row equals plain decoding."""
    engine = mlx_spec.load(str(DEMO / "demo"), drafter="mtp")
    jobs = jobs_for(engine)[:4]
    read, extend = [], RaggedBatch.extend
    monkeypatch.setattr(RaggedBatch, "extend", lambda self, tokens, read_hidden=None, *args:
                        read.append(read_hidden) or extend(self, tokens, read_hidden, *args))
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len,
                             engine.target.read_hidden, hidden_tail=engine.target.hidden_tail)
    decoder.policy = Unreadied()
    results = dict(decoder.run(jobs, 2))
    assert read and all(reader is None for reader in read)
    for i, job in enumerate(jobs):
        assert results[i].tokens == plain_greedy(DEMO / "demo", job.prompt, job.max_tokens), i
    assert sum(r.stats.accepted for r in results.values()) > 0


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "gemma3"])  # full KV, Gated DeltaNet, sliding windows
def test_a_row_joining_where_drafting_does_not_pay_is_prefilled_in_the_draft_model_at_its_first_draft(tiny, family,
                                                                                                    monkeypatch):
    """A draft model puts off its prefill of a row that joins where drafting does not pay until the batch first
    drafts, then prefills each such row alone (in its place: not padding every row to its context); every row
    equals plain decoding, with drafts accepted."""
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[f"{family}-draft"]), drafter="draft-model")
    jobs, prefills, prefilled = jobs_for(engine)[:4], [], RaggedBatch.prefilled.__func__
    monkeypatch.setattr(RaggedBatch, "prefilled", classmethod(
        lambda cls, model, prompts, **kv: prefills.append((model, [len(p) for p in prompts])) or
        prefilled(cls, model, prompts, **kv)))
    decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len)
    decoder.policy = Unreadied()
    results = dict(decoder.run(jobs, 2))
    drafts = [lengths for model, lengths in prefills if model is engine.drafter.weights]
    assert drafts[:2] == [[0], [0]]  # the first two rows join with nothing prefilled in the draft model
    assert len([lengths for lengths in drafts if lengths[0]]) == len(jobs)  # each row once, when it first drafts
    first = [lengths[0] for lengths in drafts if lengths[0]][:2]
    assert sorted(first) == sorted(len(job.prompt) + 1 for job in jobs[:2])  # after the two plain rounds
    for i, job in enumerate(jobs):
        assert results[i].tokens == plain_greedy(tiny[family], job.prompt, job.max_tokens), i
    assert sum(r.stats.accepted for r in results.values()) > 0


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_job_pinned_draft_length_holds_at_every_batch_size(tiny, batch_size):
    """A job's own draft length holds whether it runs in a batch or, at batch size 1, alone; the engine's
    adaptive policy runs the other jobs."""
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="ngram")
    jobs = [Job(engine.encode(text), max_tokens=24, draft_len=pin) for text, pin in zip(TEXTS, [0, 3, None])]
    results = dict(engine.generate_many(jobs, batch_size))
    assert results[0].stats.drafted == 0 and results[0].stats.policy == "drafting off"
    assert results[1].stats.policy == "draft length 3 (pinned)"
    assert engine.status().draft_len is None and "pinned" not in results[2].stats.policy


@pytest.mark.parametrize("head", ["dense", "centroids"])
def test_a_gemma4_assistant_drafts_in_a_batch_what_it_drafts_alone(tiny, tmp_path, monkeypatch, head):
    """Every draft a Gemma 4 assistant proposes for a row of a batch equals what it proposes alone from the same
    context: it reads the row's own K/V in the target's batch, and past the sliding window (16 positions) only
    that row's last window + 1 of them. The distilled assistant (its dense head, or a centroid head) under
    test_gemma4's repetition penalty: drafts accepted and rejected."""
    from mlx_spec.drafters.gemma4_assistant import AssistantDrafter, BatchedAssistant

    assistant = tiny["gemma4-assistant-trained"]
    if head == "centroids":
        assistant = with_centroid_head(assistant, tmp_path / "centroids")
    engine = mlx_spec.load(str(tiny["gemma4"]), draft_model=str(assistant), draft_len=3)
    jobs = [Job(job.prompt, SamplingParams(repetition_penalty=PENALTY), job.max_tokens) for job in jobs_for(engine)]
    alone, batched = {}, {}
    propose, propose_many = AssistantDrafter.propose, BatchedAssistant.propose

    def recorded(self, context, *args):
        draft = propose(self, context, *args)
        alone[tuple(context)] = draft.tokens.tolist()
        return draft

    def recorded_many(self, contexts, *args):
        drafts = propose_many(self, contexts, *args)
        batched.update((tuple(context), draft.tokens.tolist()) for context, draft in zip(contexts, drafts))
        return drafts

    monkeypatch.setattr(AssistantDrafter, "propose", recorded)
    monkeypatch.setattr(BatchedAssistant, "propose", recorded_many)
    for job in jobs:
        engine.generate(job.prompt, job.params, job.max_tokens, [], job.seed)
    results = dict(engine.generate_many(jobs, 3))
    assert [results[i].tokens for i in range(len(jobs))] == [
        plain_greedy(tiny["gemma4"], job.prompt, job.max_tokens, PENALTY) for job in jobs]
    assert len(alone) > 60 and max(map(len, alone)) > 16 + 10  # contexts well past the window
    assert all(batched[context] == drafts for context, drafts in alone.items())
    assert 0 < sum(r.stats.accepted for r in results.values()) < sum(r.stats.drafted for r in results.values())


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_changing_draft_lengths_in_a_batch_stay_exact(tiny, family):
    """Random draft lengths per round; with Gated DeltaNet layers in the target and the draft, a row padded in the
    draft model's first forward of a round goes on from its own state."""
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[f"{family}-draft"]), drafter="draft-model")
    jobs = jobs_for(engine)
    references = [plain_greedy(tiny[family], job.prompt, job.max_tokens) for job in jobs]
    for seed in range(3):
        decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, 5)
        decoder.policy = RandomDraftLengths(5, seed)
        for i, result in decoder.run(jobs, 4):
            assert result.tokens == references[i]


def alone_logits(model, tokens: list[int]) -> mx.array:
    return model(mx.array([tokens]), cache=make_prompt_cache(model))[0, -1]


@pytest.mark.parametrize("family,together", [  # full attention, Gated DeltaNet, sliding window, Mamba 2
    ("qwen3", False), ("qwen3_5", False), ("gemma3", False), ("nemotron_h", False), ("qwen3", True),
    ("gemma3", True)])
def test_one_rows_rollback_leaves_the_others_untouched(tiny, family, together):
    """A batch of three prompts (prefilled apart, or `together`: padded to the longest, the way prompts that join
    while no row decodes are); each round every row feeds drafts of its own length and keeps its own count
    (all, some, none), rows leave, a row joins, (prefilled apart) all leave and join the emptied batch again, the
    holes are squeezed out: after every step each row's logits equal the model run on that row's tokens alone (the
    sliding window's 16 positions are passed), and keeping fewer in one row changes no other row's K/V."""
    model, _ = load(str(tiny[family]))
    # the recurrence over several inputs is mlx-lm's step by step in another form, equal to float32 rounding: logits
    # of size ~15 differ by up to 2.3e-3, as in the one-sequence engine; a state off by one input moves them by 15-20
    atol = 2e-2 if family in ("qwen3_5", "nemotron_h") else 1e-4
    rng = np.random.default_rng(0)
    rows = [[int(t) for t in rng.integers(0, 500, n)] for n in (5, 17, 2)]
    batch = RaggedBatch(model)
    for prompts in [[tokens[:-1] for tokens in rows]] if together else [[tokens[:-1]] for tokens in rows]:
        batch.join(RaggedBatch.prefilled(model, prompts))
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
        attention = [c for c in batch.caches if c not in batch.recurrent]
        before = [(c.keys[:, :, :earlier], c.values[:, :, :earlier]) for c in attention]
        batch.keep([k + 1 for k in kept])
        for (keys, values), cache in zip(before, attention):  # nothing written before this round moved
            assert mx.array_equal(keys, cache.keys[:, :, :earlier]) and mx.array_equal(values, cache.values[:, :, :earlier])
        for i, (tokens, draft, k) in enumerate(zip(rows, drafts, kept)):
            for j in range(k + 1):
                assert mx.allclose(logits[i, j], alone_logits(model, tokens + draft[:j]), atol=atol), (step, i, j)
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
        if step == 19 and not together:  # every row leaves, and rows join the emptied batch
            batch.select([])
            for tokens in rows:
                batch.join(RaggedBatch.prefilled(model, [tokens[:-1]]))
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


def test_every_drafter_batches_and_caches_that_cannot_are_refused(tiny):
    from mlx_lm.models import llama4

    from mlx_spec.decode.batched import batch_problem

    model = llama4.Model(llama4.ModelArgs(model_type="llama4", text_config=dict(  # chunked attention
        attention_bias=False, attention_chunk_size=4, head_dim=4, hidden_size=8, interleave_moe_layer_step=2,
        intermediate_size=16, intermediate_size_mlp=16, max_position_embeddings=64, model_type="llama4_text",
        num_attention_heads=2, num_experts_per_tok=1, num_hidden_layers=1, num_key_value_heads=1,
        num_local_experts=2, rms_norm_eps=1e-5, rope_scaling=None, rope_theta=1e4, use_qk_norm=False,
        vocab_size=16)))
    assert "its ChunkedKVCache caches are not batched yet" in batch_problem(model)
    with pytest.raises(SpecError, match="use a batch size of 1"):
        BatchedDecoder(model, None)
    for name in ("ngram", "lookahead", "suffix"):
        assert mlx_spec.load(str(tiny["qwen3"]), drafter=name).batch_problem() is None, name
    for tree in ("qwen3-draft", "qwen3-eagle3", None):  # None: n-gram trees (test_trees.py: exact in batches)
        engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=tree and str(tiny[tree]), tree_width=2,
                               drafter="draft-model" if tree else "ngram")
        assert engine.status().shape == "tree of width 2" and engine.batch_problem() is None, tree
    for family in ("qwen3", "gemma3", "qwen3_5"):  # full attention, sliding windows, Gated DeltaNet
        assert mlx_spec.load(str(tiny[family]), drafter="ngram").batch_problem() is None


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
    proc = run_cli("batch", str(requests), "-o", str(tmp_path / "zero.jsonl"), "--model", str(tiny["qwen3"]),
                   "--batch-size", "0")
    assert_one_line_error(proc, "--batch-size must be a whole number >= 1")


def test_ngram_chains_continue_down_to_the_last_token_and_past_the_end_of_their_copy_alone_and_in_a_batch():
    """A chain comes from the latest occurrence of the longest suffix found, down to the last token alone, and a
    copy that runs into the end of the text goes on from the latest occurrence of its own new suffix; a last
    token never seen drafts nothing. A batch's rows draft exactly as alone, greedy or sampled; trees still need a
    suffix of min_ngram tokens."""
    from mlx_spec.drafters.ngram import NgramDrafter

    cases = [([1, 2, 3, 4, 5, 1, 2, 3], 3, [4, 5, 1]),  # the 3-gram (1, 2, 3)
             ([7, 8, 9, 10, 8], 4, [9, 10, 8, 9]),  # only the last token (8) was seen: its copy, then (8,)'s again
             ([9, 1, 2, 1, 2], 3, [1, 2, 1]),  # (1, 2)'s copy ends at the text's end: then (1, 2, 1, 2)'s suffix
             ([4, 5, 1, 2, 6, 7, 2], 2, [6, 7]),  # (7, 2) unseen: (2,)'s latest continuation
             ([5, 6, 7, 8], 3, []),  # 8 never seen before
             ([1, 2, 9, 1, 2, 7, 3, 1, 2], 1, [7]),  # (1, 2) seen twice: its latest continuation, not its first
             ([1, 2, 3, 8, 5, 2, 3, 9, 1, 2, 3], 1, [8])]  # the longest suffix, though a shorter one came later
    keys = [mx.random.key(0)] * len(cases)
    for params in ([SamplingParams()] * len(cases), [SamplingParams(temperature=1.0)] * len(cases)):
        rows = NgramDrafter().batched(None)
        for context, _, _ in cases:
            rows.join(context)
        batched = rows.propose([c for c, _, _ in cases], [k for _, k, _ in cases], params, keys)
        assert [d.tokens.tolist() for d in batched] == [want for _, _, want in cases]
        for (context, k, want), p in zip(cases, params):
            alone = NgramDrafter()
            alone.begin(context, None)
            assert alone.propose(context, k, p, keys[0]).tokens.tolist() == want
    tree = NgramDrafter(width=2)
    tree.begin([7, 8, 9, 10, 8], None)
    assert tree.propose([7, 8, 9, 10, 8], 3, SamplingParams(), keys[0]).tokens.tolist() == []


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_queued_prompt_joins_as_soon_as_a_row_leaves_with_drafting_off(tiny, family):
    """Plain rounds run one ahead, and a prompt waiting to join holds that back for a round: it joins while the
    other row still decodes (continuous batching), and every row still decodes as it does alone."""
    engine = mlx_spec.load(str(tiny[family]), drafter="off")
    jobs = [Job(engine.encode(text), max_tokens=n) for text, n in zip(TEXTS, (4, 40, 30))]
    waiting = deque(enumerate(jobs))
    events = list(engine.stream_many(lambda: waiting.popleft() if waiting else None, 2))
    first_of_last = next(i for i, (key, _) in enumerate(events) if key == 2)
    done_of_second = next(i for i, (key, e) in enumerate(events) if key == 1 and isinstance(e, mlx_spec.Done))
    assert first_of_last < done_of_second
    for key, event in events:
        if isinstance(event, mlx_spec.Done):
            assert event.tokens == plain_greedy(tiny[family], jobs[key].prompt, jobs[key].max_tokens), key


def test_prompts_are_grouped_to_prefill_together_where_their_padding_stays_small(tiny):
    """Longest first, a group while padding every prompt to its longest adds at most a quarter, and never past
    4096 tokens in all."""
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    rows = [Row(i, Job([1] * n), engine.tokenizer, "off") for i, n in enumerate((100, 90, 10, 95, 12, 3000, 2900))]
    assert [[row.key for row in group] for group in together(rows)] == [[5], [6], [0, 3, 1], [4, 2]]


@pytest.mark.parametrize("family,drafter", [("qwen3", "off"), ("qwen3", "ngram"), ("gemma3", "ngram"), ("qwen3_5", "off")])
def test_prompts_joining_while_no_row_decodes_are_prefilled_together_and_decode_as_alone(tiny, monkeypatch, family,
                                                                                          drafter):
    """The first rows' prompts (of different lengths) run in one padded prefill, except where a layer is recurrent
    (Gated DeltaNet: one at a time), and every row decodes as it does alone."""
    engine = mlx_spec.load(str(tiny[family]), drafter=drafter, draft_len=2 if drafter == "ngram" else None)
    texts = ["def add(a, b):\n    return a + b + 1\n", "class Stack:\n    def push(self, item):",
             "import os\nimport sys\nimport json\n", "for i in range(10):\n    print(i)"]  # 17-22 tokens
    jobs = [Job(engine.encode(text), max_tokens=24) for text in texts]
    assert len({len(job.prompt) for job in jobs}) > 1
    groups, prefilled = [], RaggedBatch.prefilled.__func__
    monkeypatch.setattr(RaggedBatch, "prefilled", classmethod(lambda cls, model, prompts, **kv: (
        model is engine.target.model and groups.append(len(prompts))) or prefilled(cls, model, prompts, **kv)))
    results = dict(engine.generate_many(jobs, 4))
    assert groups == ([] if family == "qwen3_5" else [4])
    for i, job in enumerate(jobs):
        assert results[i].tokens == plain_greedy(tiny[family], job.prompt, 24), i
    if drafter == "ngram":  # rows with holes verify drafts
        assert sum(r.stats.drafted for r in results.values()) > 0


def test_a_later_batch_goes_on_with_what_the_last_ones_policy_learnt(tiny):
    """A server decodes each burst of requests (a lone one too) as a batch of its own: the next batch of the same
    engine goes on with the adaptive policy the last one left (costs modelled flat, so that its choices follow
    acceptance, not the clock), so its first round drafts instead of timing plain steps again; every row still
    decodes as mlx-lm's plain greedy decoding does."""
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), draft_len=None)
    engine.batch_policy = policy = FlatCostBatchPolicy(engine.max_draft_len)
    for burst in range(2):
        jobs = [Job(engine.encode(text), max_tokens=24) for text in TEXTS[2 * burst: 2 * burst + 2]]
        waiting = deque(enumerate(jobs))
        events = list(engine.stream_many(lambda: waiting.popleft() if waiting else None, 2))
        rounds = [event.draft_len for _, event in events if isinstance(event, mlx_spec.Round)]
        assert (rounds[0] == 0) == (burst == 0), rounds  # a first batch times a plain step first
        for key, event in events:
            if isinstance(event, mlx_spec.Done):
                assert event.tokens == plain_greedy(tiny["qwen3"], jobs[key].prompt, 24), key
    assert engine.batch_policy is policy and len(policy.seconds) >= 2


def test_a_row_that_never_drafted_leaves_the_prompt_cache_nothing_of_its_draft_model(tiny):
    """A row that joins where drafting does not pay puts off its draft model's prefill, and may finish before it
    ever drafts; what the prompt cache keeps of it then holds nothing of the draft model (it crashed the server's
    batch once a policy carried over from an earlier batch had turned drafting off)."""
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), draft_len=None)
    engine.cache_prompts(1 << 28)
    engine.batch_policy = Unreadied()  # rows join unready; plain rounds first
    jobs = [Job(engine.encode(text), max_tokens=2) for text in (PROMPT, TEXTS[0])]  # two rows: the batch's policy
    waiting = deque(enumerate(jobs))
    events = list(engine.stream_many(lambda: waiting.popleft() if waiting else None, 2))
    for key, event in events:
        if isinstance(event, mlx_spec.Done):
            assert event.tokens == plain_greedy(tiny["qwen3"], jobs[key].prompt, 2)
    assert not any(isinstance(e, mlx_spec.Round) and e.draft_len for _, e in events)
