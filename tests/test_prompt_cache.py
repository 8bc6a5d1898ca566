"""The prompt cache across conversations (prompt_cache.py): conversations that alternate reuse their own earlier
turns, for every cache type and every drafter that keeps a state of its own, and decode as plain decoding does."""

import signal

import httpx
import mlx.core as mx
import numpy as np
import pytest
from helpers import (
    KEY,
    PROMPT,
    chat_ids,
    loaded,
    mlx_lm_text,
    plain_greedy,
    start_server,
)
from test_server import client

import mlx_spec
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.decode.rounds import Job
from mlx_spec.drafters.dflash import BlockRows
from mlx_spec.runners.ragged import RaggedBatch
from mlx_spec.runners.ragged_kv import STEP

OPENINGS = [PROMPT, "class Stack(object):\n", "def main():\n    x = 1\n", "import re\n", "x = [1, 2]\n",
            "def f(a, b):\n", "# notes\n", "for i in range(3):\n"]


def alternate(engine, path, order: list[int], max_tokens: int = 24, kv_bits: int | None = None) -> list:
    """Turns of conversations in `order` (their indices); each turn's prompt is the last one, its answer and some
    more. Checks every answer against mlx-lm's plain decoding; returns each turn's statistics and each
    conversation's tokens so far. A turn's `held`: the tokens its last turn left in a cache (all but its last)."""
    prompts, stats, contexts = {}, [], {}
    for turn, i in enumerate(order):
        prompt = prompts.get(i) or engine.encode(OPENINGS[i])
        result = mlx_spec.generate(engine, prompt, max_tokens=max_tokens)
        assert result.tokens == plain_greedy(path, prompt, max_tokens, kv_bits=kv_bits), (turn, i)
        result.stats.held = len(contexts[i]) - 1 if i in contexts else 0
        stats.append(result.stats)
        contexts[i] = prompt + result.tokens
        prompts[i] = prompt + result.tokens + engine.encode(f"\n# turn {order[:turn].count(i)}\n" + OPENINGS[i])
    return stats, contexts


def next_draft(engine, context: list[int]):
    """What the drafter proposes next, sampled (its distributions depend on all it holds)."""
    draft = engine.drafter.propose(context, 3, SamplingParams(temperature=1.0), mx.random.key(1))
    return draft.tokens.tolist(), np.array(draft.q) if draft.q is not None else None


@pytest.mark.parametrize("family,options", [
    ("qwen3", {"draft_model": "qwen3-draft"}),  # full KV, cut back
    ("qwen3", {"draft_model": "qwen3-draft", "kv_bits": 4, "kv_group_size": 32}),  # quantized KV
    ("gemma3", {"draft_model": "gemma3-draft"}),  # sliding window
    ("qwen3_5-fitted-mtp", {"drafter": "mtp"}),  # Gated DeltaNet, restored at the prompt's end
    ("mimo_v2_flash", {"drafter": "mtp"}),  # a nextn layer's sliding-window cache, held and restored
    ("glm_moe_dsa", {"drafter": "mtp"}),  # sparse attention: each layer's cache a CacheList, the nextn layer's too
    ("qwen3", {"draft_model": "qwen3-dflash"}),  # a block drafter's context
    ("llama", {"draft_model": "llama-eagle3"}),  # an EAGLE-3 head's rows
    ("qwen3", {"drafter": "ngram"}),
], ids=["draft-model", "quantized-kv", "sliding-window", "gated-deltanet-mtp", "nextn-window", "sparse-attention",
        "dflash", "eagle3", "ngram"])
def test_alternating_conversations_reuse_their_turns_exactly(tiny, family, options):
    """Two conversations, turn about: each returning turn runs only what its last turn did not (its prompt and
    answer held, with the drafter's own state: it drafts as it does when the conversation runs alone), and every
    answer is plain decoding's, drafts accepted and not."""
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), draft_len=3, **options)
    engine.cache_prompts(1 << 30)
    stats, contexts = alternate(engine, tiny[family], [0, 1] * 3, kv_bits=options.get("kv_bits"))
    assert [s.reused_prompt_tokens for s in stats[2:]] == [s.held for s in stats[2:]]  # returning turns
    single = mlx_spec.load(str(tiny[family]), draft_len=3, **options)
    alone, _ = alternate(single, tiny[family], [1] * 3, kv_bits=options.get("kv_bits"))
    assert [(s.drafted, s.accepted, s.reused_prompt_tokens) for s in stats[1::2]] == \
        [(s.drafted, s.accepted, s.reused_prompt_tokens) for s in alone]
    (tokens, q), (alone_tokens, alone_q) = next_draft(engine, contexts[1]), next_draft(single, contexts[1])
    assert tokens == alone_tokens and (q is None) == (alone_q is None)
    assert q is None or np.allclose(q, alone_q, atol=1e-6)  # the drafter holds what it held alone
    if options.get("drafter") != "ngram":
        assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)


def test_eight_conversations_stay_within_the_budget(tiny):
    """Eight conversations through a budget that holds about three: the least recently used go, the stored
    sequences never take more than the budget, and what is no longer stored is prefilled again, exactly."""
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), draft_len=3)
    one = engine.encode(OPENINGS[0])
    mlx_spec.generate(engine, one, max_tokens=24)
    engine.cache_prompts(1 << 30)
    mlx_spec.generate(engine, engine.encode(OPENINGS[1]), max_tokens=24)  # stores the first
    budget = int(engine.prompt_cache.nbytes * 3.5)
    engine.cache_prompts(budget)
    stats, _ = alternate(engine, tiny["qwen3"], [*range(8), *reversed(range(8))])
    assert engine.prompt_cache.nbytes <= budget and 2 <= len(engine.prompt_cache.stored) <= 4
    returning = [s.reused_prompt_tokens == s.held for s in stats[8:]]
    assert returning[:3] == [True] * 3 and returning[-3:] == [False] * 3  # the newest reused, the oldest dropped


@pytest.mark.parametrize("family,options", [
    ("qwen3", {"draft_model": "qwen3-draft"}), ("qwen3", {"drafter": "off", "kv_bits": 4, "kv_group_size": 32}),
    ("gemma3", {"draft_model": "gemma3-draft"}), ("qwen3_5", {"draft_model": "qwen3_5-draft"}),
    ("qwen3", {"draft_model": "qwen3-dflash"}),
])
def test_batched_rows_reuse_and_leave_cached_sequences(tiny, family, options, monkeypatch):
    """Conversations decoded in a batch store what their rows held (the draft model's too, a block drafter's
    context); their next turns, in a batch or alone, start from it (and a batch's rows from a turn decoded alone),
    and decode as plain decoding does."""
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), draft_len=3, **options)
    engine.cache_prompts(1 << 30)
    draft_starts, extend = [], RaggedBatch.extend  # where the draft model's rows start their prompts' prefill
    monkeypatch.setattr(RaggedBatch, "extend", lambda self, tokens, *args: (
        self.model is getattr(engine.drafter, "weights", None) and draft_starts.append(int(self.offsets[0])))
        or extend(self, tokens, *args))
    block_held, absorber = [], BlockRows.absorber  # what a block drafter's joining rows took back
    monkeypatch.setattr(BlockRows, "absorber", lambda self, held: block_held.append(held is not None)
                        or absorber(self, held))
    prompts, held, every = [engine.encode(opening) for opening in OPENINGS[:4]], [0] * 4, []
    for turn in range(3):
        if turn == 1:  # one turn alone, the others in a batch
            results = [(0, engine.generate(prompts[0], max_tokens=16))]
            results += [(1 + i, r) for i, r in engine.generate_many([Job(p, max_tokens=16) for p in prompts[1:]], 3)]
        else:
            results = list(engine.generate_many([Job(p, max_tokens=16) for p in prompts], 4))
        every += [result.stats for _, result in results]
        for i, result in results:
            assert result.tokens == plain_greedy(tiny[family], prompts[i], 16, kv_bits=options.get("kv_bits"))
            assert result.stats.reused_prompt_tokens == held[i], (turn, i)
            held[i] = len(prompts[i]) + len(result.tokens) - 1
            prompts[i] = prompts[i] + result.tokens + engine.encode(f"\n# {turn}\n")
        assert max(r.stats.batch_size for _, r in results) > 1
    if "draft_model" in options:  # its rows took back what it held of each conversation's last turn
        assert len([start for start in draft_starts if start > 0]) >= 6 or sum(block_held) == 7
        assert 0 < sum(s.accepted for s in every) < sum(s.drafted for s in every)


def chat_turns(url: str, model: str, order: list[int]) -> list[dict]:
    """Chats in `order` (indices of OPENINGS) with a real server, through the official client: each turn adds
    the answer and one more message to its chat. Returns each turn's answer and usage."""
    api, chats, turns = client(url), {}, []
    for i in order:
        chat = chats.get(i) or [{"role": "user", "content": OPENINGS[i]}]
        reply = api.chat.completions.create(model=model, messages=chat, max_tokens=12)
        text, usage = reply.choices[0].message.content, reply.usage
        turns.append({"text": text, "prompt": usage.prompt_tokens, "cached": usage.prompt_tokens_details.cached_tokens,
                      "batch_size": usage.model_dump()["batch_size"], "chat": chat})
        chats[i] = chat + [{"role": "assistant", "content": text}, {"role": "user", "content": "and then?"}]
    return turns


def plain_answers(model: str, chats: list[list[dict]], max_tokens: int) -> list[str]:
    """Each chat's answer by mlx-lm's plain greedy decoding, its prompt as a server encodes a chat's next turn: the
    tokens its last turn ran as (prompt and answer, without the end token), then the tokens of what the chat
    template adds (text re-encoded may split otherwise); a chat's first turn through the template alone."""
    tokenizer, ran, answers = loaded(model)[1], {}, []  # ran: a chat's opening -> (its text so far, its tokens)
    for chat in chats:
        rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        said, tokens = ran.get(chat[0]["content"], ("", []))
        assert rendered.startswith(said)
        ids = tokens + tokenizer.encode(rendered[len(said):], add_special_tokens=False) if tokens \
            else chat_ids(model, chat)
        answer = plain_greedy(model, ids, max_tokens)
        answer = answer[:-1] if answer[-1] in tokenizer.eos_token_ids else answer
        answers.append(mlx_lm_text(tokenizer, answer))
        ran[chat[0]["content"]] = (rendered + answers[-1], ids + answer)
    return answers


def test_a_server_serves_alternating_chats_from_its_prompt_cache_within_budget(tiny):
    """Eight chats, then their next turns newest first, against a server whose budget holds a few (its default
    batch size: each request a batch row) and one without a prompt cache: both answer as mlx-lm's plain decoding
    of each chat; the newest chats' turns run only their new messages, the oldest (dropped) all again; the stored
    sequences within the budget."""
    model, budget, order = str(tiny["qwen3-long"]), 600_000, [*range(8), *reversed(range(8))]
    cached_proc, cached_url = start_server(tiny, "--prompt-cache-gb", str(budget / 1e9))
    plain_proc, plain_url = start_server(tiny, "--prompt-cache-gb", "0")
    try:
        cached, plain = chat_turns(cached_url, model, order), chat_turns(plain_url, model, order)
        status = httpx.get(f"{cached_url}/mlx-spec/v1/status", headers={"Authorization": f"Bearer {KEY}"}).json()
    finally:
        for proc in (cached_proc, plain_proc):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
    expected = plain_answers(model, [turn["chat"] for turn in cached], 12)
    assert [turn["text"] for turn in cached] == expected and [turn["text"] for turn in plain] == expected
    assert all(turn["cached"] == 0 for turn in plain[8:]) and {turn["batch_size"] for turn in cached} == {1}
    before = {i: turn for i, turn in zip(order, cached[:8])}  # each chat's first turn
    again = [(turn["cached"], before[i]) for i, turn in zip(order[8:], cached[8:])]
    assert all(hit >= first["prompt"] for hit, first in again[:3])  # its whole first turn's prompt, and more
    assert all(hit < first["prompt"] // 2 for hit, first in again[-3:])  # the template's opening at most
    assert 0 < status["memory"]["prompt_cache"] <= status["memory"]["prompt_cache_budget"] == budget


def test_rows_far_past_the_sliding_window_hold_only_the_window(tiny, monkeypatch):
    """Gemma 3 rows (a 16-token window) decode hundreds of tokens past it in a batch (n-gram drafts accepted and
    rejected, rows leaving and joining); their next turns start from what the rows stored, in a batch and alone.
    Every answer is mlx-lm's plain greedy decoding; the window's layers hold what the rows' next queries see (each
    row's last 17 positions, amid the columns of its rejected drafts: at most 4 a position) and a forward's inputs,
    and their buffers hold far fewer columns than full attention's."""
    engine = mlx_spec.load(str(tiny["gemma3"]), drafter="ngram", draft_len=3)
    engine.cache_prompts(1 << 30)
    seen, forward = [], RaggedBatch.forward  # after each forward of the target's rows: what each layer held before

    def watched(self, tokens, lengths, *args, **kwargs):
        logits = forward(self, tokens, lengths, *args, **kwargs)
        if self.model is engine.target.model and self.windows:
            n = tokens.shape[1]  # besides the forward's inputs
            seen.append([(cache.window, self.columns - n - cache.first, cache.keys.shape[2] - n)
                         for cache in self.layers])
        return logits
    monkeypatch.setattr(RaggedBatch, "forward", watched)
    prompts = [engine.encode(opening) for opening in OPENINGS[:3]] + [engine.encode(OPENINGS[3] * 150)[:700]]
    every = []  # the long prompt runs in pieces (PREFILL_CHUNK), its window sliding between them
    for turn, lengths in enumerate([(400, 330, 260, 200), (40, 40, 40, 40)]):
        jobs = [Job(prompt, max_tokens=n) for prompt, n in zip(prompts, lengths)]
        if turn == 0:
            results = list(engine.generate_many(jobs, 3))
        else:  # one alone, the others in a batch
            results = [(0, engine.generate(prompts[0], max_tokens=40))]
            results += [(1 + i, result) for i, result in engine.generate_many(jobs[1:], 3)]
        for i, result in results:
            assert result.tokens == plain_greedy(tiny["gemma3"], prompts[i], lengths[i]), (turn, i)
            assert turn == 0 or result.stats.reused_prompt_tokens == len(prompts[i]) - 1 - len(engine.encode("\n#"))
            prompts[i] = prompts[i] + result.tokens + engine.encode("\n#")
        every += [result.stats for _, result in results]
    assert 0 < sum(s.accepted for s in every) < sum(s.drafted for s in every)
    windows = [(held, width) for layers in seen for window, held, width in layers if window]
    full = [width for layers in seen for window, _, width in layers if not window]
    # a row's last 17 positions span at most 4 columns each (a round of 3 drafts keeps at least its first input)
    held, width = max(held for held, _ in windows), max(width for _, width in windows)
    assert held <= 4 * 17 + 4 and width <= held + STEP and max(full) > 2 * width
