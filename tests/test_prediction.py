"""Predicted Outputs: a request's predicted output as its drafts. Output with a prediction that departs from it
(an edit in the middle: drafts accepted up to it, rejected there, accepted again once re-aligned) is mlx-lm's
plain greedy decoding, alone and as a row of a batch, beside any drafter; sampled output is plain sampling's own
draws for the seed (the drafts are single tokens); through the Python API, `generate --prediction FILE` and the
server's OpenAI and Anthropic routes with the official clients, whose usage counts the prediction's tokens."""

import json
import signal

import anthropic
import pytest
from helpers import KEY, PROMPT, assert_one_line_error, chat_ids, plain_greedy, plain_sampled, run_cli, start_server
from test_server import client

import mlx_spec
from mlx_spec import Job, SamplingParams

EDIT = [5, 6, 7, 8]  # tokens the output never has there: the prediction's edit


def edited(tokens: list[int], at: int = 30) -> list[int]:
    """`tokens` with a few of them replaced at `at`: a prediction the output departs from, then follows again."""
    return tokens[:at] + EDIT + tokens[at + 6:]


@pytest.mark.parametrize("options", [{"drafter": "off"}, {"drafter": "ngram"}, {"draft_model": "qwen3-draft"}],
                         ids=["drafting off", "ngram", "draft model"])
def test_greedy_output_with_a_prediction_is_plain_decoding(tiny, options):
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny["qwen3"]), **options)
    ids = engine.encode(PROMPT)
    expected = plain_greedy(tiny["qwen3"], ids, 80)
    result = engine.generate(ids, max_tokens=80, prediction=edited(expected))
    assert result.tokens == expected
    accepted, rejected = result.stats.prediction
    assert accepted + rejected == len(edited(expected)) and accepted > len(expected) - 20  # it found its way back
    assert result.stats.accepted < result.stats.drafted and result.stats.rounds < len(expected) / 3


def test_rows_of_a_batch_draft_from_their_own_predictions(tiny):
    """Rows with predictions (one edited, one of another text entirely) beside rows without, drafting with the
    draft model: every row is plain greedy decoding."""
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]))
    prompts = [engine.encode(PROMPT), engine.encode("def add(a, b):"), engine.encode(PROMPT[:40]), engine.encode("x")]
    expected = [plain_greedy(tiny["qwen3"], p, 48) for p in prompts]
    predictions = [edited(expected[0]), expected[2], None, expected[3]]  # the second row's: another's output
    results = dict(engine.generate_many([Job(p, max_tokens=48, prediction=q) for p, q in zip(prompts, predictions)],
                                        4))
    assert [results[i].tokens for i in range(4)] == expected
    assert max(r.stats.batch_size for r in results.values()) == 4
    assert results[0].stats.prediction[0] > 30 and results[2].stats.prediction is None


def test_sampled_output_with_a_prediction_is_plain_samplings_own_draws(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    ids = engine.encode(PROMPT)
    expected = plain_sampled(tiny["qwen3"], ids, 60, 0.7, seed=3)
    result = engine.generate(ids, SamplingParams(temperature=0.7), max_tokens=60, seed=3, prediction=edited(expected))
    assert len(expected) == 60 and result.tokens == expected and result.stats.prediction[0] > 30
    assert result.stats.accepted < result.stats.drafted  # and rejected at the edit


def test_generate_drafts_from_a_prediction_file(tiny, tmp_path):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    ids = engine.encode(PROMPT)
    expected = plain_greedy(tiny["qwen3"], ids, 40)
    (tmp_path / "predicted.txt").write_text(engine.tokenizer.decode(edited(expected, 20)))
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--drafter", "off", "--raw", "--json",
                   "--max-tokens", "40", "--prompt", PROMPT, "--prediction", str(tmp_path / "predicted.txt"))
    result = json.loads(proc.stdout)
    assert result["tokens"] == expected and result["stats"]["prediction"][0] > 0, proc.stderr
    assert_one_line_error(run_cli("generate", "--model", str(tiny["qwen3"]), "--prompt", "x", "--prediction",
                                  str(tmp_path / "missing.txt")), "--prediction", "cannot read it")


def test_batch_lines_draft_from_their_predictions(tiny, tmp_path):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    ids = engine.encode(PROMPT)
    expected = plain_greedy(tiny["qwen3"], ids, 40)
    lines = [{"id": 0, "prompt": PROMPT, "raw": True, "max_tokens": 40,
              "prediction": engine.tokenizer.decode(edited(expected, 20))},
             {"id": 1, "prompt": PROMPT, "raw": True, "max_tokens": 40}, {"id": 2, "prompt": "x", "prediction": 7}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = run_cli("batch", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--model",
                   str(tiny["qwen3"]), "--drafter", "off", "--batch-size", "2", "--quiet")
    results = {r["id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert sorted(results) == [0, 1] and '"prediction" must be text' in proc.stderr, proc.stderr
    assert results[0]["text"] == results[1]["text"] == engine.tokenizer.decode(expected)
    assert results[0]["stats"]["prediction"][0] > 0 and results[1]["stats"]["prediction"] is None


@pytest.fixture
def server(tiny):
    proc, url = start_server(tiny, drafter=("--drafter", "off"), model=tiny["qwen3"])
    yield url, str(tiny["qwen3"])
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130


def test_the_server_drafts_from_predictions_on_both_apis(server, tiny):
    url, model = server
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    tokenizer = mlx_spec.load(str(tiny["qwen3"]), drafter="off").tokenizer
    expected = plain_greedy(tiny["qwen3"], chat_ids(tiny["qwen3"], messages), 40)
    prediction = tokenizer.decode(edited(expected, 20))
    reply = client(url).chat.completions.create(model=model, messages=messages, max_tokens=40,
                                                prediction={"type": "content", "content": prediction})
    assert reply.choices[0].message.content == tokenizer.decode([t for t in expected if t != tokenizer.eos_token_id])
    details = reply.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0  # (a random model's text re-tokenizes otherwise after a while)
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == len(
        tokenizer.encode(prediction, add_special_tokens=False))
    claude = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)
    message = claude.messages.create(model=model, messages=messages, max_tokens=40,
                                     extra_body={"prediction": {"type": "content", "content": prediction}})
    assert message.content[0].text == reply.choices[0].message.content
    assert message.usage.model_dump()["accepted_prediction_tokens"] == details.accepted_prediction_tokens
    bad = client(url).with_options(max_retries=0)
    with pytest.raises(Exception, match="prediction"):
        bad.chat.completions.create(model=model, messages=messages, max_tokens=4, prediction={"type": "text"})


def test_a_prediction_of_ids_outside_the_vocabulary_is_refused(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    with pytest.raises(mlx_spec.SpecError, match="token ids from 0 to"):
        engine.generate("hi", max_tokens=4, prediction=[10**7])
