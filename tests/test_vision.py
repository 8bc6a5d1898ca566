"""Images in the prompt (runners/vision.py): a Qwen 3.5 checkpoint with its vision tower reads an image prompt as
mlx-vlm's own model does, and decodes it with every drafter exactly as mlx-vlm's plain greedy generation does."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_vision import write_image

import mlx_spec
from mlx_spec.seams.errors import SpecError

QUESTION = "def f(x):\n    return"


def chat(images: list[str], with_sources: bool = True) -> list[dict]:
    parts = [{"type": "text", "text": "look "}]
    for path in images:
        parts += [{"type": "image", **({"image": path} if with_sources else {})}, {"type": "text", "text": " and "}]
    return [{"role": "user", "content": parts + [{"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def reference(tiny):
    from mlx_vlm import load

    return load(str(tiny["qwen3_5-vision"]))


def reference_inputs(reference, images: list[str], text: str | None = None) -> dict:
    """mlx-vlm's inputs for `chat(images)`, or (`text`) for the images then `text` in one message."""
    from mlx_vlm.utils import prepare_inputs

    model, processor = reference
    messages = chat(images, with_sources=False) if text is None else [
        {"role": "user", "content": [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]}]
    rendered = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prepare_inputs(processor, images=images, prompts=[rendered])


def reference_greedy(reference, images: list[str], n: int, text: str | None = None) -> list[int]:
    """mlx-vlm's plain greedy generation (it runs past the end-of-sequence token: cut where ours stops)."""
    from mlx_vlm.generate import generate_step

    inputs = reference_inputs(reference, images, text)
    steps = generate_step(inputs["input_ids"], reference[0], inputs["pixel_values"], inputs["attention_mask"],
                          image_grid_thw=inputs["image_grid_thw"], temperature=0.0, max_tokens=n)
    return [int(token) for (token, _), _ in zip(steps, range(n))]


def returning_turn(engine, images: list[str]) -> tuple:
    """(the first answer, the second, the second turn's token ids as the engine keeps them) of a chat over
    `images` whose second turn asks on."""
    first = mlx_spec.generate(engine, chat(images), max_tokens=10)
    conversation = chat(images) + [{"role": "assistant", "content": first.text},
                                   {"role": "user", "content": "and then?"}]
    ids = engine.encode_chat(conversation)[0]
    return first, mlx_spec.generate(engine, conversation, max_tokens=10), ids


def position_key_sampler(start: int, temperature: float, seed: int):
    """A sampler for mlx-vlm's generation by mlx-spec's documented rule, written from it: the token at position
    start, start + 1, ... is Gumbel-max over the target's distribution at `temperature`, with that position's key."""
    from helpers import numpy_distribution

    from mlx_spec.core.verify import position_keys

    position = [start]

    def draw(logprobs: mx.array) -> mx.array:
        p = numpy_distribution(np.array(logprobs[0], dtype=np.float64), temperature)
        noise = np.array(mx.random.gumbel((p.size,), key=position_keys(mx.random.key(seed), position[0], 1)[0]))
        position[0] += 1
        with np.errstate(divide="ignore"):
            return mx.array([int(np.argmax(np.log(p) + noise))])
    return draw


def test_an_image_prompt_scores_as_mlx_vlms_model_does(tiny, reference, images):
    """Every position's logits over a prompt with two images equal mlx-vlm's forward (its vision tower, merged
    embeddings and M-RoPE positions); read as text (image tokens at their token embeddings, positions in a row)
    they do not."""
    inputs = reference_inputs(reference, images)
    expected = np.array(reference[0](inputs["input_ids"], pixel_values=inputs["pixel_values"],
                                     image_grid_thw=inputs["image_grid_thw"], mask=inputs["attention_mask"]).logits[0])
    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), drafter="off")
    ids, chat_text, prompt_images = engine.encode_chat(chat(images))
    assert ids == inputs["input_ids"][0].tolist() and prompt_images.count == 2 and chat_text.count("<|image_pad|>") == 2
    assert (prompt_images.positions[1] != prompt_images.positions[2]).any()  # height and width differ
    logits = np.array(engine.target.forward_images(ids, 0, len(ids), prompt_images).logits)
    np.testing.assert_allclose(logits, expected, atol=2e-2, rtol=1e-3)
    engine.target.reset()
    as_text = np.array(engine.target.forward(ids).logits)
    assert np.abs(as_text - expected).max() > 1.0


@pytest.mark.parametrize("options", [{"drafter": "draft-model"}, {"drafter": "mtp"}, {"drafter": "ngram"},
                                     {"drafter": "suffix"}, {"drafter": "dflash"}, {"drafter": "off"}],
                         ids=lambda o: o["drafter"])
def test_greedy_output_over_images_is_mlx_vlms_plain_greedy(tiny, reference, images, options, tmp_path):
    """Speculative greedy decoding after an image prompt emits mlx-vlm's plain greedy tokens, with a draft model
    (it reads the image tokens as text: drafts accepted and rejected), the MTP layer, n-gram, suffix decoding, a
    block drafter (random weights: its context features are the target's hidden states over the image) and none."""
    from tiny_block import random_block_drafter

    if options["drafter"] == "draft-model":
        options = {"draft_model": str(tiny["qwen3_5-vision-draft"])}
    elif options["drafter"] == "dflash":
        options = {"draft_model": str(random_block_drafter(tmp_path / "dflash", tiny["qwen3_5-vision"]))}
    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), draft_len=3, **options)
    result = mlx_spec.generate(engine, chat(images), max_tokens=40)
    expected = reference_greedy(reference, images, 40)
    assert result.tokens == expected[:len(result.tokens)]
    assert result.stop_reason == "max_tokens" or result.tokens[-1] == 0
    if options.get("draft_model") == str(tiny["qwen3_5-vision-draft"]):
        assert 0 < result.stats.accepted < result.stats.drafted
    assert result.stats.drafted > 0 or result.stats.drafter in ("off", "ngram", "suffix")


def test_an_image_turn_after_a_text_turn_and_back(tiny, reference, images):
    """The engine's cache goes from a text prompt to an image prompt and back: each output is the one its
    prompt has alone (an image prompt reuses no cached position, nor leaves any to reuse)."""
    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), draft_model=str(tiny["qwen3_5-vision-draft"]),
                           draft_len=3)
    text = [{"role": "user", "content": QUESTION}]
    alone = mlx_spec.generate(mlx_spec.load(str(tiny["qwen3_5-vision"]), drafter="off"), text, max_tokens=12)
    assert mlx_spec.generate(engine, text, max_tokens=12).tokens == alone.tokens
    result = mlx_spec.generate(engine, chat(images[:1]), max_tokens=12)
    assert result.tokens == reference_greedy(reference, images[:1], 12)[:len(result.tokens)]
    assert result.stats.reused_prompt_tokens == 0
    again = mlx_spec.generate(engine, text, max_tokens=12)
    assert again.tokens == alone.tokens and again.stats.reused_prompt_tokens == 0


def test_the_cli_reads_images(tiny, reference, images):
    """`generate --image PATH` (twice) puts the images before the prompt's text, as the chat above does."""
    out = subprocess.run([sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(tiny["qwen3_5-vision"]),
                          "--image", images[0], "--image", images[1], "--prompt", QUESTION, "--max-tokens", "16",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    tokens = json.loads(out.stdout)["tokens"]
    message = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": QUESTION}]}]
    from mlx_vlm.generate import generate_step
    from mlx_vlm.utils import prepare_inputs

    model, processor = reference
    inputs = prepare_inputs(processor, images=images, prompts=[
        processor.tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)])
    steps = generate_step(inputs["input_ids"], model, inputs["pixel_values"], inputs["attention_mask"],
                          image_grid_thw=inputs["image_grid_thw"], temperature=0.0, max_tokens=16)
    assert tokens == [int(t) for (t, _), _ in zip(steps, range(16))][:len(tokens)]


def test_images_are_refused_where_they_cannot_be_read(tiny, images, tmp_path):
    """One-line errors: an image for a text-only model, a file that is not an image, an image part without its
    image, --image with --raw; nothing generated."""
    text_only = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    with pytest.raises(SpecError, match="this model reads text only: images need a vision-language checkpoint"):
        mlx_spec.generate(text_only, chat(images), max_tokens=4)
    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), drafter="off")
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(SpecError, match=r"cannot read .*notes.png as an image"):
        mlx_spec.generate(engine, chat([str(tmp_path / "notes.png")]), max_tokens=4)
    with pytest.raises(SpecError, match="an image part must be"):
        mlx_spec.generate(engine, chat(images, with_sources=False), max_tokens=4)
    out = subprocess.run([sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(tiny["qwen3_5-vision"]),
                          "--image", images[0], "--prompt", "x", "--raw"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and out.stdout == "" and "Traceback" not in out.stderr
    assert "--image needs the chat template" in out.stderr


def test_m_rope_positions_turn_each_frequency_by_its_axis():
    """compat.positions with sections: frequency i of a rotary embedding turns by the position of its axis, as a
    NumPy transcription of Qwen3-VL's interleaved M-RoPE does."""
    from mlx_spec.runners.vision import frequency_axes
    from mlx_spec.seams import compat

    axes = frequency_axes({"head_dim": 32, "hidden_size": 64, "num_attention_heads": 2, "rope_parameters": {
        "mrope_section": [3, 3, 2], "mrope_interleaved": True, "partial_rotary_factor": 1.0}})
    assert axes.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = nn.RoPE(32, base=10000.0)

    layer = Holder()
    compat.positioned_ropes(layer)
    x = mx.random.normal((1, 2, 3, 32), key=mx.random.key(0))
    positions = np.array([[4, 4, 4], [4, 5, 6], [7, 4, 5]])
    with compat.positions(mx.array(positions), mx.array(axes)):
        turned = np.array(layer.rope(x, offset=0))
    inv = 1.0 / 10000.0 ** (np.arange(0, 32, 2) / 32)
    angle = positions[axes].T * inv  # (tokens, frequencies): each frequency at its axis's position
    cos, sin = np.cos(np.concatenate([angle, angle], -1)), np.sin(np.concatenate([angle, angle], -1))
    xs = np.array(x)
    rotated = np.concatenate([-xs[..., 16:], xs[..., :16]], -1)
    np.testing.assert_allclose(turned, xs * cos + rotated * sin, atol=1e-5)


def test_image_rows_in_a_batch_decode_as_each_does_alone(tiny, reference, images):
    """A batch of two image prompts (different images) and a text prompt, the image rows prefilled at their
    embeddings and positions before they join: each row emits what it emits alone (mlx-vlm's plain greedy
    tokens for the image rows, plain greedy decoding for the text one), the draft model's drafts accepted and
    rejected."""
    from helpers import plain_greedy

    from mlx_spec.decode.rounds import Job

    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), draft_model=str(tiny["qwen3_5-vision-draft"]), draft_len=3)
    prompts = [engine.encode_chat(chat(images[:1])), engine.encode_chat(chat(images[1:])),
               engine.encode_chat([{"role": "user", "content": QUESTION}])]
    jobs = [Job(ids, max_tokens=24, images=prompt_images) for ids, _, prompt_images in prompts]
    results = dict(engine.generate_many(jobs, batch_size=3))
    for i in (0, 1):
        assert results[i].tokens == reference_greedy(reference, images[i:i + 1], 24)[:len(results[i].tokens)]
    assert results[2].tokens == plain_greedy(tiny["qwen3_5-vision"], prompts[2][0], 24)[:len(results[2].tokens)]
    assert sum(r.stats.accepted for r in results.values()) > 0
    assert sum(r.stats.drafted - r.stats.accepted for r in results.values()) > 0


def test_the_server_answers_images_from_the_official_clients(tiny, reference, images):
    """A served vision model: the openai client's image_url parts (a data URL and a file URL, in one request and
    concurrently with a text request), its Responses API's input_image part, the anthropic client's base64 image
    block and the chat's remote engine
    (image parts sent as data URLs) answer with mlx-vlm's plain greedy text; a remote URL is refused in one line
    (the server fetches nothing)."""
    import base64
    import signal
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    import anthropic
    import openai
    from helpers import KEY, start_server

    from mlx_spec.serve.client import RemoteEngine

    proc, url = start_server(tiny, "--max-tokens", "12", model=tiny["qwen3_5-vision"],
                             drafter=("--draft-model", str(tiny["qwen3_5-vision-draft"])))
    try:
        data = "data:image/png;base64," + base64.b64encode(Path(images[0]).read_bytes()).decode()
        parts = [{"type": "text", "text": "look "}, {"type": "image_url", "image_url": {"url": data}},
                 {"type": "text", "text": " and "}, {"type": "image_url", "image_url": {"url": f"file://{images[1]}"}},
                 {"type": "text", "text": " and " + QUESTION}]
        gpt = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
        model, processor = reference
        model_id = str(tiny["qwen3_5-vision"])
        with ThreadPoolExecutor(2) as pool:
            answers = [pool.submit(gpt.chat.completions.create, model=model_id, max_tokens=12, temperature=0,
                                   messages=[{"role": "user", "content": c}]) for c in (parts, QUESTION)]
            answer, text_answer = [a.result() for a in answers]
        expected = processor.tokenizer.decode(reference_greedy(reference, images, 12))
        assert expected.startswith(answer.choices[0].message.content) and answer.choices[0].message.content
        assert text_answer.choices[0].message.content
        claude = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(Path(images[1]).read_bytes()).decode()}}
        said = claude.messages.create(model=model_id, max_tokens=12, messages=[{"role": "user", "content": [
            {"type": "text", "text": "look "}, block, {"type": "text", "text": " and " + QUESTION}]}])
        expected = processor.tokenizer.decode(reference_greedy(reference, images[1:], 12))
        assert said.content[0].text and expected.startswith(said.content[0].text)
        response = gpt.responses.create(model=model_id, max_output_tokens=12, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "look "}, {"type": "input_image", "image_url": data},
            {"type": "input_text", "text": " and " + QUESTION}]}])  # the Responses API's input_image part
        expected = processor.tokenizer.decode(reference_greedy(reference, images[:1], 12))
        assert response.output_text and expected.startswith(response.output_text)
        remote = RemoteEngine(url, KEY).generate(chat(images[1:]), max_tokens=12)  # `chat --server`'s engine
        assert remote.tokens == reference_greedy(reference, images[1:], 12)[:len(remote.tokens)]
        with pytest.raises(openai.BadRequestError, match="remote image URLs are not fetched"):
            gpt.chat.completions.create(model=model_id, max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def test_a_returning_turn_with_the_same_image_reuses_its_prefix(tiny, reference, images):
    """A chat's second turn, its image the first turn's: the prompt and answer the cache holds are kept (the
    turn runs only its new text), and the answer is mlx-vlm's plain greedy one for the whole conversation; the
    same turn over another image of the same size reuses only what comes before that image."""
    from mlx_vlm.utils import prepare_inputs

    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), draft_model=str(tiny["qwen3_5-vision-draft"]),
                           draft_len=3)
    first = mlx_spec.generate(engine, chat(images[:1]), max_tokens=10)
    conversation = chat(images[:1]) + [{"role": "assistant", "content": first.text},
                                       {"role": "user", "content": "and then?"}]
    second = mlx_spec.generate(engine, conversation, max_tokens=10)
    assert second.stats.reused_prompt_tokens == first.stats.prompt_tokens + len(first.tokens) - 1
    model, processor = reference
    plain = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]}
             if isinstance(m["content"], list) else m for m in conversation]
    inputs = prepare_inputs(processor, images=images[:1], prompts=[
        processor.tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)])
    from mlx_vlm.generate import generate_step

    steps = generate_step(inputs["input_ids"], model, inputs["pixel_values"], inputs["attention_mask"],
                          image_grid_thw=inputs["image_grid_thw"], temperature=0.0, max_tokens=10)
    assert second.tokens == [int(t) for (t, _), _ in zip(steps, range(10))][:len(second.tokens)]
    other = str(write_image(Path(images[0]).with_name("other.png"), 64, 48, 5))  # as many tokens, other pixels
    swapped = [{**conversation[0], "content": [{"type": "image", "image": other} if p.get("type") == "image" else p
                                               for p in conversation[0]["content"]]}] + conversation[1:] + [
        {"role": "assistant", "content": second.text}, {"role": "user", "content": "and?"}]
    third = mlx_spec.generate(engine, swapped, max_tokens=10)  # its tokens extend what the cache holds
    assert third.stats.reused_prompt_tokens == 0  # a Gated DeltaNet cache keeps all it holds, or nothing


@pytest.mark.parametrize("temperature, seed", [(0.2, 0), (0.7, 3)])
def test_sampled_output_over_images_draws_what_mlx_vlms_model_draws(tiny, reference, images, temperature, seed):
    """Sampled speculative decoding after an image prompt draws, token for token, what mlx-vlm's model alone draws
    by the documented rule (each token Gumbel-max from the target's distribution with the key of its position):
    a prediction's drafts are single tokens, so a seed repeats plain sampling's run whatever is drafted (here a
    prediction that is the run itself with an edit in the middle: drafts accepted and rejected)."""
    from mlx_vlm.generate import generate_step

    inputs = reference_inputs(reference, images)
    draw = position_key_sampler(inputs["input_ids"].shape[1], temperature, seed)

    steps = generate_step(inputs["input_ids"], reference[0], inputs["pixel_values"], inputs["attention_mask"],
                          image_grid_thw=inputs["image_grid_thw"], sampler=draw, max_tokens=60)
    expected = [int(t) for (t, _), _ in zip(steps, range(60))]
    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), drafter="off")
    edited = expected[:20] + [(t + 1) % 400 for t in expected[20:24]] + expected[24:]
    result = mlx_spec.generate(engine, chat(images), max_tokens=60, temperature=temperature, seed=seed,
                               prediction=edited)
    assert result.tokens == expected[:len(result.tokens)] and len(result.tokens) > 30
    assert 0 < result.stats.accepted < result.stats.drafted


def test_the_chat_attaches_images(tiny, reference, images):
    """In the chat (Textual's pilot), `/image PATH` attaches an image to the next message: the answer is mlx-vlm's
    plain greedy one for that image and text, and the panel shows the image's tokens and the prefill's time; a
    missing file is an error in the transcript, and nothing is attached."""
    import asyncio

    from mlx_spec.tui.app import ChatApp
    from test_tui import ask, panel, views, wait_done

    from mlx_spec.core.sampling import SamplingParams

    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), draft_model=str(tiny["qwen3_5-vision-draft"]), draft_len=3)
    question = QUESTION.replace("\n", " ")
    expected = reference[1].tokenizer.decode(reference_greedy(reference, images[:1], 12, text=question))

    async def run():
        app = ChatApp(engine, SamplingParams(), 12, "tiny")
        async with app.run_test(size=(100, 30)) as pilot:
            await ask(app, pilot, "/image /no/such.png")
            assert "no such file" in views(app, "error")[0].text
            await ask(app, pilot, f"/image {images[0]}")
            await ask(app, pilot, question)
            await wait_done(app, pilot)
            answer = app.screen.messages[-1]["content"]
            assert answer and expected.startswith(answer)
            assert "image tokens, prefill" in panel(app, "speed")
            assert not app.screen.images
    asyncio.run(run())


def test_batch_lines_carry_images(tiny, reference, images, tmp_path):
    """`mlx-spec batch`: lines whose messages hold image parts (paths) decode in one batch with a text line, each
    as mlx-vlm's plain greedy generation; a raw line with an image is refused on its own."""
    from helpers import run_cli

    requests = tmp_path / "in.jsonl"
    requests.write_text("\n".join(json.dumps(line) for line in [
        {"id": "wide", "messages": chat(images[:1])}, {"id": "both", "messages": chat(images)},
        {"id": "text", "prompt": QUESTION}, {"id": "raw", "messages": chat(images[:1]), "raw": True}]) + "\n")
    out = tmp_path / "out.jsonl"
    proc = run_cli("batch", str(requests), "-o", str(out), "--model", str(tiny["qwen3_5-vision"]), "--draft-model",
                   str(tiny["qwen3_5-vision-draft"]), "--max-tokens", "12", "--batch-size", "3")
    assert proc.returncode == 1 and "images need the chat template to place them" in proc.stderr, proc.stderr
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(results) == {"wide", "both", "text"}
    for name, shown in (("wide", images[:1]), ("both", images)):
        expected = reference[1].tokenizer.decode(reference_greedy(reference, shown, 12))
        assert results[name]["text"] and expected.startswith(results[name]["text"])


def test_images_for_a_vision_model_not_read_yet_are_refused(tiny, images, tmp_path):
    """A vision-language checkpoint of a family mlx-spec does not read images for yet (a Qwen3 with a vision
    config) gets a one-line error naming the family and the ones that work; a Gemma 4 whose config names no
    image token (the text fixture's), one saying so."""
    folder = tmp_path / "qwen3-vl"
    shutil.copytree(tiny["qwen3"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vision_config": {"model_type": "qwen3_vl"}}))
    engine = mlx_spec.load(str(folder), drafter="off")
    with pytest.raises(SpecError, match="images are not supported for qwen3 checkpoints yet: Qwen 3.5 / 3.6, "
                                        "Qwen3-VL, Qwen2.5-VL and Gemma 4 read"):
        mlx_spec.generate(engine, chat(images[:1]), max_tokens=4)
    engine = mlx_spec.load(str(tiny["gemma4"]), drafter="off")
    with pytest.raises(SpecError, match="config.json names no image_token_id .*: use the original checkpoint"):
        mlx_spec.generate(engine, chat(images[:1]), max_tokens=4)


@pytest.mark.parametrize("drafter", ["mtp", "ngram"])
def test_the_moe_family_reads_images_as_mlx_vlm_does(tiny, images, drafter):
    """Qwen 3.5 MoE with its vision tower: greedy speculative output after two images is mlx-vlm's plain greedy
    generation of its own MoE model."""
    from mlx_vlm import load

    moe = load(str(tiny["qwen3_5_moe-vision"]))
    engine = mlx_spec.load(str(tiny["qwen3_5_moe-vision"]), drafter=drafter, draft_len=3)
    result = mlx_spec.generate(engine, chat(images), max_tokens=24)
    assert result.tokens == reference_greedy(moe, images, 24)[:len(result.tokens)] and result.stats.drafted > 0
