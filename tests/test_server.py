"""`mlx-spec serve`: the real server in a subprocess on a free localhost port, driven by the official `openai`
client and by plain HTTP."""

import json
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from helpers import (KEY, PROMPT, assert_one_line_error, chat_ids, loaded, plain_greedy, plain_text, run_cli,
                     start_server)

LONG = 100_000  # tokens: minutes of generation, cut short by the test (qwen3-long's context holds them)
LONG_PROMPT = [7] * 30_000  # token ids whose prefill takes minutes on the tiny model
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny):
    proc, url = start_server(tiny)
    yield url, str(tiny["qwen3-long"])
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130  # Ctrl+C: as every command


def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_chat_and_completions_through_the_openai_client(server):
    url, model = server
    api = client(url)
    assert [m.id for m in api.models.list()] == [model]
    chat = api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=24)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.choices[0].message.content == plain_text(model, chat_ids(model, HI), 24)
    usage = chat.usage.model_dump()
    assert usage["completion_tokens"] == 24 or chat.choices[0].finish_reason == "stop"
    assert usage["drafter"] == "draft-model" and usage["draft_n"] >= usage["draft_n_accepted"] >= 0
    assert {"acceptance_rate", "mean_acceptance_length"} <= set(usage)
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]  # OpenAI's content parts
    assert api.chat.completions.create(model=model, messages=[{"role": "user", "content": parts}],
                                       max_tokens=24).choices[0].message.content == chat.choices[0].message.content
    health = httpx.get(f"{url}/health", timeout=30).json()
    assert health["context_length"] == 131072 and health["max_tokens"] == 512
    assert api.models.list().data[0].model_dump()["max_model_len"] == 131072

    streamed = list(api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=24, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == chat.choices[0].message.content
    assert streamed[-1].choices == [] and streamed[-1].usage.completion_tokens == usage["completion_tokens"]

    text = api.completions.create(model=model, prompt=PROMPT, max_tokens=40, temperature=0)
    assert text.object == "text_completion" and text.choices[0].finish_reason == "length"
    assert text.choices[0].text == plain_text(model, loaded(model)[1].encode(PROMPT), 40)
    assert text.usage.model_dump()["draft_n_accepted"] > 0  # the layer-skip draft is often right here
    pieces = list(api.completions.create(model=model, prompt=PROMPT, max_tokens=40, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == text.choices[0].text
    sampled = api.completions.create(model=model, prompt=PROMPT, max_tokens=20, temperature=0.8, top_p=0.9, seed=3,
                                     extra_body={"top_k": 20, "drafter": "ngram", "num_draft": 3})
    assert sampled.usage.model_dump()["drafter"] == "ngram"
    assert sampled.choices[0].text == plain_text(model, loaded(model)[1].encode(PROMPT), 20, temperature=0.8,
                                                 top_p=0.9, top_k=20, seed=3)  # one-hot drafts: the seed's draws


def test_concurrent_clients_get_their_own_answers(server):
    url, model = server
    api = client(url)
    prompts = [f"{PROMPT}# {i}\n" for i in range(8)]

    def ask(prompt):
        answer = api.completions.create(model=model, prompt=prompt, max_tokens=12)
        return answer.choices[0].text, answer.usage.model_dump()["batch_size"]

    expected = [plain_text(model, loaded(model)[1].encode(prompt), 12) for prompt in prompts]
    alone = [ask(p) for p in prompts]
    assert [text for text, _ in alone] == expected and {size for _, size in alone} == {1}  # one at a time
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, prompts * 3))
    assert [text for text, _ in answers] == expected * 3
    assert max(size for _, size in answers) > 1  # they were decoded together (the server's default batch)


def test_pinned_requests_share_a_batch_each_with_its_own_draft_length(server):
    """Concurrent requests pinning different draft lengths (none, 1, 3, or the policy's) decode together, each the
    target's own greedy answer, and each row drafts as it does alone with its pin: the same drafted and accepted
    counts."""
    url, model = server
    api, pins = client(url), [0, 1, 3, None] * 2

    def ask(i):
        answer = api.completions.create(model=model, prompt=f"{PROMPT}# {i}\n", max_tokens=16,
                                        extra_body={} if pins[i] is None else {"num_draft": pins[i]})
        return answer.choices[0].text, answer.usage.model_dump()

    alone = [ask(i) for i in range(len(pins))]
    with ThreadPoolExecutor(len(pins)) as pool:
        together = list(pool.map(ask, range(len(pins))))
    expected = [plain_text(model, loaded(model)[1].encode(f"{PROMPT}# {i}\n"), 16) for i in range(len(pins))]
    assert [text for text, _ in together] == expected and [text for text, _ in alone] == expected
    assert max(usage["batch_size"] for pin, (_, usage) in zip(pins, together) if pin is not None) > 1
    for pin, (_, usage), (_, usage_alone) in zip(pins, together, alone):
        if pin is not None:
            assert (usage["draft_n"], usage["draft_n_accepted"]) == (usage_alone["draft_n"],
                                                                     usage_alone["draft_n_accepted"]), pin
    assert all(usage["draft_n"] == 0 for pin, (_, usage) in zip(pins, together) if pin == 0)
    assert any(usage["draft_n_accepted"] > 0 for _, usage in together)


def test_a_batch_size_of_one_decodes_one_at_a_time(tiny):
    proc, url = start_server(tiny, "--batch-size", "1")
    try:
        api = client(url)
        with ThreadPoolExecutor(4) as pool:
            model = str(tiny["qwen3-long"])
            sizes = list(pool.map(lambda i: api.completions.create(model=model, prompt=f"{PROMPT}{i}", max_tokens=8)
                                  .usage.model_dump()["batch_size"], range(4)))
        assert sizes == [1] * 4
        first = [{"role": "user", "content": "hi"}]
        reply = api.chat.completions.create(model=model, messages=first, max_tokens=8)
        turn = [*first, {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "more"}]
        again = api.chat.completions.create(model=model, messages=turn, max_tokens=8).usage
        # the next turn reuses the first's prompt and answer (all but the end-of-turn token it may not have made)
        assert again.prompt_tokens_details.cached_tokens >= reply.usage.prompt_tokens + 8 - 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_a_client_that_goes_away_frees_the_server(server):
    url, model = server
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{url}/v1/completions", headers=headers, timeout=60,
                      json={"model": model, "prompt": PROMPT, "max_tokens": LONG, "stream": True}) as response:
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    # the long generation stops at its next round: the next request is answered, not queued behind it
    answer = client(url).completions.create(model=model, prompt="def f", max_tokens=4, timeout=60)
    assert answer.usage.completion_tokens == 4


@pytest.mark.parametrize("body,status,fragment,param", [
    (b"{not json", 400, "not valid JSON", None),
    ({"messages": HI, "n": 2}, 400, "'n' must be 1", "n"),
    ({"messages": HI, "model": "gpt-4"}, 404, "model 'gpt-4' not found", "model"),
    ({"messages": "hi"}, 400, "'messages'", "messages"),
    ({"messages": HI, "temperature": -1}, 400, "temperature must be 0 (greedy) or between", "temperature"),
    ({"messages": HI, "top_p": 2}, 400, "top_p must be in [1e-06, 1] (1 disables it), got 2.0", "top_p"),
    ({"messages": HI, "max_tokens": 0}, 400, "'max_tokens'", "max_tokens"),
    ({"messages": HI, "max_tokens": 200_000}, 400, "more than the model's context of 131072", "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], }, 400,
     "parts of type 'image_url' are not supported", "messages"),
    ({"messages": HI, "drafter": "eagle"}, 400, "'drafter' must be one of", "drafter"),
    ({"messages": HI, "num_draft": 99}, 400, "draft length", "num_draft"),
    ({"messages": HI, "stream": "yes"}, 400, "'stream'", "stream"),
    ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "this model's chat template has no tool calling", "tools"),
])
def test_bad_requests_get_openai_shaped_errors(server, body, status, fragment, param):
    url, _ = server
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{url}/v1/chat/completions", content=content, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and error["param"] == param and {"type", "code"} <= set(error)


@pytest.mark.parametrize("prompt", [[1, 2, 10**9], [-1], [], ""])
def test_bad_completion_prompts_get_400(server, prompt):
    url, _ = server
    response = httpx.post(f"{url}/v1/completions", json={"prompt": prompt}, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


def test_a_long_prompt_does_not_starve_short_requests(server):
    """A prompt whose prefill takes minutes runs in chunks between the rounds of requests that come after it."""
    url, model = server
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{url}/v1/completions", headers=headers, timeout=60,
                      json={"model": model, "prompt": LONG_PROMPT, "max_tokens": 4, "stream": True}) as long:
        assert long.status_code == 200
        time.sleep(2)  # its prefill under way
        answer = client(url).completions.create(model=model, prompt="def f", max_tokens=4, timeout=60)
        assert answer.usage.completion_tokens == 4  # while the long prompt (minutes of prefill) is still running
    # gone: its prefill stops at the next chunk


def test_mlx_spec_routes_stream_the_engine_events(server):
    """mlx-spec's own stream (what `mlx-spec chat --server` reads): a start with the job's id, the rounds, the
    tokens with their origin, and a done with the statistics and the server's memory."""
    url, model = server
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": PROMPT, "max_tokens": 30, "draft_len": 3}
    with httpx.stream("POST", f"{url}/mlx-spec/v1/generate", json=body, headers=headers, timeout=120) as response:
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[0]["type"] == "start" and events[-1]["type"] == "done"
    rounds = [e for e in events if e["type"] == "round"]
    tokens = [e for e in events if e["type"] == "token"]
    assert rounds and all(r["draft_len"] <= 3 for r in rounds) and sum(t["from_draft"] for t in tokens) > 0
    done = events[-1]
    assert done["tokens"] == [t["id"] for t in tokens] and done["stats"]["rounds"] == len(rounds)
    assert done["memory"]["weights"] > 0 and done["memory"]["pressure"] in ("normal", "warn", "critical")
    assert done["tokens"] == plain_greedy(model, loaded(model)[1].encode(PROMPT), 30)
    status = httpx.get(f"{url}/mlx-spec/v1/status", params={"drafter": "ngram"}, headers=headers, timeout=120).json()
    assert status["drafter"] == "ngram" and "off" in status["drafters"] and status["sampling"]["temperature"] == 0


@pytest.mark.parametrize("method,path,body,status,fragment", [
    ("POST", "/mlx-spec/v1/jobs/nope", {"stop": True}, 404, "no generation 'nope'"),
    ("POST", "/mlx-spec/v1/jobs/nope", {"draft_len": 99}, 400, "draft length"),
    ("POST", "/mlx-spec/v1/jobs/nope", {"stop": 1}, 400, "'stop' must be true"),
    ("POST", "/mlx-spec/v1/jobs/nope", {"speed": 2}, 400, "unknown field 'speed'"),
    ("GET", "/mlx-spec/v1/status?drafter=eagle", None, 400, "'drafter' must be one of"),
    ("POST", "/mlx-spec/v1/generate", {"messages": []}, 400, "'messages'"),
    ("POST", "/mlx-spec/v1/generate", {"prompt": "x", "draft_len": -1}, 400, "'draft_len'"),
])
def test_bad_requests_to_the_mlx_spec_routes(server, method, path, body, status, fragment):
    url, _ = server
    response = httpx.request(method, f"{url}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"},
                             timeout=30)
    assert response.status_code == status and fragment in response.json()["error"]["message"]
    assert httpx.request(method, f"{url}{path}", json=body, timeout=30).status_code == 401


def test_authentication_and_unknown_routes(server):
    url, model = server
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, timeout=30)
    assert response.status_code == 401 and "API key" in response.json()["error"]["message"]
    response = httpx.get(f"{url}/v1/nothing", timeout=30)
    assert response.status_code == 404 and response.json()["error"]["message"]
    assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"  # no key needed


def test_queue_full_and_shutdown_with_requests_in_flight(tiny):
    proc, url = start_server(tiny, "--max-queue", "1", "--batch-size", "1")  # a second request waits
    model, headers = str(tiny["qwen3-long"]), {"Authorization": f"Bearer {KEY}"}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", headers=headers, timeout=120,
                          json={"model": model, "prompt": PROMPT, "max_tokens": LONG, "stream": True}) as running:
            lines = running.iter_lines()
            assert next(lines).startswith("data: ")  # generating
            waiting = {}
            thread = threading.Thread(target=lambda: waiting.update(response=httpx.post(
                f"{url}/v1/completions", headers=headers, timeout=120, json={"model": model, "prompt": "x"})))
            thread.start()
            for _ in range(1200):  # until the second request waits in the queue
                if httpx.get(f"{url}/health", timeout=30).json()["waiting"] >= 1:
                    break
                time.sleep(0.1)
            full = httpx.post(f"{url}/v1/completions", headers=headers, json={"model": model, "prompt": "y"},
                              timeout=30)
            assert full.status_code == 503 and full.headers["retry-after"]
            assert "busy" in full.json()["error"]["message"]
            proc.send_signal(signal.SIGTERM)  # shut down with one request running and one waiting
            rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]" and "shutting down" in rest[-2]
            thread.join(60)
            assert waiting["response"].status_code == 503
        assert proc.wait(timeout=60) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("batch_size", ["1", "4"])  # one at a time, and in a batch
def test_a_request_past_the_timeout_ends_with_504(tiny, batch_size):
    """Also in its prefill: a prompt whose prefill would take minutes ends at the timeout."""
    proc, url = start_server(tiny, "--timeout", "2", "--batch-size", batch_size)
    try:
        response = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                              json={"prompt": PROMPT, "max_tokens": LONG})
        assert response.status_code == 504 and "--timeout of 2 s" in response.json()["error"]["message"]
        response = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                              json={"prompt": LONG_PROMPT, "max_tokens": 4})
        assert response.status_code == 504 and "--timeout of 2 s" in response.json()["error"]["message"]
        answer = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                            json={"prompt": PROMPT, "max_tokens": 4})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_sigterm_during_a_long_prefill_ends_quietly(tiny):
    proc, url = start_server(tiny)
    answers = {}
    thread = threading.Thread(target=lambda: answers.update(response=httpx.post(
        f"{url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
        json={"prompt": LONG_PROMPT, "max_tokens": 4})))
    thread.start()
    time.sleep(2)  # its prefill under way, minutes from its end
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == 0
        thread.join(timeout=60)
        assert answers["response"].status_code == 503 and "shutting down" in answers["response"].text
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr and "terminate called" not in stderr, stderr
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_serve_refuses_bad_options(tiny):
    proc = run_cli("serve", "--model", str(tiny["qwen3"]), "--port", "70000")
    assert proc.returncode == 2 and "--port must be from 0 to 65535" in proc.stderr
    proc = run_cli("serve", "--model", str(tiny["qwen3"]), "--prompt-cache-gb", "-1")
    assert_one_line_error(proc, "--prompt-cache-gb must be a number of GB >= 0, got -1.0")
    with socket.socket() as taken:  # a port in use: refused before the model loads
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = run_cli("serve", "--model", str(tiny["qwen3"]), "--port", str(taken.getsockname()[1]))
    assert_one_line_error(proc, "cannot listen on 127.0.0.1:", "choose another --port")
    assert "drafter:" not in proc.stderr
