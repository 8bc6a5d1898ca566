"""Log-probabilities under speculation: each emitted token's log p (and the likeliest tokens) under the target's
raw logits, equal to what mlx-lm's plain `generate_step` reports for the same tokens, for chains, trees and
n-gram drafts, alone and as rows of a batch; the same through the server's OpenAI `logprobs` (chat and
completions, whole and streamed, alone and concurrent requests sharing a batch)."""

import signal

import httpx
import mlx.core as mx
import numpy as np
import openai
import pytest
from helpers import KEY, PROMPT, start_server
from mlx_lm.generate import generate_step
from mlx_lm.utils import load

import mlx_spec
from mlx_spec.decode.rounds import Job


def plain_logprobs(path, prompt: list[int], count: int, top: int) -> list[tuple[int, float, list[int], list[float]]]:
    """mlx-lm's greedy tokens with their log p and the `top` likeliest ids and their log p at each step."""
    model, _ = load(str(path))
    out = []
    for (token, logprobs), _ in zip(generate_step(mx.array(prompt), model), range(count)):
        logprobs = np.array(logprobs)
        best = np.argsort(-logprobs)[:top]
        out.append((int(token), float(logprobs[int(token)]), best.tolist(), logprobs[best].tolist()))
    return out


@pytest.mark.parametrize("options", [{"draft_model": "qwen3-draft"}, {"draft_model": "qwen3-draft", "tree_width": 3},
                                     {"drafter": "ngram"}])
def test_logprobs_equal_plain_decoding(tiny, options):
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_len=3, **options)
    prompt = engine.encode(PROMPT)
    result = engine.generate(prompt, max_tokens=30, logprobs=3)
    assert 0 < result.stats.accepted < result.stats.drafted
    expected = plain_logprobs(tiny["qwen3"], prompt, len(result.tokens), 3)
    ours = [(t, lp, [i for i, _ in top]) for t, (lp, top) in zip(result.tokens, result.logprobs)]
    assert [(t, ids) for t, _, ids in ours] == [(t, ids) for t, _, ids, _ in expected]
    assert np.allclose([lp for _, lp, _ in ours], [lp for _, lp, _, _ in expected], atol=1e-4)
    assert all(top[0][1] >= top[1][1] >= top[2][1] for _, top in result.logprobs)
    assert engine.generate(prompt, max_tokens=5).logprobs == []  # only when asked


@pytest.mark.parametrize("options", [{"draft_model": "qwen3-draft"}, {"drafter": "ngram"}])
def test_logprobs_of_batch_rows_equal_plain_decoding(tiny, options):
    """Rows of a batch (joining and leaving: their lengths differ) report what each reports alone under plain
    decoding; a row that asks for none gets none."""
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_len=3, **options)
    prompts = [engine.encode(PROMPT), engine.encode("def fib(n):"), engine.encode(PROMPT + " again")]
    jobs = [Job(prompt, max_tokens=n, logprobs=top) for prompt, n, top in zip(prompts, (30, 12, 20), (3, None, 0))]
    results = dict(engine.generate_many(jobs, 2))
    assert sum(r.stats.accepted for r in results.values()) < sum(r.stats.drafted for r in results.values())
    assert sum(r.stats.accepted for r in results.values()) > 0 and results[0].stats.batch_size == 2
    for index, job in enumerate(jobs):
        result = results[index]
        if job.logprobs is None:
            assert result.logprobs == []
            continue
        expected = plain_logprobs(tiny["qwen3"], job.prompt, len(result.tokens), job.logprobs)
        assert result.tokens == [t for t, _, _, _ in expected]
        assert np.allclose([lp for lp, _ in result.logprobs], [lp for _, lp, _, _ in expected], atol=1e-4)
        assert [[i for i, _ in top] for _, top in result.logprobs] == [ids for _, _, ids, _ in expected]
        assert np.allclose([[v for _, v in top] for _, top in result.logprobs], [v for *_, v in expected], atol=1e-4)


@pytest.fixture(scope="module")
def server(tiny):
    proc, url = start_server(tiny)
    yield url, str(tiny["qwen3-long"])
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130


def test_openai_logprobs_whole_and_streamed(server, tiny):
    url, model = server
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "hi"}]
    reply = api.chat.completions.create(model=model, messages=messages, max_tokens=16, logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    joined = bytes(b for entry in content for b in entry.bytes)  # a character may span tokens: bytes join exactly
    assert joined.decode("utf-8", "replace") == reply.choices[0].message.content
    ids = mlx_spec.load(str(tiny["qwen3-long"]), drafter="off").encode(messages)
    expected = plain_logprobs(tiny["qwen3-long"], ids, len(content), 2)
    assert np.allclose([entry.logprob for entry in content], [lp for _, lp, _, _ in expected], atol=1e-4)
    assert all(len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.logprob for entry in content)
    assert all(bytes(entry.bytes).decode("utf-8", "replace") == entry.token for entry in content)

    chunks = api.chat.completions.create(model=model, messages=messages, max_tokens=16, logprobs=True,
                                         top_logprobs=2, stream=True)
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]

    text = api.completions.create(model=model, prompt=PROMPT, max_tokens=12, logprobs=2)
    legacy = text.choices[0].logprobs
    assert len(legacy.token_logprobs) == len(legacy.tokens) == len(text.choices[0].logprobs.text_offset)
    assert all(1 <= len(best) <= 2 for best in legacy.top_logprobs) and legacy.text_offset[0] == 0  # texts may clash


def test_concurrent_logprob_requests_share_a_batch_and_report_plain_decoding(server, tiny):
    """Requests asking for log-probabilities decode together (the server's batch), each as plain decoding says."""
    from concurrent.futures import ThreadPoolExecutor

    url, model = server
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
    chats = [[{"role": "user", "content": text}] for text in ("hi", "write a haiku", "count to five")]

    def ask(messages):
        reply = api.chat.completions.create(model=model, messages=messages, max_tokens=24, logprobs=True,
                                            top_logprobs=2, extra_body={"num_draft": 3})
        return reply.choices[0].logprobs.content, reply.usage

    with ThreadPoolExecutor(len(chats)) as pool:
        replies = list(pool.map(ask, chats))
    assert max(usage.batch_size for _, usage in replies) > 1
    assert 0 < sum(usage.draft_n_accepted for _, usage in replies) < sum(usage.draft_n for _, usage in replies)
    encoder = mlx_spec.load(str(tiny["qwen3-long"]), drafter="off")
    for messages, (content, _) in zip(chats, replies):
        expected = plain_logprobs(tiny["qwen3-long"], encoder.encode(messages), len(content), 2)
        assert np.allclose([entry.logprob for entry in content], [lp for _, lp, _, _ in expected], atol=1e-4)
        assert np.allclose([[best.logprob for best in entry.top_logprobs] for entry in content],
                           [values for *_, values in expected], atol=1e-4)


@pytest.mark.parametrize("route, body, param", [
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}, "logprobs"),
    ("completions", {"prompt": "hi", "logprobs": 6}, "logprobs"),
])
def test_bad_logprobs_get_400(server, route, body, param):
    url, _ = server
    response = httpx.post(f"{url}/v1/{route}", json=body, timeout=30, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400 and response.json()["error"]["param"] == param
