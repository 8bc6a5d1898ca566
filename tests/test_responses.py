"""OpenAI's Responses API on `mlx-spec serve`, driven by the official openai client (`responses.create`,
`responses.stream`, `responses.retrieve`) as Codex and the Agents SDK use it: function tools, their calls and
outputs, `previous_response_id` through the prompt cache, `text.format` JSON schemas, stored responses. Every
answer is checked against mlx-lm's plain decoding of the same conversation as the tokenizer renders it (greedy,
sampled for the seed, constrained by llguidance), with the server drafting with a draft model."""

import json

import httpx
import jsonschema
import openai
import pytest
from helpers import KEY, chat_ids, loaded, plain_text
from test_agent_api import api, reference, schemas, tool_model  # noqa: F401  (the tool model's server)
from test_grammar import from_schema
from test_grammar import reference as constrained_reference
from tiny_tools import HELLO, TOOLS, WEATHER

FUNCTIONS = [{"type": "function", **tool["function"]} for tool in TOOLS]  # the Responses API's shape


def calls_in(response) -> list[tuple[str, dict]]:
    return [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]


def streamed(client, **request):
    """(the event types in order, the final response) as the client's stream helper puts them together."""
    with client.responses.stream(**request) as stream:
        kinds = [event.type for event in stream]
        return kinds, stream.get_final_response()


def test_a_codex_like_exchange_of_calls_and_outputs(api, reference):  # noqa: F811
    """A call, its output sent back by previous_response_id (the stored conversation's tokens from the prompt
    cache), then the whole exchange sent again as items, streamed, unstored: each answer mlx-lm's greedy one."""
    client, model, _ = api
    _, expected = reference(WEATHER)
    first = client.responses.create(model=model, input=WEATHER[0]["content"], tools=FUNCTIONS, max_output_tokens=128)
    call = next(item for item in first.output if item.type == "function_call")
    assert calls_in(first) == expected and first.status == "completed" and first.output_text == ""
    rendered = loaded(model)[1].apply_chat_template(WEATHER, tools=TOOLS, add_generation_prompt=True)
    assert call.call_id.startswith("call_") and first.usage.input_tokens == len(rendered)

    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    second = client.responses.create(model=model, previous_response_id=first.id, input=[output], tools=FUNCTIONS,
                                     max_output_tokens=128)
    said = [*WEATHER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": json.loads(
            call.arguments)}}]}, {"role": "tool", "tool_call_id": call.call_id, "content": "18 C, sunny"}]
    assert second.output_text == reference(said)[0] == "It is 18 C and sunny in Paris."
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert client.responses.retrieve(second.id).output_text == second.output_text

    items = [{"role": "user", "content": WEATHER[0]["content"]},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             output]
    kinds, final = streamed(client, model=model, input=items, tools=FUNCTIONS, max_output_tokens=128, store=False)
    assert final.output_text == second.output_text and final.status == "completed"
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(final.id)

    kinds, called = streamed(client, model=model, input=WEATHER[0]["content"], tools=FUNCTIONS, max_output_tokens=128)
    assert calls_in(called) == expected and "response.function_call_arguments.delta" in kinds
    assert client.responses.retrieve(called.id).output[0].call_id == called.output[0].call_id
    client.responses.delete(called.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(called.id)


def test_instructions_sampling_and_max_output_tokens(api, tool_model):  # noqa: F811
    """`instructions` are the system message; a sampled answer is plain sampling's for the seed (extension
    fields: the seed, and one-hot n-gram drafts, which keep each position's draw); an answer cut at
    max_output_tokens is incomplete."""
    client, model, _ = api
    messages = [{"role": "system", "content": "Be brief."}, *HELLO]
    ids = chat_ids(tool_model[0], messages)
    reply = client.responses.create(model=model, instructions="Be brief.", input=HELLO[0]["content"],
                                    temperature=0.9, max_output_tokens=40, extra_body={"seed": 5, "drafter": "ngram"})
    assert reply.output_text == plain_text(tool_model[0], ids, 40, temperature=0.9, seed=5)
    assert reply.usage.input_tokens == len(ids) and reply.usage.output_tokens > 0
    cut = client.responses.create(model=model, input=[{"role": "developer", "content": "Be brief."}, *HELLO],
                                  max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text == plain_text(tool_model[0], ids, 3) and cut.usage.output_tokens == 3


def test_text_format_json_schema_equals_plain_constrained_decoding(api, tool_model):  # noqa: F811
    client, model, _ = api
    from mlx_lm.utils import load

    tokenizer = load(str(tool_model[0]))[1]
    for i, schema in enumerate(schemas(3)):
        messages = [{"role": "user", "content": f"Describe item {i} as JSON."}]
        plain = constrained_reference(tool_model[0], tokenizer.apply_chat_template(messages, add_generation_prompt=True),
                                      from_schema(schema), 160)
        shape = {"format": {"type": "json_schema", "name": f"item{i}", "schema": schema, "strict": True}}
        reply = client.responses.create(model=model, input=messages, text=shape, max_output_tokens=160)
        assert reply.output_text == tokenizer.decode(plain[:-1])
        jsonschema.validate(json.loads(reply.output_text), schema)
        assert streamed(client, model=model, input=messages, text=shape, max_output_tokens=160)[1].output_text == \
            reply.output_text


@pytest.mark.parametrize("body, fragment, param", [
    ({"input": [{"type": "reasoning", "summary": []}]}, "items of type 'reasoning' are not supported", "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "this model reads text only (images need a vision-language checkpoint)", "input"),
    ({"input": []}, "'input' must be", "input"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "role must be one of", "input"),
    ({"input": "hi", "previous_response_id": "resp_gone"}, "'resp_gone' not found", "previous_response_id"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "'text.format' must be", "text.format"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
     "'text.format': the json schema cannot be used", "text.format"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "only function tools", "tools"),
    ({"input": "hi", "max_output_tokens": 0}, "'max_output_tokens' must be", "max_output_tokens"),
    ({"input": "hi", "tool_choice": {"type": "file_search"}}, "'tool_choice' must be", "tool_choice"),
])
def test_bad_responses_requests_get_400s_naming_the_field(api, body, fragment, param):  # noqa: F811
    _, _, url = api
    response = httpx.post(f"{url}/v1/responses", json=body, timeout=30, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["param"] == param and "\n" not in error["message"]


def test_a_stored_conversation_goes_on_without_its_instructions_and_calls_can_be_required(api, tool_model):  # noqa: F811
    """previous_response_id carries the conversation, not the instructions (as OpenAI does): the answer is plain
    decoding's for the conversation without its system message. tool_choice "required" makes a call where the
    model would have said hello, its arguments valid for the tool."""
    client, model, _ = api
    first = client.responses.create(model=model, instructions="Be brief.", input=HELLO[0]["content"],
                                    max_output_tokens=20)
    second = client.responses.create(model=model, previous_response_id=first.id, input="Say hello again.",
                                     max_output_tokens=20)
    said = [*HELLO, {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "Say hello again."}]
    assert second.output_text == plain_text(tool_model[0], chat_ids(tool_model[0], said), 20)
    forced = client.responses.create(model=model, input=HELLO[0]["content"], tools=FUNCTIONS, tool_choice="required",
                                     max_output_tokens=128)
    schemas = {tool["name"]: tool["parameters"] for tool in FUNCTIONS}
    assert forced.status == "completed" and calls_in(forced)
    for name, arguments in calls_in(forced):
        jsonschema.validate(arguments, schemas[name])
