"""The server's sampling against the target alone: every sampling field and penalty of a request, one at a time,
alone and as a row of a batch, and sampled requests on every route (chat, completions, Anthropic's messages,
streamed and not) equal mlx-lm's model decoding with mlx-lm's own logits processors and, when sampled, each
position's draw by the seed (`helpers.plain_sampled`), token for token."""

import signal
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import pytest
from helpers import KEY, chat_ids, loaded, mlx_lm_text, plain_decoded, start_server

TEXT = "for i in range(10):\n    print(i)\n" * 3  # n-gram drafts of it are sometimes drawn
CHAT = [{"role": "user", "content": TEXT}]
MAX_TOKENS = 24
PINNED = {"num_draft": 3}  # drafts whatever the clock says: the adaptive policy, timing a busy machine, may not
# One field at a time, each beside what it is compared without, and each changing the answer there: greedy
# requests draft with the default drafter (the draft model), sampled ones with one-hot n-gram drafts (so that a seed
# draws plain sampling's tokens whatever is drafted).
SAMPLED_ALONE = {"temperature": 0.9, "seed": 4}
REPEATING = {"repetition_penalty": 1.8}
FIELDS = [  # (the request's fields, the same without the field under test)
    (SAMPLED_ALONE, {}),
    ({**SAMPLED_ALONE, "top_p": 0.5}, SAMPLED_ALONE),
    ({**SAMPLED_ALONE, "top_k": 3}, SAMPLED_ALONE),
    ({**SAMPLED_ALONE, "min_p": 0.3}, SAMPLED_ALONE),
    ({**SAMPLED_ALONE, "frequency_penalty": 1.0}, {**SAMPLED_ALONE, "presence_penalty": 1.0}),  # counts, not presence
    ({**SAMPLED_ALONE, "presence_penalty": 1.0}, SAMPLED_ALONE),
    (REPEATING, {}),
    ({"presence_penalty": 1.5}, {}),
    ({"frequency_penalty": 1.2}, {}),
    ({**REPEATING, "penalty_window": 4}, REPEATING),
]


@pytest.fixture(scope="module")
def server(tiny):
    proc, url = start_server(tiny, "--batch-size", "4")
    yield url, str(tiny["qwen3-long"])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def openai_client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)


def expected_text(path, ids, fields) -> tuple[str, int]:
    """The target alone under `fields`: its text as mlx-lm writes it (without the end token) and its token count."""
    tokenizer = loaded(str(path))[1]
    tokens = plain_decoded(path, ids, MAX_TOKENS, **{k: v for k, v in fields.items() if k != "drafter"})
    return mlx_lm_text(tokenizer, tokens[:-1] if tokens[-1] in tokenizer.eos_token_ids else tokens), len(tokens)


def request_fields(fields: dict) -> tuple[dict, dict]:
    """(OpenAI's own arguments, mlx-spec's in extra_body), pinned, with n-gram drafts where a request samples."""
    own = {k: v for k, v in fields.items() if k in ("temperature", "top_p", "seed", "presence_penalty",
                                                    "frequency_penalty")}
    extra = {k: v for k, v in fields.items() if k not in own}
    return own, {**extra, **PINNED, "drafter": "ngram"} if fields.get("temperature") else {**extra, **PINNED}


def ask_chat(url, model, fields) -> tuple[str, dict]:
    own, extra = request_fields(fields)
    answer = openai_client(url).chat.completions.create(model=model, messages=CHAT, max_tokens=MAX_TOKENS,
                                                        extra_body=extra, **own)
    return answer.choices[0].message.content, answer.usage.model_dump()


def test_every_sampling_field_alone_and_as_a_batch_row_is_the_target_alone(server, tiny):
    url, model = server
    path, requests = tiny["qwen3-long"], [fields for fields, _ in FIELDS]
    ids = chat_ids(path, CHAT)
    expected = [expected_text(path, ids, fields) for fields in requests]
    assert all(text != expected_text(path, ids, without)[0] for (text, _), (_, without) in zip(expected, FIELDS))
    alone = [ask_chat(url, model, fields) for fields in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda fields: ask_chat(url, model, fields), requests))
    for fields, (text, count), answers in zip(requests, expected, zip(alone, together)):
        for answer, usage in answers:
            assert (answer, usage["completion_tokens"]) == (text, count), fields
    assert {usage["batch_size"] for _, usage in alone} == {1} and max(u["batch_size"] for _, u in together) > 1
    usages = [usage for _, usage in alone + together]
    assert 0 < sum(u["draft_n_accepted"] for u in usages) < sum(u["draft_n"] for u in usages)


SAMPLED = {"temperature": 0.7, "top_p": 0.9, "seed": 3}  # a seed whose draws some n-gram drafts match


def route_requests(url, model) -> list:
    """Sampled requests with n-gram drafts on each route: chat and completions, streamed and not, and Anthropic's
    messages (temperature and top_p, and mlx-spec's seed and drafter), streamed and not; each returns (its text,
    its usage where the answer reports mlx-spec's)."""
    api, extra = openai_client(url), {**PINNED, "drafter": "ngram"}
    claude = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    chat = dict(model=model, messages=CHAT, max_tokens=MAX_TOKENS, extra_body=extra, **SAMPLED)
    text = dict(model=model, prompt=TEXT, max_tokens=MAX_TOKENS, extra_body=extra, **SAMPLED)
    # the anthropic client (2.x) has no sampling arguments of its own: the fields go in the body, as its API reads
    message = dict(model=model, messages=CHAT, max_tokens=MAX_TOKENS, extra_body={**SAMPLED, **extra})

    def chat_whole():
        answer = api.chat.completions.create(**chat)
        return answer.choices[0].message.content, answer.usage.model_dump()

    def chat_streamed():
        chunks = api.chat.completions.create(**chat, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), None

    def text_whole():
        answer = api.completions.create(**text)
        return answer.choices[0].text, answer.usage.model_dump()

    def text_streamed():
        return "".join(c.choices[0].text for c in api.completions.create(**text, stream=True)), None

    def message_whole():
        answer = claude.messages.create(**message)
        return "".join(block.text for block in answer.content if block.type == "text"), None

    def message_streamed():
        with claude.messages.stream(**message) as stream:
            return "".join(stream.text_stream), None

    return [chat_whole, chat_streamed, text_whole, text_streamed, message_whole, message_streamed]


def test_sampled_requests_on_every_route_alone_and_in_a_batch_are_the_target_alone(server, tiny):
    """The same seed draws the target's own tokens on every route, one request at a time and all at once (rows
    of one batch, each with its own keys)."""
    url, model = server
    path = tiny["qwen3-long"]
    chat, _ = expected_text(path, chat_ids(path, CHAT), SAMPLED)
    raw, _ = expected_text(path, loaded(str(path))[1].encode(TEXT), SAMPLED)
    assert chat != expected_text(path, chat_ids(path, CHAT), {})[0]  # the sampled answer is not the greedy one
    expected = [chat, chat, raw, raw, chat, chat]
    requests = route_requests(url, model)
    alone = [request() for request in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda request: request(), requests))
    assert [text for text, _ in alone] == expected and [text for text, _ in together] == expected
    usages = [(usage, batch) for batch, answers in ((False, alone), (True, together)) for _, usage in answers if usage]
    assert {u["batch_size"] for u, batch in usages if not batch} == {1}
    assert max(u["batch_size"] for u, batch in usages if batch) > 1
    assert 0 < sum(u["draft_n_accepted"] for u, _ in usages) < sum(u["draft_n"] for u, _ in usages)
