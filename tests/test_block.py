"""Block drafters (DFlash, DFlash2, DSpark): each round's draft distributions equal the reference
implementation's (mlx-vlm 0.7.10's DFlash / DFlash2 / DSpark models) on identical weights and independently
computed target features, on dense and hybrid targets; one-line refusals for drafters that cannot serve. Exact
decoding with them is in test_lossless.py, sampled output and acceptance in test_sampling.py and
test_acceptance.py."""

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, ModelledCostPolicy, assert_one_line_error, converted_q8, loaded, plain_greedy, run_cli
from tiny_block import as_speculators, layer_outputs, random_block_drafter

import mlx_spec
from mlx_spec.decode.batched import BatchedDecoder
from mlx_spec.decode.rounds import Job
from mlx_spec.models.dflash import load_block_drafter
from mlx_spec.core.sampling import SamplingParams


def reference(path, target_model):
    """mlx-vlm's model of the drafter in `path`, bound to `target_model`'s embedding and head, and its config."""
    from mlx_vlm.speculative.drafters.dflash2.config import DFlash2Config
    from mlx_vlm.speculative.drafters.dflash2.dflash2 import DFlash2DraftModel
    from mlx_vlm.speculative.drafters.dspark.config import DSparkConfig
    from mlx_vlm.speculative.drafters.dspark.dspark import DSparkDraftModel
    from mlx_vlm.speculative.drafters.qwen3_dflash.config import DFlashConfig
    from mlx_vlm.speculative.drafters.qwen3_dflash.dflash import DFlashDraftModel

    config = json.loads((path / "config.json").read_text())
    options = config["dflash_config"]
    model = (DSparkDraftModel(DSparkConfig.from_dict(config)) if "markov_rank" in options
             else DFlash2DraftModel(DFlash2Config.from_dict(config)) if "selector_top_k" in options
             else DFlashDraftModel(DFlashConfig.from_dict(config)))
    model.load_weights(list(model.sanitize(mx.load(str(path / "model.safetensors"))).items()))
    DFlashDraftModel.bind(model, target_model)  # DSpark's own bind also asks for mlx-vlm's target classes
    return model, config


def reference_distributions(model, config, anchor: int, drafted: list[int], features, cache):
    """The reference's distribution at each of the block's draft positions (T = 1) after new context `features`,
    each DSpark / DFlash2 position's after the token drafted before it (the anchor before the first): DFlash2's over
    its selector's candidates, scored as its `select` scores them; and DSpark's confidences (None without)."""
    options = config["dflash_config"]
    dspark, k = "markov_rank" in options, len(drafted)
    block = mx.array([[anchor] + [options["mask_token_id"]] * (k - dspark)])  # DSpark: samples from the anchor
    hidden = model._hidden(block, features[None], cache)
    hidden = hidden if dspark else hidden[:, 1:]
    logits = model._logits(hidden)[0]
    previous = mx.array([anchor, *drafted[:-1]])
    confidence = None
    if dspark:
        logits = mx.concatenate([model.markov_head.apply_step_logits(logits[i:i + 1], previous[i:i + 1])
                                 for i in range(k)])
        if model.confidence_head is not None:
            confidence = np.array(model.confidence(hidden, mx.array([anchor]), mx.array([drafted]))[0])
    if "selector_top_k" in options:
        selector = model.candidate_selector
        candidates = mx.argpartition(logits, -selector.top_k, axis=-1)[:, -selector.top_k:]
        projected = selector.hidden_projection(hidden)[0]
        rows = []
        for i in range(k):
            edges = mx.sum(selector.predecessor_codebook(previous[i:i + 1]) * projected[i]
                           * selector.successor_codebook(candidates[i]), axis=-1)
            row = np.zeros(logits.shape[-1], dtype=np.float32)
            row[np.array(candidates[i])] = np.array(mx.softmax(logits[i, candidates[i]] + edges, axis=-1))
            rows.append(row)
        return np.stack(rows), None
    return np.array(mx.softmax(logits, axis=-1)), confidence


CASES = [("qwen3", {}), ("qwen3_5", {}), ("qwen3", {"kind": "dspark", "confidence": True}),
         ("qwen3_5", {"kind": "dspark"}),
         ("qwen3", {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6, "causal": True}),
         ("llama", {}), ("qwen3_5_moe", {"kind": "dspark"}), ("qwen3_next", {}), ("qwen3", {"kind": "dflash2"}),
         ("qwen3_5", {"kind": "dflash2"})]


@pytest.mark.parametrize("family,options", CASES)
def test_draft_distributions_equal_the_reference_round_after_round(tiny, tmp_path, family, options):
    path = random_block_drafter(tmp_path / "drafter", tiny[family], **options)
    assert_rounds_match_the_reference(tiny[family], path, path)


SPECULATORS = [("qwen3", {}, False), ("qwen3_5", {"kind": "dspark", "confidence": True}, False),
               ("qwen3", {}, True), ("qwen3_5", {"kind": "dspark"}, True)]


@pytest.mark.parametrize("family,options,reduced", SPECULATORS)
def test_speculators_layout_drafts_what_the_reference_drafts_from_the_original(tiny, tmp_path, family, options,
                                                                                reduced):
    """A drafter converted to speculators' layout (shifted layer ids, nested config, the verifier's embedding and
    head, a reduced vocabulary with its d2t map) drafts what the reference drafts from the original: over a
    reduced vocabulary, the reference's distribution restricted to the kept tokens."""
    original = random_block_drafter(tmp_path / "original", tiny[family], **options)
    vocab = json.loads((tiny[family] / "config.json").read_text())
    vocab = vocab.get("text_config", vocab)["vocab_size"]
    keep = sorted(np.random.default_rng(1).choice(vocab, vocab // 3, replace=False).tolist()) if reduced else None
    path = as_speculators(original, tiny[family], tmp_path / "speculators", keep)
    assert_rounds_match_the_reference(tiny[family], path, original, keep)


SLIDING = {  # z-lab's window W sees W - 1 context positions (moving with the query when causal), speculators' W
    # sees W (fixed at the anchor; its sliding layers causal inside the block unless sliding_window_non_causal)
    "non-causal window": ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6},
                          {"sliding_window": 5, "sliding_window_non_causal": True}),
    "causal sliding layers": ({"causal": True},
                              {"layer_types": ["sliding_attention"] * 2, "sliding_window": 4096}),
}


@pytest.mark.parametrize("case", SLIDING)
def test_speculators_sliding_layers_attend_as_published(tiny, tmp_path, case):
    """speculators' sliding-window masks (`create_anchor_block_mask_mod`) against the reference on the z-lab
    drafter they equal: a window fixed at the anchor, and causal sliding layers beside bidirectional full ones."""
    original_options, edit = SLIDING[case]
    original = random_block_drafter(tmp_path / "original", tiny["qwen3"], **original_options)
    path = as_speculators(original, tiny["qwen3"], tmp_path / "speculators")
    config = json.loads((path / "config.json").read_text())
    config["transformer_layer_config"].update({k: v for k, v in edit.items() if k != "sliding_window_non_causal"})
    config["sliding_window_non_causal"] = edit.get("sliding_window_non_causal", False)
    (path / "config.json").write_text(json.dumps(config))
    assert_rounds_match_the_reference(tiny["qwen3"], path, original)


def rms_rope(x: np.ndarray, norm: np.ndarray, positions: np.ndarray, theta: float = 10000.0) -> np.ndarray:
    """Per-head RMS norm (eps 1e-6), then the rotary embedding of the halves (Hugging Face's `rotate_half`)."""
    x = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * norm
    half = x.shape[-1] // 2
    angles = positions[:, None, None] * theta ** (-np.arange(half) / half)
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def zlab_attention(attention, context: np.ndarray, block: np.ndarray, causal: bool | None,
                   window: int) -> np.ndarray:
    """z-lab's `model.py` sliding attention (`_attention_mask`, transcribed in NumPy over the whole context) of
    `block` (n, H) after `context` (L, H), both from position 0: the query at p sees keys within window - 1 of p,
    causal unless `causal` is False."""
    w = {name: np.array(getattr(attention, name).weight) for name in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                                       "q_norm", "k_norm")}
    context_len, n = len(context), len(block)
    both = np.concatenate([context, block])
    positions = np.arange(context_len + n)
    d = w["q_norm"].shape[0]
    q = rms_rope((block @ w["q_proj"].T).reshape(n, -1, d), w["q_norm"], positions[context_len:])
    k = rms_rope((both @ w["k_proj"].T).reshape(len(both), -1, d), w["k_norm"], positions)
    v = (both @ w["v_proj"].T).reshape(len(both), -1, d)
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    query, key = positions[context_len:, None], positions[None]
    visible = (key <= query) if causal is None else (key - query < window)  # both ways when non-causal
    visible &= query - key < window
    scores = np.einsum("qhd,khd->hqk", q, k) * d ** -0.5
    scores = np.where(visible[None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", weights, v).reshape(n, -1) @ w["o_proj"].T


@pytest.mark.parametrize("causal", [None, False])
def test_zlab_sliding_layers_attend_as_its_reference_does(tiny, tmp_path, causal):
    """A z-lab sliding layer against z-lab's `model.py` (`zlab_attention`)."""
    path = random_block_drafter(tmp_path / "drafter", tiny["qwen3"], layer_types=["sliding_attention"] * 2,
                                sliding_window=4, causal=causal)
    model = load_block_drafter(path, json.loads((path / "config.json").read_text()))
    attention, (context_len, n) = model.layers[0].self_attn, (9, 4)
    rng = np.random.default_rng(0)
    context, block = (rng.standard_normal((1, size, model.config["hidden_size"])).astype(np.float32)
                      for size in (context_len, n))
    cache = model.make_cache()[0]
    cache.update_and_fetch(*attention.project(mx.array(context), model.rope, 0))
    out = np.array(attention(mx.array(block), model.rope, cache, context_len))[0]
    np.testing.assert_allclose(out, zlab_attention(attention, context[0], block[0], causal, 4), rtol=1e-4, atol=1e-5)


def assert_rounds_match_the_reference(target_path, path, reference_path, keep=None):
    """Three rounds of three drafts, the target keeping one, none, then all of them (and its own next token):
    the drafter's context grows by the kept positions only; the reference drafts each round from a fresh cache
    given the outputs of the target layers over the whole sequence, computed by one mlx-lm forward from an empty
    cache (mlx-vlm's rotating caches would show sliding layers a varying number of context positions)."""
    engine = mlx_spec.load(str(target_path), draft_model=str(path))
    drafter, target = engine.drafter, engine.target
    model, config = reference(reference_path, loaded(str(target_path))[0])
    context = engine.encode(PROMPT)[:12]
    drafter.begin(context, target.prefill(context[:-1]))
    for round_, kept in enumerate([1, 0, 3]):
        draft = drafter.propose(context, 3, SamplingParams(temperature=1.0), mx.random.key(round_))
        features = layer_outputs(loaded(str(target_path))[0], context[:-1],
                                 config["dflash_config"]["target_layer_ids"])[0]
        expected, confidence = reference_distributions(model, config, context[-1], draft.tokens.tolist(), features,
                                                       model.make_cache())
        if keep is not None:  # the reference restricted to the draft vocabulary
            restricted = np.zeros_like(expected)
            restricted[:, keep] = expected[:, keep] / expected[:, keep].sum(axis=-1, keepdims=True)
            expected = restricted
            assert set(draft.tokens.tolist()) <= set(keep)
        with np.errstate(divide="ignore"):  # log-probabilities: random drafters' distributions are near one-hot
            np.testing.assert_allclose(np.log(np.array(draft.q)), np.log(expected), rtol=1e-4, atol=1e-4)
        if confidence is not None or draft.confidence is not None:
            np.testing.assert_allclose(np.array(draft.confidence), confidence, atol=1e-6)
        step = target.forward(mx.concatenate([mx.array(context[-1:]), draft.tokens]))
        target.rollback(3 - kept)
        context = context + draft.tokens.tolist()[:kept] + [int(mx.argmax(step.logits[kept]).item())]
        drafter.accept(context, kept, step.first(kept + 1))


class Chosen(ModelledCostPolicy):
    """The adaptive policy on a modelled cost (a plain step 1, each draft 0.1), keeping the lengths it chose."""

    def __init__(self, max_len):
        super().__init__(max_len, per_draft=0.1)
        self.chosen = []

    def next_draft_len(self, remaining, outlook=None):
        self.chosen.append(super().next_draft_len(remaining, outlook))
        return self.chosen[-1]


@pytest.mark.parametrize("lone_row", [False, True], ids=["alone", "lone-batch-row"])
@pytest.mark.parametrize("bias,longest", [(-6.0, 1), (6.0, 3)])
def test_dspark_confidence_cuts_blocks_short_and_decoding_stays_exact(tiny, tmp_path, bias, longest, lone_row):
    """The trained DSpark drafter given a confidence head: one that expects every draft rejected (sigmoid(-6) =
    0.25%) leaves one draft a round, however many the policy chose; one that expects them all accepted leaves the
    policy's length. Greedy output is the target's own either way, with drafts accepted and rejected; the same
    for a lone row of a batch (a server's lone request), whose rounds the single-sequence policy decides."""
    path = shutil.copytree(tiny["qwen3_5-dspark"], tmp_path / "drafter")
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"].update(enable_confidence_head=True, confidence_head_with_markov=True)
    (path / "config.json").write_text(json.dumps(config))
    weights = dict(mx.load(str(path / "model.safetensors")))
    width = config["hidden_size"] + config["dflash_config"]["markov_rank"]
    weights["confidence_head.proj.weight"] = mx.zeros((1, width))
    weights["confidence_head.proj.bias"] = mx.full((1,), bias)
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    engine = mlx_spec.load(str(tiny["qwen3_5"]), draft_model=str(path))
    engine.next_policy = policy = Chosen(engine.max_draft_len)
    ids = engine.encode(PROMPT)
    if lone_row:
        decoder = BatchedDecoder(engine.target.model, engine.tokenizer, engine.drafter, None, engine.max_draft_len,
                                 engine.target.read_hidden, hidden_tail=engine.target.hidden_tail, alone=policy)
        waiting = [(0, Job(ids, max_tokens=48))]
        events = [event for _, event in decoder.stream(lambda: waiting.pop() if waiting else None, 8)]
    else:
        events = list(mlx_spec.stream(engine, ids, max_tokens=48))
    assert events[-1].tokens == plain_greedy(tiny["qwen3_5"], ids, 48)
    drafted = [e.draft_len for e in events if isinstance(e, mlx_spec.Round)]
    assert max(policy.chosen) > 1 and max(drafted) == min(longest, max(policy.chosen))
    assert 0 < events[-1].stats.accepted < events[-1].stats.drafted


def test_status_names_the_block_drafter_and_its_shape(tiny, tmp_path):
    """A DFlash drafter drafts DDTrees where the target verifies trees; a hybrid target and a DSpark drafter keep
    chains, and say why."""
    dspark = random_block_drafter(tmp_path / "dspark", tiny["qwen3"], kind="dspark", block_size=6)
    dflash = random_block_drafter(tmp_path / "dflash", tiny["qwen3_5"])
    status = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(dspark), tree_width=2).status()
    assert (status.drafter, status.max_draft_len) == ("dspark", 5)
    assert status.shape.startswith("chain (no tree: dspark is a dspark drafter: each draft depends on the one")
    assert mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-dflash"]), tree_width=3).status().shape \
        == "tree of width 3"
    status = mlx_spec.load(str(tiny["qwen3_5"]), draft_model=str(dflash), tree_width=3).status()
    assert status.drafter == "dflash" and "recurrent layers" in status.shape


@pytest.mark.parametrize("budget", [1, 5, 12])
def test_ddtrees_hold_the_prefixes_the_reference_builds(budget):
    """The same most probable prefixes as mlx-vlm's DDTree (Algorithm 1) for the same per-position logits, each
    after its parent, in order of depth."""
    from mlx_vlm.speculative.ddtree import build_ddtree

    from mlx_spec.drafters.dflash import best_first_tree

    logits = mx.random.normal((4, 50), key=mx.random.key(budget)) * 2
    draft = best_first_tree(logits, budget)
    tokens = draft.tokens.tolist()
    paths = {tuple(tokens[n] for n in draft.ancestors(node)) for node in range(len(tokens))}
    reference = build_ddtree(mx.concatenate([mx.zeros((1, 50)), logits])[None], budget)
    assert paths == {node.token_ids for node in reference} and len(tokens) == budget
    assert all(parent < node for node, parent in enumerate(draft.parents))
    assert draft.depths() == sorted(draft.depths())


def test_sampled_sequences_follow_the_target_under_ddtrees(tiny):
    """As test_sampling's test for chains: three tokens at T=1, top-k 2, from DDTrees of 2 x 2 nodes."""
    from test_sampling import assert_follows, exact_sequences

    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-dflash"]), draft_len=2, tree_width=2)
    prompt = engine.encode(PROMPT)[:32]
    exact, drafted, accepted = exact_sequences(tiny["qwen3"], prompt, 3, 2), 0, 0
    observed = dict.fromkeys(exact, 0)
    # seeds 0..1199 draw a 1-in-1400 sample (p = 0.0007); 12,000 seeds from 200,000 give p = 0.80
    for seed in range(10_000, 11_200):
        result = mlx_spec.generate(engine, prompt, max_tokens=3, temperature=1.0, top_k=2, seed=seed)
        observed[tuple(result.tokens)] += 1
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert 0 < accepted < drafted
    assert_follows(observed, exact, 1200)


def edited(source, dest, edit):
    shutil.copytree(source, dest)
    config = json.loads((dest / "config.json").read_text())
    edit(config)
    (dest / "config.json").write_text(json.dumps(config))
    return dest


REFUSALS = [
    ("llama", lambda c: None, ("was not trained for", "hidden size")),
    ("qwen3", lambda c: c["dflash_config"].pop("mask_token_id"), ("no mask token", "re-download")),
    ("qwen3", lambda c: c["dflash_config"].update(layer_fusion_weights=[[1.0] * 5]), ("DFly", "does not read")),
    ("qwen3", lambda c: c.update(layer_types=["sliding_attention", "full_attention"]), ("sliding_window", "re-down")),
    ("qwen3", lambda c: c.pop("block_size"), ("lacks block_size", "re-download")),
    ("qwen3", lambda c: c["dflash_config"].update(projector_type="dspark", markov_rank=8, markov_head_type="rnn"),
     ("Markov head", "vanilla")),
]


@pytest.mark.parametrize("target,edit,fragments", REFUSALS)
def test_drafters_that_cannot_serve_are_refused_in_one_line(tiny, tmp_path, target, edit, fragments):
    path = edited(random_block_drafter(tmp_path / "made", tiny["qwen3"]), tmp_path / "drafter", edit)
    proc = run_cli("generate", "--model", str(tiny[target]), "--draft-model", str(path), "--prompt", "x",
                   "--max-tokens", "2")
    assert_one_line_error(proc, *fragments)


def test_pickled_weights_are_refused_in_one_line(tiny, tmp_path):
    path = random_block_drafter(tmp_path / "drafter", tiny["qwen3"])
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(path), "--prompt", "x",
                   "--max-tokens", "2")
    assert_one_line_error(proc, "pytorch_model.bin", "safetensors")


def test_a_converted_quantized_drafter_drafts_exactly(tiny, tmp_path):
    """`convert -q` casts and quantizes what the group size divides (the Markov head's rank-16 map stays float)."""
    out = tmp_path / "q8"
    assert converted_q8(tiny["qwen3_5-dspark"], out)["quantization"] == {"group_size": 32, "bits": 8}
    engine = mlx_spec.load(str(tiny["qwen3_5"]), draft_model=str(out), draft_len=3)
    model = engine.drafter.model
    assert type(model.fc).__name__ == "QuantizedLinear" and type(model.markov_head.markov_w2).__name__ == "Linear"
    ids = engine.encode(PROMPT)
    result = engine.generate(ids, max_tokens=48)
    assert result.tokens == plain_greedy(tiny["qwen3_5"], ids, 48)
    assert 0 < result.stats.accepted < result.stats.drafted


@pytest.mark.parametrize("family,drafter,options,quantized", [("qwen3", "qwen3-dflash", {}, False),
                                                              ("qwen3", "qwen3-dflash", {"tree_width": 3}, False),
                                                              ("qwen3_5", "qwen3_5-dspark", {}, True)])
def test_speculators_layout_with_a_reduced_vocabulary_decodes_exactly(tiny, tmp_path, family, drafter, options,
                                                                       quantized):
    """Trained drafters in speculators' layout, over a draft vocabulary of half the tokens (the reference's among
    them), decode greedily as plain decoding, with drafts both accepted and rejected; `convert -q` keeps d2t."""
    engine = mlx_spec.load(str(tiny[family]), drafter="off")
    ids = engine.encode(PROMPT)
    expected = plain_greedy(tiny[family], ids, 64)
    vocab = len(engine.tokenizer.get_vocab())
    others = np.random.default_rng(2).permutation(vocab).tolist()
    keep = sorted(set(expected) | set(others[:vocab // 2 - len(set(expected))]))
    path = as_speculators(tiny[drafter], tiny[family], tmp_path / "speculators", keep)
    if quantized:
        converted_q8(path, tmp_path / "q8")
        path = tmp_path / "q8"
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(path), draft_len=3, **options)
    assert engine.drafter.name == json.loads((path / "config.json").read_text())["speculators_model_type"]
    result = engine.generate(ids, max_tokens=64)
    assert result.tokens == expected
    assert 0 < result.stats.accepted < result.stats.drafted


def test_long_prompts_stream_their_features_and_extended_prompts_keep_them(tiny, tmp_path):
    """A prompt of several prefill chunks hands the drafter each chunk's features as the target runs it (never
    all at once); a second prompt extending the first reuses the target's cache and the drafter's features of
    the first: drafts equal the reference's from the whole context both times."""
    path = random_block_drafter(tmp_path / "drafter", tiny["qwen3"])
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(path))
    drafter, target = engine.drafter, engine.target
    target_model = loaded(str(tiny["qwen3"]))[0]
    model, config = reference(path, target_model)
    ids = (engine.encode(PROMPT) * 100)[:1300]
    chunks = []

    def absorb(start, hidden):
        chunks.append((start, hidden.shape[0]))
        drafter.absorb(start, hidden)

    def assert_drafts_match(context):
        draft = drafter.propose(context, 3, SamplingParams(temperature=1.0), mx.random.key(0))
        features = layer_outputs(target_model, context[:-1], config["dflash_config"]["target_layer_ids"])[0]
        expected, _ = reference_distributions(model, config, context[-1], draft.tokens.tolist(), features,
                                              model.make_cache())
        with np.errstate(divide="ignore"):
            np.testing.assert_allclose(np.log(np.array(draft.q)), np.log(expected), rtol=1e-4, atol=1e-4)

    first, second = ids[:1100], ids
    step = target.prefill(first[:-1], absorb=absorb)
    assert step.hidden is None and step.absorbed == 1099 and [n for _, n in chunks] == [512, 512, 75]
    drafter.begin(first, step)
    assert_drafts_match(first)
    chunks.clear()
    step = target.prefill(second[:-1], cached=first[:-1], absorb=absorb)
    assert step.start == 1099 and chunks == [(1099, 200)] and step.absorbed == 200
    drafter.begin(second, step)
    assert_drafts_match(second)


def test_a_batch_row_streams_a_long_prompts_features_and_drafts_as_alone(tiny, monkeypatch):
    """A long prompt joining a batch (three prefill chunks) hands its drafter each chunk's features as the target
    runs it, as alone; with a pinned draft length every row then drafts what it drafts alone (the trained block
    drafter: drafts accepted and rejected), and greedy rows decode as plain decoding does."""
    from mlx_spec.drafters.dflash import BlockDrafter

    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-dflash"]), draft_len=3)
    chunks, absorb = {}, BlockDrafter.absorb  # each row's drafter's: (first position, positions)
    monkeypatch.setattr(BlockDrafter, "absorb", lambda self, start, hidden: (
        chunks.setdefault(self, []).append((start, hidden.shape[0])), absorb(self, start, hidden)))
    prompts = [(engine.encode(PROMPT) * 100)[:1100], engine.encode(PROMPT), engine.encode("def f(x):")]
    jobs = [Job(prompt, SamplingParams(temperature=0.7 if i == 2 else 0.0), 24, seed=i)
            for i, prompt in enumerate(prompts)]
    results = dict(engine.generate_many(jobs, 3))
    assert sorted(chunks.values()) == sorted([[(0, 512), (512, 512), (1024, 75)], [(0, len(prompts[1]) - 1)],
                                              [(0, len(prompts[2]) - 1)]])
    for i, job in enumerate(jobs):
        alone = engine.generate(job.prompt, job.params, job.max_tokens, [], job.seed)
        assert results[i].tokens == alone.tokens and results[i].from_draft == alone.from_draft, i
        if job.params.greedy:
            assert alone.tokens == plain_greedy(tiny["qwen3"], job.prompt, job.max_tokens), i
    assert 0 < sum(r.stats.accepted for r in results.values()) < sum(r.stats.drafted for r in results.values())
