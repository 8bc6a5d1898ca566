"""Images in Qwen3-VL (dense and MoE) and Qwen2.5-VL prompts (runners/vision.py): their text models are Qwen3's
(and its MoE) and Qwen2's, which mlx-lm serves, read at M-RoPE positions (Qwen3-VL's interleaved, Qwen2.5-VL's
sections in a row) with Qwen3-VL's deepstack features added after its first layers; each reads an image prompt as
mlx-vlm's own model does and decodes it exactly as mlx-vlm's plain greedy generation does."""

import numpy as np
import pytest
from test_vision import chat, returning_turn

import mlx_spec

FAMILIES = ["qwen3_vl", "qwen3_vl_moe", "qwen2_5_vl"]


@pytest.fixture(scope="module")
def references(tiny):
    from mlx_vlm import load

    return {family: load(str(tiny[family])) for family in FAMILIES}


def reference_inputs(reference, images: list[str], ids: list[int] | None = None) -> dict:
    """mlx-vlm's inputs for `chat(images)`, or for the token `ids` of a prompt showing `images`."""
    import mlx.core as mx
    from mlx_vlm.utils import prepare_inputs

    model, processor = reference
    rendered = processor.tokenizer.apply_chat_template(chat(images, with_sources=False), tokenize=False,
                                                       add_generation_prompt=True)
    inputs = prepare_inputs(processor, images=images, prompts=[rendered], padding=False)
    if ids is not None:
        inputs["input_ids"], inputs["attention_mask"] = mx.array([ids]), mx.ones((1, len(ids)), dtype=mx.int32)
    return inputs


def reference_greedy(reference, images: list[str], n: int, ids: list[int] | None = None) -> list[int]:
    """mlx-vlm's plain greedy generation (it runs past the end-of-sequence token: cut where ours stops)."""
    from mlx_vlm.generate import generate_step

    inputs = reference_inputs(reference, images, ids)
    steps = generate_step(inputs["input_ids"], reference[0], inputs["pixel_values"], inputs["attention_mask"],
                          image_grid_thw=inputs["image_grid_thw"], temperature=0.0, max_tokens=n)
    return [int(token) for (token, _), _ in zip(steps, range(n))]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_qwen_vl_image_prompt_scores_as_mlx_vlms_model_does(tiny, references, images, family):
    """Every position's logits over a prompt with two images equal mlx-vlm's forward (its vision tower, its
    M-RoPE layout, Qwen3-VL's deepstack); read as text they differ by more than 1."""
    model = references[family][0]
    inputs = reference_inputs(references[family], images)
    expected = np.array(model(inputs["input_ids"], pixel_values=inputs["pixel_values"],
                              image_grid_thw=inputs["image_grid_thw"]).logits[0])
    engine = mlx_spec.load(str(tiny[family]), drafter="off")
    ids, _, prompt_images = engine.encode_chat(chat(images))
    assert ids == inputs["input_ids"][0].tolist() and prompt_images.count == 2
    assert len(prompt_images.deep) == (0 if family == "qwen2_5_vl" else 2)
    logits = np.array(engine.target.forward_images(ids, 0, len(ids), prompt_images).logits)
    np.testing.assert_allclose(logits, expected, atol=2e-2, rtol=1e-3)
    engine.target.reset()
    assert np.abs(np.array(engine.target.forward(ids).logits) - expected).max() > 1.0


@pytest.mark.parametrize("drafter", ["draft-model", "tree", "ngram"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_over_qwen_vl_images_is_mlx_vlms_plain_greedy(tiny, references, images, family, drafter):
    """Speculative greedy decoding after an image prompt emits mlx-vlm's plain greedy tokens, with a layer-skip
    draft model (drafts accepted and rejected; the MoE's, whose random experts its skipped layers lack, is never
    accepted: see the next test), its token trees (two branches a node: their text model verifies a tree in one
    forward) and n-gram drafting."""
    options = {"draft-model": {"draft_model": str(tiny[f"{family}-draft"])}, "ngram": {"drafter": "ngram"},
               "tree": {"draft_model": str(tiny[f"{family}-draft"]), "tree_width": 2}}[drafter]
    engine = mlx_spec.load(str(tiny[family]), draft_len=3, **options)
    result = mlx_spec.generate(engine, chat(images), max_tokens=40)
    assert result.tokens == reference_greedy(references[family], images, 40)[:len(result.tokens)]
    assert result.stop_reason == "max_tokens" or result.tokens[-1] == 0
    if drafter == "draft-model" and family != "qwen3_vl_moe":
        assert 0 < result.stats.accepted < result.stats.drafted
    assert result.stats.drafted > 0


def test_a_qwen3_vl_moe_image_prompt_with_drafts_accepted_and_rejected(tiny, references, images):
    """Qwen3-VL MoE after an image prompt, drafting a prediction of its own greedy output with an edit in the middle:
    drafts accepted and rejected, the output mlx-vlm's plain greedy tokens."""
    expected = reference_greedy(references["qwen3_vl_moe"], images, 40)
    engine = mlx_spec.load(str(tiny["qwen3_vl_moe"]), drafter="off")
    edited = expected[:20] + [(t + 1) % 400 for t in expected[20:24]] + expected[24:]
    result = mlx_spec.generate(engine, chat(images), max_tokens=40, prediction=edited)
    assert result.tokens == expected[:len(result.tokens)] and 0 < result.stats.accepted < result.stats.drafted


def test_qwen3_vl_image_rows_in_a_batch_and_a_returning_turn(tiny, references, images):
    """Qwen3-VL image rows in a batch (their deepstack features added as they are prefilled alone) emit mlx-vlm's
    plain greedy tokens; a returning turn with the same image keeps what the cache holds and answers as mlx-vlm
    does over the whole conversation (its tokens as the engine keeps them)."""
    from mlx_spec.decode.rounds import Job

    reference = references["qwen3_vl"]
    engine = mlx_spec.load(str(tiny["qwen3_vl"]), draft_model=str(tiny["qwen3_vl-draft"]), draft_len=3)
    prompts = [engine.encode_chat(chat(images[:1])), engine.encode_chat(chat(images[1:]))]
    results = dict(engine.generate_many([Job(ids, max_tokens=24, images=shown) for ids, _, shown in prompts],
                                        batch_size=2))
    for i in (0, 1):
        assert results[i].tokens == reference_greedy(reference, images[i:i + 1], 24)[:len(results[i].tokens)]
    first, second, ids = returning_turn(engine, images[:1])
    assert second.stats.reused_prompt_tokens == first.stats.prompt_tokens + len(first.tokens) - 1
    assert second.tokens == reference_greedy(reference, images[:1], 10, ids)[:len(second.tokens)]


def test_image_conversations_through_the_prompt_cache(tiny, references, images):
    """Two Qwen3-VL conversations over different images, alternating through the prompt cache: a returning turn
    is served its own conversation's cache (stored while the other ran), alone and as a batch row, and answers as
    mlx-vlm does over the whole conversation; a turn that adds an image shifts the prompt's M-RoPE frame: it reuses
    nothing of its conversation's cache (at most the text before its first image, from a cache in its frame), and
    answers as mlx-vlm does too."""
    from mlx_spec.decode.rounds import Job

    reference = references["qwen3_vl"]
    engine = mlx_spec.load(str(tiny["qwen3_vl"]), draft_model=str(tiny["qwen3_vl-draft"]), draft_len=3)
    engine.cache_prompts(1 << 30)
    chats = [chat(images[:1]), chat(images[1:])]
    firsts = [mlx_spec.generate(engine, conversation, max_tokens=8) for conversation in chats]
    turns = [conversation + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "and?"}]
             for conversation, first in zip(chats, firsts)]
    ids = engine.encode_chat(turns[0])[0]
    second = mlx_spec.generate(engine, turns[0], max_tokens=8)
    assert second.stats.reused_prompt_tokens == firsts[0].stats.prompt_tokens + len(firsts[0].tokens) - 1
    assert second.tokens == reference_greedy(reference, images[:1], 8, ids)[:len(second.tokens)]
    ids, _, shown = engine.encode_chat(turns[1])
    [(_, row)] = engine.generate_many([Job(ids, max_tokens=8, images=shown)], batch_size=2)
    assert row.stats.reused_prompt_tokens == firsts[1].stats.prompt_tokens + len(firsts[1].tokens) - 1
    assert row.tokens == reference_greedy(reference, images[1:], 8, ids)[:len(row.tokens)]
    added = turns[1] + [{"role": "assistant", "content": row.text},  # its tall image saved no position; the wide one
                         {"role": "user", "content": [{"type": "image", "image": images[0]}]}]  # saves some
    ids, _, shown = engine.encode_chat(added)
    assert engine.encode_chat(turns[1])[2].saved == 0 < shown.saved
    third = mlx_spec.generate(engine, added, max_tokens=8)
    assert third.stats.reused_prompt_tokens <= ids.index(reference[0].config.image_token_id)
    assert third.tokens == reference_greedy(reference, images[::-1], 8, ids)[:len(third.tokens)]
