"""Images in a Gemma 4 prompt (runners/vision.py): a Gemma 4 checkpoint with its vision tower reads an image
prompt as mlx-vlm's own model does (its projection into the embeddings, padding read by the per-layer embeddings
at image tokens, each image's tokens seeing one another), and decodes it with every drafter it has exactly as
mlx-vlm's plain greedy generation does."""

import numpy as np
import pytest
from test_vision import QUESTION, chat, position_key_sampler, returning_turn

import mlx_spec

MODEL = "gemma4-vision"


@pytest.fixture(scope="module")
def reference(tiny):
    from mlx_vlm import load

    return load(str(tiny[MODEL]))


def reference_inputs(reference, messages: list[dict], images: list[str]) -> dict:
    """mlx-vlm's inputs for a chat whose image parts show `images`, in order."""
    from mlx_vlm.utils import prepare_inputs

    model, processor = reference
    plain = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]}
             if isinstance(m["content"], list) else m for m in messages]
    rendered = processor.tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    return prepare_inputs(processor, images=images, prompts=[rendered], padding=False)


def reference_greedy(reference, images: list[str], n: int, ids: list[int] | None = None) -> list[int]:
    """mlx-vlm's plain greedy generation for `chat(images)`, or for the token `ids` of a prompt showing `images`
    (it runs past the end-of-sequence token: cut where ours stops); the image tokens' types make it read each
    image whole."""
    import mlx.core as mx
    from mlx_vlm.generate import generate_step

    inputs = reference_inputs(reference, chat(images), images)
    if ids is not None:
        inputs["input_ids"] = mx.array([ids])
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == reference[0].config.image_token_id).astype(mx.int32)
    steps = generate_step(inputs["input_ids"], reference[0], inputs["pixel_values"], None,
                          mm_token_type_ids=inputs["mm_token_type_ids"], temperature=0.0, max_tokens=n)
    return [int(token) for (token, _), _ in zip(steps, range(n))]


def test_a_gemma4_image_prompt_scores_as_mlx_vlms_model_does(tiny, reference, images, monkeypatch):
    """Every position's logits over a prompt with two images equal mlx-vlm's forward, which reads each image's
    tokens all at once; read causally (mlx-vlm without the tokens' types) or as text they differ by more than 1.
    Prefilled in pieces of 7 positions (each would end inside an image: the pieces keep images whole), the
    next token's logits are the same again."""
    import mlx_spec.runners.target as target

    inputs = reference_inputs(reference, chat(images), images)
    model = reference[0]
    expected = np.array(model(inputs["input_ids"], pixel_values=inputs["pixel_values"],
                              mm_token_type_ids=inputs["mm_token_type_ids"]).logits[0])
    causal = np.array(model(inputs["input_ids"], pixel_values=inputs["pixel_values"]).logits[0])
    engine = mlx_spec.load(str(tiny[MODEL]), drafter="off")
    ids, _, prompt_images = engine.encode_chat(chat(images))
    assert ids == inputs["input_ids"][0].tolist() and prompt_images.count == 2 and prompt_images.whole
    assert all(np.sum(prompt_images.blocks == b) > 8 for b in (0, 1))  # each image longer than the window
    logits = np.array(engine.target.forward_images(ids, 0, len(ids), prompt_images).logits)
    np.testing.assert_allclose(logits, expected, atol=2e-2, rtol=1e-3)
    assert np.abs(causal - expected).max() > 1.0
    engine.target.reset()
    assert np.abs(np.array(engine.target.forward(ids).logits) - expected).max() > 1.0
    monkeypatch.setattr(target, "PREFILL_CHUNK", 7)
    engine.target.prefill(ids[:-1], images=prompt_images)
    np.testing.assert_allclose(np.array(engine.target.forward(ids[-1:]).logits[-1]), expected[-1], atol=2e-2,
                               rtol=1e-3)


@pytest.mark.parametrize("drafter", ["draft-model", "assistant", "dflash", "ngram", "suffix", "off"])
def test_greedy_output_over_gemma4_images_is_mlx_vlms_plain_greedy(tiny, reference, images, drafter, tmp_path):
    """Speculative greedy decoding after a Gemma 4 image prompt emits mlx-vlm's plain greedy tokens: with a draft
    model (it reads the image tokens as text: drafts accepted and rejected), the Gemma 4 assistant (random: it
    drafts over the target's K/V of the image positions, and is rejected), a block drafter (random: its context
    features are the target's hidden states over the images), n-gram, suffix decoding and none."""
    from tiny_block import random_block_drafter

    drafts = {"draft-model": lambda: tiny[f"{MODEL}-draft"], "assistant": lambda: tiny[f"{MODEL}-assistant"],
              "dflash": lambda: random_block_drafter(tmp_path / "dflash", tiny[MODEL])}
    options = {"draft_model": str(drafts[drafter]())} if drafter in drafts else {"drafter": drafter}
    engine = mlx_spec.load(str(tiny[MODEL]), draft_len=3, **options)
    assert drafter == "off" or engine.drafter.name == drafter
    result = mlx_spec.generate(engine, chat(images), max_tokens=40)
    assert result.tokens == reference_greedy(reference, images, 40)[:len(result.tokens)]
    assert result.stop_reason == "max_tokens" or result.tokens[-1] == 0
    if drafter == "draft-model":
        assert 0 < result.stats.accepted < result.stats.drafted
    assert result.stats.drafted > 0 or drafter in ("off", "suffix")


def test_gemma4_image_rows_in_a_batch_decode_as_each_does_alone(tiny, reference, images, monkeypatch):
    """A batch of two Gemma 4 image prompts and a text prompt, the image rows prefilled in pieces of 7 (the
    batch's masks keep each image whole, beyond the sliding window) before they join: each row emits what it
    emits alone (mlx-vlm's plain greedy tokens, plain greedy decoding for the text row), the draft model's
    drafts accepted and rejected."""
    from helpers import plain_greedy

    import mlx_spec.runners.target as target
    from mlx_spec.decode.rounds import Job

    monkeypatch.setattr(target, "PREFILL_CHUNK", 7)
    engine = mlx_spec.load(str(tiny[MODEL]), draft_model=str(tiny[f"{MODEL}-draft"]), draft_len=3)
    prompts = [engine.encode_chat(chat(images[:1])), engine.encode_chat(chat(images[1:])),
               engine.encode_chat([{"role": "user", "content": QUESTION}])]
    jobs = [Job(ids, max_tokens=24, images=prompt_images) for ids, _, prompt_images in prompts]
    results = dict(engine.generate_many(jobs, batch_size=3))
    for i in (0, 1):
        assert results[i].tokens == reference_greedy(reference, images[i:i + 1], 24)[:len(results[i].tokens)]
    assert results[2].tokens == plain_greedy(tiny[MODEL], prompts[2][0], 24)[:len(results[2].tokens)]
    assert sum(r.stats.accepted for r in results.values()) > 0
    assert sum(r.stats.drafted - r.stats.accepted for r in results.values()) > 0


def test_a_returning_gemma4_turn_with_the_same_image_reuses_its_prefix(tiny, reference, images):
    """A chat's second turn, its image the first turn's: the prompt and answer the cache holds are kept (the
    turn runs only its new text), and the answer is mlx-vlm's plain greedy one for the whole conversation (its
    tokens as the engine keeps them: the first answer as generated, not re-encoded)."""
    engine = mlx_spec.load(str(tiny[MODEL]), draft_model=str(tiny[f"{MODEL}-draft"]), draft_len=3)
    first, second, ids = returning_turn(engine, images[:1])
    assert second.stats.reused_prompt_tokens == first.stats.prompt_tokens + len(first.tokens) - 1
    assert second.tokens == reference_greedy(reference, images[:1], 10, ids)[:len(second.tokens)]


def test_sampled_output_over_gemma4_images_draws_what_mlx_vlms_model_draws(tiny, reference, images):
    """Sampled speculative decoding after a Gemma 4 image prompt draws, token for token, what mlx-vlm's model alone
    draws by the documented rule (each token Gumbel-max from the target's distribution with the key of its
    position), a prediction's drafts accepted and rejected (see test_vision's twin)."""
    from mlx_vlm.generate import generate_step

    inputs = reference_inputs(reference, chat(images), images)
    temperature, seed = 0.7, 3
    draw = position_key_sampler(inputs["input_ids"].shape[1], temperature, seed)

    steps = generate_step(inputs["input_ids"], reference[0], inputs["pixel_values"], None,
                          mm_token_type_ids=inputs["mm_token_type_ids"], sampler=draw, max_tokens=60)
    expected = [int(t) for (t, _), _ in zip(steps, range(60))]
    engine = mlx_spec.load(str(tiny[MODEL]), drafter="off")
    edited = expected[:20] + [(t + 1) % 400 for t in expected[20:24]] + expected[24:]
    result = mlx_spec.generate(engine, chat(images), max_tokens=60, temperature=temperature, seed=seed,
                               prediction=edited)
    assert result.tokens == expected[:len(result.tokens)] and len(result.tokens) > 30
    assert 0 < result.stats.accepted < result.stats.drafted


def test_hidden_states_from_inside_an_image_read_whole(tiny, images, monkeypatch):
    """A drafter that reads the target's hidden states from the middle of an image on (its tail) gets them from a
    prefill in pieces as from one forward, alone and as a batch row: the piece that keeps the image whole starts
    before the tail."""
    import mlx_spec.runners.target as target
    from mlx_spec.runners.ragged import RaggedBatch

    engine = mlx_spec.load(str(tiny[MODEL]), drafter="off")
    ids, _, prompt_images = engine.encode_chat(chat(images))
    probe = target.Target(engine.target.model, hidden="post")
    middle = int(np.flatnonzero(prompt_images.blocks == 0).mean())
    probe.hidden_tail = tail = len(ids) - 1 - middle
    whole = np.array(probe.forward_images(ids[:-1], 0, len(ids) - 1, prompt_images).hidden)[middle:]
    monkeypatch.setattr(target, "PREFILL_CHUNK", 7)
    pieces = probe.prefill(ids[:-1], images=prompt_images)
    np.testing.assert_allclose(np.array(pieces.hidden), whole, atol=1e-4)
    row = RaggedBatch(engine.target.model, rows=1)
    while not row.extend(ids[:-1], probe.read_hidden, tail, prompt_images):
        pass
    np.testing.assert_allclose(np.concatenate([np.array(h) for h in row.hidden]), whole, atol=1e-4)


def test_gemma4_image_conversations_through_the_prompt_cache(tiny, reference, images):
    """A Gemma 4 image conversation, then a text one, then the first's next turn as a batch row: the row starts
    from what the first conversation held (the prompt cache stored it when the text one came) and answers as
    mlx-vlm does over the whole conversation; the text turn reuses nothing of the image one (a sliding-window
    cache is not cut back)."""
    from mlx_spec.decode.rounds import Job

    engine = mlx_spec.load(str(tiny[MODEL]), draft_model=str(tiny[f"{MODEL}-draft"]), draft_len=3)
    engine.cache_prompts(1 << 30)
    first = mlx_spec.generate(engine, chat(images[1:]), max_tokens=8)
    other = mlx_spec.generate(engine, [{"role": "user", "content": QUESTION}], max_tokens=8)
    assert other.stats.reused_prompt_tokens == 0
    turn = chat(images[1:]) + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "and?"}]
    ids, _, shown = engine.encode_chat(turn)
    [(_, row)] = engine.generate_many([Job(ids, max_tokens=8, images=shown)], batch_size=2)
    assert row.stats.reused_prompt_tokens == first.stats.prompt_tokens + len(first.tokens) - 1
    assert row.tokens == reference_greedy(reference, images[1:], 8, ids)[:len(row.tokens)]
