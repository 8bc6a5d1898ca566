"""`GET /metrics` of a real server on localhost, parsed with prometheus-client's own parser: what it counts equals
what the responses to real clients said (their usage), request by request, after chats, a completion, a returning
chat served by the prompt cache, a bad request and an unauthorized one."""

import signal

import httpx
import pytest
from helpers import KEY, start_server
from prometheus_client.parser import text_string_to_metric_families
from test_server import client


@pytest.fixture
def server(tiny):
    proc, url = start_server(tiny, "--prompt-cache-gb", "1", "--num-draft", "3")  # pinned: a busy CPU does not
    # turn drafting off, or shorten it, so every draft position is counted
    yield url, str(tiny["qwen3-long"])
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130


def scrape(url: str) -> dict:
    """Every sample: (name, sorted label items) -> value."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text.text) for sample in family.samples}


def total(samples: dict, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(value for (sample, items), value in samples.items()
               if sample == name and set(labels.items()) <= set(items))


def test_metrics_count_what_the_responses_said(server):
    url, model = server
    api = client(url)
    chat = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    first = api.chat.completions.create(model=model, messages=chat, max_tokens=16)
    returning = chat + [{"role": "assistant", "content": first.choices[0].message.content},
                        {"role": "user", "content": "And one that multiplies them."}]
    replies = [first, api.chat.completions.create(model=model, messages=returning, max_tokens=20),
               api.completions.create(model=model, prompt="def add(a, b):", max_tokens=12)]
    usages = [reply.usage.model_dump() for reply in replies]
    bad = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": -1},
                     headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert bad.status_code == 400
    assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401  # behind the API key as the rest

    samples = scrape(url)
    assert total(samples, "mlx_spec_requests_total", route="/v1/chat/completions", status="200") == 2
    assert total(samples, "mlx_spec_requests_total", route="/v1/completions", status="200") == 1
    assert total(samples, "mlx_spec_requests_total", route="/v1/completions", status="400") == 1
    assert total(samples, "mlx_spec_requests_total", route="/v1/models", status="401") == 1
    assert total(samples, "mlx_spec_generations_total") == 3
    assert total(samples, "mlx_spec_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert total(samples, "mlx_spec_generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert cached[1] > 0 and total(samples, "mlx_spec_cached_prompt_tokens_total") == sum(cached)
    assert total(samples, "mlx_spec_prompt_cache_hits_total") == sum(c > 0 for c in cached)
    assert total(samples, "mlx_spec_draft_tokens_total", drafter="draft-model") == sum(u["draft_n"] for u in usages)
    assert total(samples, "mlx_spec_accepted_draft_tokens_total", drafter="draft-model") == \
        sum(u["draft_n_accepted"] for u in usages) > 0
    first_position = total(samples, "mlx_spec_draft_tokens_total", position="1")
    assert first_position >= total(samples, "mlx_spec_draft_tokens_total", position="2") > 0
    assert total(samples, "mlx_spec_accepted_draft_tokens_total", position="1") <= first_position
    assert total(samples, "mlx_spec_time_to_first_token_seconds_count") == 3
    assert total(samples, "mlx_spec_time_per_output_token_seconds_count") == 3
    assert total(samples, "mlx_spec_queue_depth") == 0 and total(samples, "mlx_spec_batch_rows") == 0
    assert total(samples, "mlx_spec_prompt_cache_bytes") > 0 and total(samples, "mlx_spec_memory_active_bytes") > 0
