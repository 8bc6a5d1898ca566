"""Block drafters in a batch (`BlockRows`): every drafting row's block in one drafter forward, each row's draft
distributions the reference's (mlx-vlm's DFlash / DFlash2 / DSpark models, as in test_block.py) over that row's
own context, computed by mlx-lm's forward alone, round after round with rows of different lengths, drafting
different lengths, keeping different counts; rows leaving, joining, and resuming what the prompt cache held."""

import json

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, loaded
from test_block import reference, reference_distributions, zlab_attention
from tiny_block import as_speculators, layer_outputs, random_block_drafter

import mlx_spec
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.models.dflash import BlockDrafterModel, load_block_drafter
from mlx_spec.runners.context_rows import ContextRows

SLIDING = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6}
CASES = {"dflash": ("qwen3", {}), "dspark": ("qwen3_5", {"kind": "dspark", "confidence": True}),
         "dflash2": ("qwen3", {"kind": "dflash2"}), "causal sliding": ("qwen3", {**SLIDING, "causal": True}),
         "speculators' window": ("qwen3", SLIDING)}  # a window fixed at the anchor, as the reference's
ROUNDS = [([3, 0, 2], [1, 0, 2]), ([1, 3, 3], [1, 3, 0]), ([2, 2, 0], [0, 2, 0]), ([3, 3, 3], [3, 1, 2])]


def assert_reference_drafts(draft, model, config, context, features):
    expected, confidence = reference_distributions(model, config, context[-1], draft.tokens.tolist(), features,
                                                   model.make_cache())
    with np.errstate(divide="ignore"):  # log-probabilities: random drafters' distributions are near one-hot
        np.testing.assert_allclose(np.log(np.array(draft.q)), np.log(expected), rtol=1e-4, atol=1e-4)
    if confidence is not None or draft.confidence is not None:
        np.testing.assert_allclose(np.array(draft.confidence), confidence, atol=1e-6)


def non_causal_speculators(original, target_path, tmp_path):
    """`original` in speculators' layout, its sliding window non-causal and fixed at the anchor (as
    test_block.py's "non-causal window")."""
    path = as_speculators(original, target_path, tmp_path / "speculators")
    config = json.loads((path / "config.json").read_text())
    config["transformer_layer_config"]["sliding_window"] = 5
    config["sliding_window_non_causal"] = True
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("case", CASES)
def test_every_rows_block_drafts_in_one_forward_what_the_reference_drafts_for_it(tiny, tmp_path, monkeypatch, case):
    family, options = CASES[case]
    original = random_block_drafter(tmp_path / "drafter", tiny[family], **options)
    path = original if case != "speculators' window" else non_causal_speculators(original, tiny[family], tmp_path)
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(path))
    target = loaded(str(tiny[family]))[0]
    model, config = reference(original, target)
    ids = config["dflash_config"]["target_layer_ids"]

    def features(tokens: list[int]) -> mx.array:  # the target layers' outputs over all but the last token
        return layer_outputs(target, tokens[:-1], ids)[0]

    forwards = []
    over_rows = BlockDrafterModel.over_rows
    monkeypatch.setattr(BlockDrafterModel, "over_rows", lambda self, *a: forwards.append(a[0].shape[0])
                        or over_rows(self, *a))
    rows = engine.drafter.batched(None)
    prompt = engine.encode(PROMPT)
    contexts = [prompt[:12], prompt[:7], prompt[3:19]]
    for context in contexts:  # each joins with its prompt's features (the target prefilled all but its last)
        rows.join(context, features(context))
    params = [SamplingParams(temperature=1.0)] * 3
    for round_, (lengths, kept) in enumerate(ROUNDS):
        if round_ == 2:  # the middle row leaves, a new one joins behind the others
            rows.select([0, 2])
            contexts = [contexts[0], contexts[2], prompt[5:9]]
            rows.join(contexts[2], features(contexts[2]))
        drafts = rows.propose(contexts, lengths, params, [mx.random.key(round_ * 3 + i) for i in range(3)])
        assert forwards.pop() == sum(k > 0 for k in lengths) and not forwards  # every drafting row, one forward
        news, hidden = [], []
        for context, draft, k, keep in zip(contexts, drafts, lengths, kept):
            assert draft.tokens.shape[0] == k
            if k:
                assert_reference_drafts(draft, model, config, context, features(context))
            tokens = context + draft.tokens.tolist()[:keep]
            tokens.append(int(mx.argmax(layer_outputs(target, tokens, ids)[1][-1]).item()))  # the target's next
            news.append(tokens)
            hidden.append(features(tokens)[len(context) - 1:])  # at the inputs it kept
        width = max(h.shape[0] for h in hidden)
        rows.accept(news, kept, mx.stack([mx.pad(h, [(0, width - h.shape[0]), (0, 0)]) for h in hidden]))
        contexts = news

    # a row's context as the prompt cache keeps it, resumed by a row joining with a longer prompt
    held = rows.row_state(1, contexts[1])
    longer = contexts[1] + prompt[:4]
    resumed = engine.drafter.batched(None)
    resumed.join(longer, features(longer)[len(contexts[1]) - 1:], held=held)
    draft = resumed.propose([longer], [3], params[:1], [mx.random.key(99)])[0]
    assert_reference_drafts(draft, model, config, longer, features(longer))


@pytest.mark.parametrize("causal", [None, False])
def test_rows_with_holes_attend_as_zlabs_sliding_layers_do_for_each_row(tiny, tmp_path, causal):
    """z-lab's moving windows (`zlab_attention`, which mlx-vlm's reference does not follow) over two rows side by
    side: contexts of 9 and 5 positions, the shorter padded before and both with holes between, and blocks of 4
    and 2 positions, padded to 4."""
    path = random_block_drafter(tmp_path / "drafter", tiny["qwen3"], layer_types=["sliding_attention"] * 2,
                                sliding_window=4, causal=causal)
    model = load_block_drafter(path, json.loads((path / "config.json").read_text()))
    attention = model.layers[0].self_attn
    rng = np.random.default_rng(0)
    contexts = [rng.standard_normal((length, model.config["hidden_size"])).astype(np.float32) for length in (9, 5)]
    blocks = [rng.standard_normal((n, model.config["hidden_size"])).astype(np.float32) for n in (4, 2)]
    slots = [[0, 1, 2, None, 3, 4, 5, None, 6, 7, 8], [None, None, None, 0, 1, None, 2, None, None, 3, 4]]
    keys, values, positions = [], [], []
    for context, row in zip(contexts, slots):
        k, v = attention.project(mx.array(context)[None], model.rope, 0)
        index = mx.array([0 if p is None else p for p in row])
        keys.append(mx.take(k, index, axis=2))  # a hole holds another slot's keys: no query may see them
        values.append(mx.take(v, index, axis=2))
        positions.append([-1 if p is None else p for p in row])
    padded = mx.stack([mx.array(np.pad(b, [(0, 4 - len(b)), (0, 0)])) for b in blocks])
    out = attention.over_rows(padded, model.rope, mx.concatenate(keys), mx.concatenate(values),
                              mx.array(positions), mx.array([9, 5]), mx.array([4, 2]))
    for i, (context, block) in enumerate(zip(contexts, blocks)):
        np.testing.assert_allclose(np.array(out[i, :len(block)]), zlab_attention(attention, context, block, causal, 4),
                                   rtol=1e-4, atol=1e-5)


def test_context_rows_keep_each_rows_positions_in_order_through_holes_joins_leaves_and_squeezes():
    """Rows appending different counts a round (holes), joining longer and shorter, leaving, and the buffer
    squeezing its holes out as it grows (past 256 slots): each row's context without holes is what it appended,
    in order, against a list per row."""
    rng = np.random.default_rng(0)
    rows, expected, starts = ContextRows(), [], []

    def join(length: int) -> None:
        keys = rng.standard_normal((1, 1, length, 2)).astype(np.float32)
        rows.add_row([(mx.array(keys), mx.array(-keys))], np.arange(10, 10 + length))
        expected.append(list(keys[0, 0]))
        starts.append(10 + length)

    for length in (3, 0, 7, 1):
        join(length)
    for round_ in range(150):
        counts = [4 if i == round_ % len(expected) else 1 for i in range(len(expected))]
        keys = rng.standard_normal((len(expected), 1, 4, 2)).astype(np.float32)
        positions = np.array([[start + j if j < count else -1 for j in range(4)]
                              for start, count in zip(starts, counts)])
        rows.append([(mx.array(keys), mx.array(-keys))], positions)
        for i, count in enumerate(counts):
            expected[i] += list(keys[i, 0, :count])
            starts[i] += count
        if round_ == 100:  # the second row leaves, another joins
            rows.select([0, 2, 3])
            del expected[1], starts[1]
            join(30)
    assert rows.used < 500  # squeezed once its holes filled half of 256 slots: 607 without
    for i, want in enumerate(expected):
        (keys, values), = rows.row(i)[0]
        assert rows.row(i)[1].tolist() == list(range(starts[i] - len(want), starts[i]))
        np.testing.assert_array_equal(np.array(keys)[0, 0], np.array(want))
        np.testing.assert_array_equal(np.array(values)[0, 0], -np.array(want))
    (keys, _), = rows.rows([2, 0])[0]
    positions = np.array(rows.rows([2, 0])[1])
    np.testing.assert_array_equal(np.array(keys)[0, 0][positions[0] >= 0], np.array(expected[2]))
