"""Images in the prompt (runners/vision.py): a Qwen 3.5 checkpoint with its vision tower reads an image prompt as
mlx-vlm's own model does, and decodes it with every drafter exactly as mlx-vlm's plain greedy generation does."""

import json
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_vision import write_image

import mlx_spec
from mlx_spec.seams.errors import SpecError

QUESTION = "def f(x):\n    return"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Two images of different shapes: their patch grids differ in height and width."""
    folder = tmp_path_factory.mktemp("images")
    return [str(write_image(folder / "wide.png", 64, 48, 0)), str(write_image(folder / "tall.png", 40, 72, 1))]


def chat(images: list[str], with_sources: bool = True) -> list[dict]:
    parts = [{"type": "text", "text": "look "}]
    for path in images:
        parts += [{"type": "image", **({"image": path} if with_sources else {})}, {"type": "text", "text": " and "}]
    return [{"role": "user", "content": parts + [{"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def reference(tiny):
    from mlx_vlm import load

    return load(str(tiny["qwen3_5-vision"]))


def reference_inputs(reference, images: list[str]) -> dict:
    from mlx_vlm.utils import prepare_inputs

    model, processor = reference
    text = processor.tokenizer.apply_chat_template(chat(images, with_sources=False), tokenize=False,
                                                   add_generation_prompt=True)
    return prepare_inputs(processor, images=images, prompts=[text])


def reference_greedy(reference, images: list[str], n: int) -> list[int]:
    """mlx-vlm's plain greedy generation (it runs past the end-of-sequence token: cut where ours stops)."""
    from mlx_vlm.generate import generate_step

    inputs = reference_inputs(reference, images)
    steps = generate_step(inputs["input_ids"], reference[0], inputs["pixel_values"], inputs["attention_mask"],
                          image_grid_thw=inputs["image_grid_thw"], temperature=0.0, max_tokens=n)
    return [int(token) for (token, _), _ in zip(steps, range(n))]


def test_an_image_prompt_scores_as_mlx_vlms_model_does(tiny, reference, images):
    """Every position's logits over a prompt with two images equal mlx-vlm's forward (its vision tower, merged
    embeddings and M-RoPE positions); read as text (image tokens at their token embeddings, positions in a row)
    they do not."""
    inputs = reference_inputs(reference, images)
    expected = np.array(reference[0](inputs["input_ids"], pixel_values=inputs["pixel_values"],
                                     image_grid_thw=inputs["image_grid_thw"], mask=inputs["attention_mask"]).logits[0])
    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), drafter="off")
    ids, chat_text, prompt_images = engine.encode_chat(chat(images))
    assert ids == inputs["input_ids"][0].tolist() and prompt_images.count == 2 and chat_text is None
    assert (prompt_images.positions[1] != prompt_images.positions[2]).any()  # height and width differ
    logits = np.array(engine.target.forward_images(ids, 0, len(ids), prompt_images).logits)
    np.testing.assert_allclose(logits, expected, atol=2e-2, rtol=1e-3)
    engine.target.reset()
    as_text = np.array(engine.target.forward(ids).logits)
    assert np.abs(as_text - expected).max() > 1.0


@pytest.mark.parametrize("options", [{"drafter": "draft-model"}, {"drafter": "mtp"}, {"drafter": "ngram"},
                                     {"drafter": "off"}], ids=lambda o: o["drafter"])
def test_greedy_output_over_images_is_mlx_vlms_plain_greedy(tiny, reference, images, options):
    """Speculative greedy decoding after an image prompt emits mlx-vlm's plain greedy tokens, with a draft model
    (it reads the image tokens as text: drafts accepted and rejected), the MTP layer, n-gram and none."""
    if options["drafter"] == "draft-model":
        options = {"draft_model": str(tiny["qwen3_5-vision-draft"])}
    engine = mlx_spec.load(str(tiny["qwen3_5-vision"]), draft_len=3, **options)
    result = mlx_spec.generate(engine, chat(images), max_tokens=40)
    expected = reference_greedy(reference, images, 40)
    assert result.tokens == expected[:len(result.tokens)]
    assert result.stop_reason == "max_tokens" or result.tokens[-1] == 0
    if "draft_model" in options:
        assert 0 < result.stats.accepted < result.stats.drafted


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
