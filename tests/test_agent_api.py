"""What agents send `mlx-spec serve`: tools shown to the model by its own chat template (Qwen2.5's), the calls
in its output parsed into OpenAI `tool_calls` (whole, and streamed as deltas), tool results taken back; output
constrained to a JSON schema (`response_format`); the same through Anthropic's Messages API (tool_use /
tool_result blocks, `output_format`, its stream of events). The official openai and
anthropic clients drive the real server; every answer is checked against mlx-lm's plain greedy decoding of the
same conversation as the tokenizer itself renders it, the calls read from that text by a regular expression and
json.loads."""

import importlib
import json
import re
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor

import random

import anthropic
import httpx
import jsonschema
import llguidance
import openai
import pytest
from helpers import KEY, start_server
from test_grammar import from_schema
from test_grammar import reference as constrained_reference
from tiny import build_layer_skip_draft
from tiny_tools import HELLO, TEMPLATE, TIMES, TOOLS, WEATHER

import mlx_spec
from mlx_lm.tool_parsers import json_tools
from mlx_spec.serve.tool_calls import ToolCallStream, forced_calls, tool_calls_of

TEMPLATES = TEMPLATE.parent


@pytest.fixture(scope="module")
def tool_model(tiny, tmp_path_factory):
    """The trained tool model (a shipped fixture) and a draft of its first layer."""
    model = tiny["qwen3-tools"]
    return model, build_layer_skip_draft(tmp_path_factory.mktemp("tools") / "draft", model, keep_layers=1)


@pytest.fixture(scope="module")
def api(tool_model):
    model, draft = tool_model
    proc, url = start_server(None, "--batch-size", "2", drafter=("--draft-model", str(draft)), model=model)
    yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120), str(model), url
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130


@pytest.fixture(scope="module")
def reference(tool_model):
    """messages -> (the text mlx-lm decodes greedily for them with TOOLS, the calls in it)."""
    from mlx_lm import generate, load

    model, tokenizer = load(str(tool_model[0]))

    def decode(messages):
        text = generate(model, tokenizer, tokenizer.apply_chat_template(messages, tools=TOOLS,
                                                                        add_generation_prompt=True), max_tokens=128)
        calls = [json.loads(c) for c in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)]
        return text, [(c["name"], c["arguments"]) for c in calls]
    return decode


def calls_of(tool_calls) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls or []]


def streamed(api, model, messages, **options):
    """(content, calls, finish_reason, usage) put together from the chunks as a client does."""
    content, calls, finish, usage = "", {}, None, None
    for chunk in api.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=128, stream=True,
                                             stream_options={"include_usage": True}, **options):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                assert delta.index == len(calls) and delta.id and delta.type == "function"  # each call whole
                calls[delta.index] = delta
            finish = choice.finish_reason or finish
    return content, calls_of(calls.values()), finish, usage


def test_a_tool_call_and_its_result_round_trip(api, reference):
    api, model, _ = api
    text, expected = reference(WEATHER)
    assert expected == [("get_weather", {"city": "Paris"})]  # what the tiny model learnt
    reply = api.chat.completions.create(model=model, messages=WEATHER, tools=TOOLS, max_tokens=128)
    choice = reply.choices[0]
    assert calls_of(choice.message.tool_calls) == expected and choice.message.content is None
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].id.startswith("call_")
    assert streamed(api, model, WEATHER)[1:3] == (expected, "tool_calls")

    result = [{"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "18 C, sunny"}]
    back = api.chat.completions.create(model=model, messages=[*WEATHER, choice.message.model_dump(), *result],
                                       tools=TOOLS, max_tokens=128)
    said = [*WEATHER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, *result]
    assert back.choices[0].message.content == reference(said)[0] == "It is 18 C and sunny in Paris."
    assert back.choices[0].message.tool_calls is None and back.choices[0].finish_reason == "stop"


def test_tool_choice_forces_calls_exactly(api, tool_model):
    """"required" makes the model call a tool where it would have said hello, a named function makes it call
    that one; the arguments valid for the tool's schema, the answer what plain decoding under the same grammar
    gives; the same through Anthropic's tool_choice "any"."""
    api, model, url = api
    from mlx_lm.utils import load

    tokenizer = load(str(tool_model[0]))[1]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for messages, choice in ((HELLO, "required"), (WEATHER, {"type": "function", "function": {"name": "get_time"}})):
        reply = api.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice=choice,
                                            max_tokens=128)
        calls = calls_of(reply.choices[0].message.tool_calls)
        assert calls and reply.choices[0].finish_reason == "tool_calls"
        for name, arguments in calls:
            jsonschema.validate(arguments, schemas[name])
        assert choice == "required" or {name for name, _ in calls} == {"get_time"}
        grammar = forced_calls(tokenizer, TOOLS, None if choice == "required" else "get_time")
        prompt = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
        plain = tokenizer.decode(constrained_reference(tool_model[0], prompt,
                                                       llguidance.LLMatcher.grammar_from_lark(grammar), 128))
        assert calls == [(c["name"], c["arguments"]) for c in map(
            json.loads, re.findall(r"<tool_call>\n(.*?)\n</tool_call>", plain, re.S))]
    claude = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)
    forced = claude.messages.create(model=model, max_tokens=128, messages=HELLO, tools=ANTHROPIC_TOOLS,
                                    tool_choice={"type": "any"})
    assert forced.stop_reason == "tool_use" and forced.content[0].type == "tool_use"


def test_parallel_calls_and_plain_answers_with_every_drafter(api, reference):
    """Two calls in one answer (indices 0 and 1 when streamed), a plain answer beside tools, requests sharing a
    batch; the draft model and n-gram drafting, drafts both accepted and rejected, every answer as plain decoding's."""
    api, model, _ = api
    times, hello = reference(TIMES), reference(HELLO)
    assert len(times[1]) == 2 and hello[1] == [] and hello[0] == "Hello! How can I help?"
    drafted = accepted = 0
    for drafter in ("draft-model", "ngram"):
        def ask(messages):
            return api.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=128,
                                               extra_body={"drafter": drafter})
        with ThreadPoolExecutor(2) as pool:  # concurrent: one batch
            both = list(pool.map(ask, [TIMES, HELLO]))
        assert calls_of(both[0].choices[0].message.tool_calls) == times[1]
        assert both[0].choices[0].finish_reason == "tool_calls"
        assert both[1].choices[0].message.content == hello[0] and both[1].choices[0].message.tool_calls is None
        content, calls, finish, usage = streamed(api, model, TIMES, extra_body={"drafter": drafter})
        assert (content, calls, finish) == ("", times[1], "tool_calls")
        for reply in both:
            drafted += reply.usage.model_dump()["draft_n"]
            accepted += reply.usage.model_dump()["draft_n_accepted"]
    assert 0 < accepted < drafted


@pytest.mark.parametrize("body, fragment, param", [
    ({"tools": [{"type": "function"}]}, "tools must be a list of", "tools"),
    ({"tools": "get_weather"}, "tools must be a list of", "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools",
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "not both",
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "'tool_choice' must be", "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
      "tool_choice": "required"}, "the tools' parameters cannot be used", "tool_choice"),
    ({"messages": [*WEATHER, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{city: Paris"}}]}]},
     "are not JSON", "messages"),
    ({"messages": [*WEATHER, {"role": "assistant", "tool_calls": "get_weather"}]}, "must be a list", "messages"),
])
def test_bad_tool_requests_get_openai_shaped_400s(api, body, fragment, param):
    _, _, url = api
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": WEATHER, **body}, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["param"] == param


def test_tools_need_a_chat(api):
    _, _, url = api
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "tools": TOOLS}, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"


TEXT = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n')


@pytest.mark.parametrize("text, content, calls", [
    (TEXT, "Let me look.", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ("a <tool_call>{not json}</tool_call> b", "a <tool_call>{not json}</tool_call> b", []),  # kept as it came
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}', "", [("f", {"x": 1})]),  # cut short, but whole
    ("a < b <tool_ca", "a < b <tool_ca", []),  # the start of a marker that never came
    ("Hi! \n", "Hi! \n", []),  # text alone, as it came
])
def test_the_stream_finds_calls_however_the_text_is_cut(text, content, calls):
    for size in (1, 2, 5, len(text)):
        stream = ToolCallStream(json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call,
                                TOOLS)
        pieces = [p for i in range(0, len(text), size) for p in stream.feed(text[i:i + size])] + stream.close()
        assert "".join(p for p in pieces if isinstance(p, str)) == content
        assert [(p["function"]["name"], json.loads(p["function"]["arguments"])) for p in pieces
                if isinstance(p, dict)] == calls


FAMILIES = {  # mlx-lm's parser module: a family's answer with two calls, as its chat template teaches it
    "json_tools": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                  '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call>',  # Qwen 2.5 / 3
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                   "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=timezone>\nCET\n</parameter>\n"
                   "</function>\n</tool_call>",  # Qwen3.5 / 3.6, Qwen3-Coder
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
              '<|tool_call>call:get_time{timezone:<|"|>CET<|"|>}<tool_call|>',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}get_time[ARGS]{"timezone": "CET"}',
    "glm47": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
             "<tool_call>get_time\n<arg_key>timezone</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>",
    "pythonic": '<|tool_call_start|>[get_weather(city="Paris"), get_time(timezone="CET")]<|tool_call_end|>',
}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_calls_are_found_as_its_text_streams(family):
    """Each family's format through its own mlx-lm parser (what `compat.tool_call_format` picks from the chat
    template), the answer cut into pieces of every size: the text before it kept, both calls found."""
    parser = importlib.import_module(f"mlx_lm.tool_parsers.{family}")
    text = "Checking.\n" + FAMILIES[family]
    for size in (1, 3, len(text)):
        stream = ToolCallStream(parser.tool_call_start, parser.tool_call_end, parser.parse_tool_call, TOOLS)
        pieces = [p for i in range(0, len(text), size) for p in stream.feed(text[i:i + size])] + stream.close()
        assert "".join(p for p in pieces if isinstance(p, str)) == "Checking.", (family, size)
        assert [(p["function"]["name"], json.loads(p["function"]["arguments"])) for p in pieces
                if isinstance(p, dict)] == [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "CET"})]


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.mark.parametrize("text, content, calls", [
    (LLAMA_CALL, "", [("get_weather", {"city": "Paris"})]),
    ("\n<|python_tag|>" + LLAMA_CALL + "; " + LLAMA_CALL.replace("Paris", "Lyon"), "",
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon"})]),
    ("Paris is sunny {today}.", "Paris is sunny {today}.", []),  # an answer in words streams as it comes
    ('{"name": "get_weather", "param', '{"name": "get_weather", "param', []),  # cut short: kept as text
])
def test_llama3_answers_that_are_calls_are_found(tiny, tmp_path, text, content, calls):
    """Llama 3.1's template (tests/chat_templates/llama3.1-json.jinja, after Meta's documented format: mlx-lm
    has no parser for it) renders the tools, and an answer that is a bare {"name", "parameters"} call, or several,
    is found however the text is cut; other answers are content."""
    path = shutil.copytree(tiny["llama"], tmp_path / "llama")
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = (TEMPLATES / "llama3.1-json.jinja").read_text()
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = mlx_spec.load(str(path), drafter="off").tokenizer
    rendered = tokenizer.decode(mlx_spec.render_prompt(tokenizer, WEATHER, tools=TOOLS))
    assert "Environment: ipython" in rendered and '"name": "get_weather"' in rendered
    for size in (1, 4, len(text)):
        stream = tool_calls_of(tokenizer, TOOLS)
        pieces = [p for i in range(0, len(text), size) for p in stream.feed(text[i:i + size])] + stream.close()
        assert "".join(p for p in pieces if isinstance(p, str)) == content, size
        assert [(p["function"]["name"], json.loads(p["function"]["arguments"])) for p in pieces
                if isinstance(p, dict)] == calls


ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


@pytest.fixture(scope="module")
def claude(api):
    _, model, url = api
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120), model


def test_anthropic_messages_tool_use_and_result(api, claude, reference):
    client, model = claude
    expected = reference(WEATHER)[1]
    reply = client.messages.create(model=model, max_tokens=128, messages=WEATHER, tools=ANTHROPIC_TOOLS)
    assert reply.type == "message" and reply.role == "assistant" and reply.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in reply.content] == [("tool_use", *expected[0])]
    assert reply.content[0].id.startswith("toolu_")
    usage, same = reply.usage.model_dump(), api[0].chat.completions.create(
        model=model, messages=WEATHER, tools=TOOLS, max_tokens=128).usage.model_dump()  # the OpenAI route's
    assert (usage["input_tokens"], usage["output_tokens"]) == (same["prompt_tokens"], same["completion_tokens"])
    assert "cache_read_input_tokens" in usage and "prompt_tokens_details" not in usage
    assert usage["drafter"] == "draft-model" and usage["draft_n"] >= usage["draft_n_accepted"] >= 0

    with client.messages.stream(model=model, max_tokens=128, messages=WEATHER, tools=ANTHROPIC_TOOLS) as events:
        kinds = [e.type for e in events]
        final = events.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == [("tool_use", *expected[0])]
    assert final.stop_reason == "tool_use" and kinds[0] == "message_start" and kinds[-1] == "message_stop"

    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply.content[0].id,
                                           "content": "18 C, sunny"}]}
    back = client.messages.create(model=model, max_tokens=128, tools=ANTHROPIC_TOOLS, messages=[
        *WEATHER, {"role": "assistant", "content": [b.model_dump() for b in reply.content]}, result])
    openai_said = [*WEATHER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C, sunny"}]
    assert [b.text for b in back.content] == [reference(openai_said)[0]] and back.stop_reason == "end_turn"


def test_anthropic_text_streams_and_stop_sequences(claude, reference):
    client, model = claude
    hello = reference(HELLO)[0]
    with client.messages.stream(model=model, max_tokens=128, messages=HELLO, tools=ANTHROPIC_TOOLS) as events:
        assert "".join(events.text_stream) == hello
    cut = client.messages.create(model=model, max_tokens=128, messages=HELLO, stop_sequences=["nope", "help"],
                                 tools=ANTHROPIC_TOOLS, system="")
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "help"
    assert cut.content[0].text == hello[:hello.index("help")]
    short = client.messages.create(model=model, max_tokens=2, messages=HELLO, tools=ANTHROPIC_TOOLS)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


@pytest.mark.parametrize("body, status, kind, fragment", [
    ({"messages": WEATHER}, 400, "invalid_request_error", "'max_tokens' is required"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error", "parts of type 'image_url' are not supported: this model reads text only"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error", "'system'"),
    ({"max_tokens": 8, "messages": WEATHER, "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "x"}},
     400, "invalid_request_error", "not among the tools"),
    ({"max_tokens": 8, "messages": WEATHER, "model": "claude-x"}, 404, "not_found_error", "not found"),
])
def test_bad_anthropic_requests_get_anthropic_shaped_errors(api, body, status, kind, fragment):
    _, _, url = api
    response = httpx.post(f"{url}/v1/messages", json=body, timeout=30, headers={"x-api-key": KEY})
    assert response.status_code == status, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind and fragment in error["error"]["message"]


def test_anthropic_needs_the_key(claude):
    client, model = claude
    with pytest.raises(anthropic.AuthenticationError):
        client.with_options(api_key="wrong").messages.create(model=model, max_tokens=8, messages=HELLO)


VALUES = [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "boolean"}, {"enum": ["red", "green", "blue"]},
          {"type": "string", "maxLength": 8}, {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                          "maximum": 99}, "maxItems": 3},
          {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"],
           "additionalProperties": False}]


def schemas(count: int) -> list[dict]:
    """`count` objects of one to four required fields of the VALUES kinds, drawn from a fixed seed."""
    draw, names = random.Random(7), ["id", "name", "ok", "color", "tags", "size", "point", "note"]
    out = []
    for _ in range(count):
        fields = draw.sample(names, draw.randint(1, 4))
        out.append({"type": "object", "properties": {f: draw.choice(VALUES) for f in fields}, "required": fields,
                    "additionalProperties": False})
    return out


def test_json_schema_output_validates_and_equals_plain_constrained_decoding(api, tool_model):
    """20 schemas and prompts, each answer valid JSON of its schema; every answer, with the draft model, with
    n-gram and streamed, equal to plain constrained greedy decoding of the same conversation."""
    api, model, _ = api
    from mlx_lm.utils import load

    tokenizer = load(str(tool_model[0]))[1]
    drafted = accepted = 0
    for i, schema in enumerate(schemas(20)):
        messages = [{"role": "user", "content": f"Describe item {i} as JSON."}]
        shape = {"type": "json_schema", "json_schema": {"name": f"item{i}", "schema": schema, "strict": True}}
        drafter = ("draft-model", "ngram")[i % 2]
        reply = api.chat.completions.create(model=model, messages=messages, response_format=shape, max_tokens=160,
                                            extra_body={"drafter": drafter})
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
        usage = reply.usage.model_dump()
        drafted, accepted = drafted + usage["draft_n"], accepted + usage["draft_n_accepted"]
        if i < 4:
            prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            plain = constrained_reference(tool_model[0], prompt, from_schema(schema), 160)
            assert reply.choices[0].message.content == tokenizer.decode(plain[:-1])  # the end token not shown
            chunks = api.chat.completions.create(model=model, messages=messages, response_format=shape,
                                                 max_tokens=160, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == tokenizer.decode(
                plain[:-1])
    assert 0 < accepted < drafted


def test_json_object_and_anthropic_output_format(api, claude):
    (api, model, _), (client, _) = api, claude
    reply = api.chat.completions.create(model=model, messages=HELLO, response_format={"type": "json_object"},
                                        max_tokens=120)
    assert reply.choices[0].finish_reason in ("stop", "length")
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:
        assert reply.choices[0].message.content.startswith("{")
    schema = schemas(1)[0]
    answer = client.messages.create(model=model, max_tokens=160, messages=HELLO,
                                    extra_body={"output_format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(answer.content[0].text), schema)
    digits = api.chat.completions.create(model=model, messages=HELLO, max_tokens=12,
                                         response_format={"type": "regex", "regex": "[0-9]{3}-[0-9]{4}"})
    assert re.fullmatch("[0-9]{3}-[0-9]{4}", digits.choices[0].message.content)


@pytest.mark.parametrize("shape, fragment", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}, "cannot be used"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs {\"json_schema\""),
    ({"type": "json_schema", "json_schema": "x"}, "needs {\"json_schema\""),
    ({"type": "yaml"}, "'response_format' must be"),
    ({"type": "regex", "regex": "("}, "the regex cannot be used"),
])
def test_bad_response_formats_get_400(api, shape, fragment):
    _, _, url = api
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": HELLO, "response_format": shape},
                          timeout=30, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["param"] == "response_format"
