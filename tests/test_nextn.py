"""The nextn MTP layers of DeepSeek-V3 (MLA + MoE), DeepSeek-V3.2 and GLM-5 (its sparse attention), GLM-4.5 (GQA
+ MoE), GLM-4.7-Flash (MLA + GLM's MoE), MiMo-7B (Qwen2's block, Qwen3.5's equations), K-EXAONE (Qwen3.5's names and
equations, a dense global-attention block), ERNIE 4.5 MoE (its tensors beside the target's, scored through the
target's final norm), MiMo-V2-Flash (a sliding-window block with attention sinks), Step 3.5 Flash (its own head,
zero-centred norms), LongCat-Flash (its own embedding, an MLA + dense block under `model.mtp.*`) and Ling 2.5 / 3.0
(an MLA + MoE block over a target with gated linear or delta attention layers), Nemotron-H (an attention and an expert
sublayer over a Mamba 2 target), Kimi K3 (its config nested, its tensors under `language_model.`, over a target with
delta attention layers and attention residuals): the layer against a NumPy
transcription of each family's equations, exact drafting with rollbacks of every cache, convert keeping and grafting
the layer, refusals."""

import importlib
import json
import shutil
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from helpers import assert_one_line_error, edited_copy, plain_greedy, run_cli
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import CacheList, KVCache
from mlx_lm.utils import load_model
from tiny import HEAD_TEXTS
from tiny_nextn import HEAD, NEXTN_FAMILIES, depth, language, target_states

import mlx_spec

FAMILIES = list(NEXTN_FAMILIES)


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


# Each family's layer as vLLM's *_mtp.py computes it: where its tensors are ({n}: num_hidden_layers), the names of
# its embedding norm, hidden norm, projection and output norm, whether the projection reads [hidden, embedding],
# whether the state fed back is the output norm's (else the block's), whether it reads the target's pre-norm state;
# and where its block is not stored as a layer past the last, the mlx-lm layer it is and where its tensors are.
REFERENCE = {
    "deepseek_v3": ("model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "shared_head.norm"), False, False, False),
    # vLLM's deepseek_mtp.py over DeepSeek-V3.2's (and GLM-5's) sparse attention, its indexer with a cache of its own
    "deepseek_v32": ("model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "shared_head.norm"), False, False, False),
    "glm_moe_dsa": ("model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "shared_head.norm"), False, False, False),
    "glm4_moe": ("model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "shared_head.norm"), False, False, False),
    "glm4_moe_lite": ("model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "shared_head.norm"), False, False, False),
    "mimo": ("model.mtp_layers.0.", ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm"),
             True, True, True),
    "exaone_moe": ("mtp.", ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc", "norm"), False, True, False),
    # transformers' Ernie4_5_MoeForCausalLM MTP (and Baidu's PaddleFormers): the output norm is model.norm
    "ernie4_5_moe": ("model.", ("mtp_emb_norm.0", "mtp_hidden_norm.0", "mtp_linear_proj.0", "norm"),
                     False, False, False),
    # vLLM's MiMoV2MTPLayer; the target's pre-norm state, as Xiaomi's SGLang code (multi-layer EAGLE) hands it
    "mimo_v2_flash": ("model.mtp.layers.0.", ("enorm", "hnorm", "eh_proj", "final_layernorm"), False, True, True),
    # vLLM's Step3p5AMultiTokenPredictorLayer: GemmaRMSNorms, its own shared_head, the target's pre-norm state
    "step3p5": ("model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "transformer.shared_head.norm"), False, False, True),
    # vLLM's LongCatMultiTokenPredictorLayer: its own embedding (model.mtp.embed_tokens), final_layernorm(h + res)
    # fed back and scored by the target's lm_head
    "longcat_flash": ("model.mtp.", ("layers.0.enorm.m", "layers.0.hnorm.m", "layers.0.eh_proj", "norm"), False, True,
                      False),
    # vLLM's BailingMoeV25MultiTokenPredictorLayer: final_layernorm(h + res) fed back, scored by the target's lm_head
    "bailing_hybrid": ("model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "final_layernorm"), False, True, False),
    # vLLM's BailingMoeV3MultiTokenPredictorLayer: the same, Ling 3.0's gated MLA
    "bailing_moe_v3": ("model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "final_layernorm"), False, True, False),
    # vLLM's NemotronHMultiTokenPredictor: its first sublayer projects, its last ("*E": the second) norms the output
    "nemotron_h": ("mtp.", ("layers.0.enorm", "layers.0.hnorm", "layers.0.eh_proj", "layers.1.final_layernorm"), False,
                   True, False),
    # vLLM's KimiK3MultiTokenPredictorLayer: shared_head.norm(h + res) scored, h + res fed back; the target's state
    # before its final norm (vLLM's KimiLinearModel leaves the norm to compute_logits for the MTP layer to read)
    "kimi_k3": ("language_model.model.layers.{n}.", ("enorm", "hnorm", "eh_proj", "shared_head.norm"), False, False,
                True),
}
# the embedding the drafted token is read from, where not the target's model.embed_tokens: LongCat's own, Ling's
EMBEDDING = {"longcat_flash": "model.mtp.embed_tokens.weight", "bailing_hybrid": "model.word_embeddings.weight",
             "bailing_moe_v3": "model.word_embeddings.weight", "nemotron_h": "backbone.embeddings.weight",
             "kimi_k3": "language_model.model.embed_tokens.weight"}
ZERO_CENTRED = {"step3p5"}  # its norms compute x * (1 + w)
OWN_HEAD = {"step3p5": "transformer.shared_head.output"}  # scores with this, not the target's lm_head
BLOCKS = {
    "mimo": (lambda module, args: module.TransformerBlock(args), "model.mtp_layers.0."),
    "exaone_moe": (lambda module, args: module.DecoderLayer(replace(  # a dense layer with global attention
        args, layer_types=[*args.layer_types, "full_attention"], is_moe_layer=[*args.is_moe_layer, False]),
        layer_idx=args.num_hidden_layers), "mtp.layers.0."),
    "ernie4_5_moe": (lambda module, args: module.Ernie4_5_DecoderLayer(args, layer_idx=0), "model.mtp_block.0."),
    "mimo_v2_flash": (lambda module, args: module.DecoderLayer(args, is_moe=False, is_sliding_window=True),
                      "model.mtp.layers.0."),
    "longcat_flash": (lambda module, args: LongcatMTPBlock(module, args), "model.mtp.layers.0."),
    "nemotron_h": (lambda module, args: NemotronMTPBlock(module, args), "mtp."),
}
# where the block's tensors are named otherwise than mlx-lm's layer names them, and where it attends to a window
RENAMED = {"mimo_v2_flash": ("pre_mlp_layernorm.", "post_attention_layernorm.")}
WINDOW = {"mimo_v2_flash": "sliding_window_size", "step3p5": "sliding_window"}
INDEXED = {"deepseek_v32", "glm_moe_dsa"}  # the block's cache: the attention's and its indexer's


class LongcatMTPBlock(nn.Module):
    """vLLM's DeepseekV2DecoderLayer as LongCat's MTP layer builds it (no experts): its MLA attention (mlx-lm's
    LongCat MLA, which scales the q and kv latents) and a dense MLP, each pre-normed with a residual; the tensors
    as LongCat publishes them, DeepSeek's kv_b_proj split into the MLA's per-head key and value projections."""

    def __init__(self, module, args):
        super().__init__()
        self.args = args
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.self_attn = module.LongcatFlashMLA(args)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.transformer_layer = nn.Module()
        self.transformer_layer.mlp = module.LongcatFlashMLP(args)

    def load_weights(self, weights: list) -> None:
        args, split = self.args, []
        for name, value in weights:
            if name == "self_attn.kv_b_proj.weight":
                per_head = value.reshape(args.num_attention_heads, args.qk_nope_head_dim + args.v_head_dim, -1)
                split += [("self_attn.embed_q.weight", per_head[:, :args.qk_nope_head_dim].swapaxes(-1, -2)),
                          ("self_attn.unembed_out.weight", per_head[:, args.qk_nope_head_dim:])]
            else:
                split.append((name, value))
        super().load_weights(split)

    def __call__(self, x, mask=None, cache=None):
        h = x + self.self_attn(self.input_layernorm(x), mask=mask, cache=cache)
        return h + self.transformer_layer.mlp(self.post_attention_layernorm(h))


class NemotronMTPBlock(nn.Module):
    """vLLM's NemotronHMultiTokenPredictor over the sublayers `mtp_hybrid_override_pattern` lists (read into
    `hybrid_override_pattern`): (hidden, residual) carried as vLLM's layers carry them (the first sublayer's residual
    its input, each next one's the sum of the two), mlx-lm's mixers (its attention; its experts stacked as its
    SwitchMLP holds them); the output is the last sum, before the final norm."""

    def __init__(self, module, args):
        super().__init__()
        self.kinds = list(args.hybrid_override_pattern)
        self.norms = [nn.RMSNorm(args.hidden_size, eps=args.layer_norm_epsilon) for _ in self.kinds]
        self.mixers = [module.NemotronHAttention(args) if kind == "*" else module.NemotronHMoE(args)
                       for kind in self.kinds]

    def load_weights(self, weights: list) -> None:
        named, experts = {}, {}
        for name, value in weights:
            _, i, part, rest = name.split(".", 3)  # layers.{i}.{norm|mixer}.{rest}
            if rest.startswith("experts."):
                _, e, projection, _ = rest.split(".")
                experts.setdefault((i, projection), {})[int(e)] = value
            else:
                named[f"{'norms' if part == 'norm' else 'mixers'}.{i}.{rest}"] = value
        for (i, projection), values in experts.items():
            fc = "fc1" if projection == "up_proj" else "fc2"
            named[f"mixers.{i}.switch_mlp.{fc}.weight"] = mx.stack([values[e] for e in sorted(values)])
        super().load_weights(list(named.items()))

    def __call__(self, x, mask=None, cache=None):
        hidden, residual = x, None
        for kind, norm, mixer in zip(self.kinds, self.norms, self.mixers):
            residual = hidden if residual is None else hidden + residual
            hidden = mixer(norm(residual), mask=mask, cache=cache) if kind == "*" else mixer(norm(residual))
        return hidden + residual


def reference_block(path, config: dict, raw: dict, own: set[str]):
    """The layer's decoder block as mlx-lm runs it: a model one layer deeper's last layer, where the block is
    stored as that layer (mlx-lm's own loader converts its tensors; Kimi K3's model built without its attention
    residuals, as vLLM builds the block); else mlx-lm's layer (BLOCKS) holding the block's tensors as stored."""
    n = depth(config)
    if config["model_type"] == "kimi_k3":
        deeper = {"text_config": {**config["text_config"], "num_hidden_layers": n + 1, "attn_res_block_size": None}}
        return load_model(path, strict=False, model_config=deeper)[0].model.layers[n]
    if config["model_type"] not in BLOCKS:
        return load_model(path, strict=False, model_config={"num_hidden_layers": n + 1})[0].model.layers[n]
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    make, p = BLOCKS[config["model_type"]]
    pattern = config.get("mtp_hybrid_override_pattern")  # Nemotron-H: its MTP layer's sublayers
    block = make(module, module.ModelArgs.from_dict({**config, "hybrid_override_pattern": pattern} if pattern
                                                    else config))
    published, theirs = RENAMED.get(config["model_type"], ("", ""))
    block.load_weights([(k[len(p):].replace(published, theirs, 1) if published else k[len(p):], mx.array(v))
                        for k, v in raw.items() if k.startswith(p) and k not in own])
    return block


@pytest.mark.parametrize("family", FAMILIES)
def test_the_nextn_layer_is_its_equations(tiny, family):
    """x = proj(concat[embedding_norm(embed(t+1)), hidden_norm(h)]) (MiMo: hidden first), the decoder block, the
    target's head (Step 3.5: its own) over output_norm(x): the drafter's scores for a first draft, and its
    distributions for a first and a chained draft (the state fed back: the block's output, or its output norm's),
    against NumPy on the checkpoint's own tensors, the block run by mlx-lm, `h` the target's post-norm state (MiMo,
    MiMo-V2-Flash, Step 3.5: pre-norm)."""
    from safetensors.numpy import load_file

    path = tiny[family]
    config = json.loads((path / "config.json").read_text())
    n, raw = depth(config), load_file(str(path / "model.safetensors"))
    where, names, hidden_first, feeds_normed, pre = REFERENCE[family]
    text = config.get("text_config", config)
    eps = next(text[key] for key in ("rms_norm_eps", "layer_norm_epsilon", "layernorm_epsilon") if key in text)
    p = where.format(n=n)
    embedding_norm, hidden_norm, proj, out_norm = (raw[f"{p}{name}.weight"] for name in names)
    if family in ZERO_CENTRED:
        embedding_norm, hidden_norm, out_norm = embedding_norm + 1, hidden_norm + 1, out_norm + 1
    head = raw[f"{p}{OWN_HEAD[family]}.weight" if family in OWN_HEAD else HEAD.get(family, "lm_head.weight")]
    block = reference_block(path, config, raw, {f"{p}{name}.weight" for name in names})
    target, _ = load_model(path)
    engine = mlx_spec.load(str(path))
    ids = engine.encode(HEAD_TEXTS[1])
    hidden = np.array(target_states(target, ids) if pre else language(target)(mx.array(ids)[None])[0])

    def rows(tokens: list[int], hidden: np.ndarray) -> np.ndarray:
        embedding = raw[EMBEDDING.get(family, "model.embed_tokens.weight")]
        parts = [rms(embedding[tokens], embedding_norm, eps), rms(hidden, hidden_norm, eps)]
        return np.concatenate(parts[::-1] if hidden_first else parts, -1) @ proj.T

    window = text.get(WINDOW.get(family, ""))

    def run(x: np.ndarray) -> np.ndarray:
        xa = mx.array(x)[None]
        mask = create_attention_mask(xa, None, window_size=window, return_array=True)
        out = block(xa, mask=mask, cache=CacheList(KVCache(), KVCache()) if family in INDEXED else KVCache())
        return np.array((out[0] if isinstance(out, tuple) else out)[0])  # Kimi's layer returns (h, residuals)

    x = rows(ids[1:], hidden[:-1])
    y = run(x)
    logits = rms(y, out_norm, eps) @ head.T
    drafter = engine.drafter
    drafter.begin(ids, engine.target.prefill(ids[:-1]))
    np.testing.assert_allclose(np.array(drafter.next_logits[0]), logits[-1], rtol=1e-3, atol=1e-3)
    proposal = drafter.propose(ids, 2, mlx_spec.SamplingParams(temperature=1.0), mx.random.key(0))
    first = int(proposal.tokens[0].item())  # sampled: the chained draft's scores are compared whole
    fed = rms(y[-1:], out_norm, eps) if feeds_normed else y[-1:]
    chained = rms(run(np.concatenate([x, rows([first], fed)]))[-1], out_norm, eps) @ head.T
    np.testing.assert_allclose(np.array(proposal.q), softmax(np.stack([logits[-1], chained])), rtol=1e-3, atol=1e-5)


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_nextn_drafting_is_exact(tiny, family):
    """Pinned draft lengths 1..3 over the texts the layer drafts well and one it does not: mlx-lm's own greedy
    decoding, with drafts accepted and rejected (the MLA / GQA caches and the layer's own rolled back)."""
    engine = mlx_spec.load(str(tiny[family]))
    assert engine.status().drafter == "mtp"
    accepted = drafted = 0
    for text in [*HEAD_TEXTS[:2], "x = [1, 2, 3]\n"]:
        ids = engine.encode(text)
        expected = plain_greedy(tiny[family], ids, 48)
        for k in (1, 2, 3):
            engine.pin(k)
            result = engine.generate(ids, max_tokens=48)
            assert result.tokens == expected, (text, k)
            accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0 < accepted < drafted


# the layer past the last, in its own list, beside the target's tensors (its output norm the target's), with
# zero-centred norms (shifted once, on conversion), under its own prefix with its own embedding, and over a target
# whose recurrent layers roll back by replaying and whose block mlx-lm converts only as a layer past the first (Ling
# 3.0), as a chain of sublayers (Nemotron-H), and in a nested config under `language_model.` (Kimi K3)
@pytest.mark.parametrize("family", ["deepseek_v3", "mimo", "ernie4_5_moe", "step3p5", "longcat_flash",
                                    "bailing_moe_v3", "nemotron_h", "kimi_k3"])
def test_convert_keeps_and_grafts_the_nextn_layer(tiny, tmp_path, family):
    from mlx_lm.convert import convert

    source = tiny[family]
    out = tmp_path / "converted"
    proc = run_cli("convert", "--hf-path", str(source), "--mlx-path", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Kept the MTP layer" in proc.stdout
    assert any(k.startswith("nextn.") for k in mx.load(str(out / "mtp.safetensors")))
    original = mlx_spec.load(str(source), draft_len=2)
    ids = original.encode(HEAD_TEXTS[0])
    reference = original.generate(ids, max_tokens=40)
    converted = mlx_spec.load(str(out), draft_len=2).generate(ids, max_tokens=40)
    assert converted.tokens == reference.tokens and converted.stats.accepted == reference.stats.accepted

    stripped = tmp_path / "stripped"
    convert(str(source), str(stripped))  # what mlx_lm.convert (and the published conversions) give
    assert_one_line_error(run_cli("generate", "--model", str(stripped), "--prompt", "hi"),
                          "holds no nextn MTP layer", "mlx-spec convert --add-mtp")
    proc = run_cli("convert", "--add-mtp", "--hf-path", str(source), "--mlx-path", str(stripped))
    assert proc.returncode == 0, proc.stderr
    grafted = mlx_spec.load(str(stripped), draft_len=2).generate(ids, max_tokens=40)
    assert grafted.tokens == reference.tokens and grafted.stats.accepted == reference.stats.accepted
    assert_one_line_error(run_cli("convert", "--add-mtp", "--hf-path", str(source), "--mlx-path", str(stripped)),
                          "already holds")


def test_add_mtp_fetches_only_the_shards_that_hold_the_layer(tiny, tmp_path):
    """ERNIE's layer sits beside the target's tensors, under `model.` as they are: `convert --add-mtp` fetches the
    shards holding its tensors and the target's final norm (which scores its drafts), not every shard."""
    from safetensors.numpy import load_file, save_file

    from mlx_spec.commands.convert import mtp_shards

    source = shutil.copytree(tiny["ernie4_5_moe"], tmp_path / "sharded")
    weights = load_file(str(source / "model.safetensors"))
    (source / "model.safetensors").unlink()
    shards = {"model-00001-of-00003.safetensors": lambda k: k.startswith(("model.layers.", "model.embed_tokens")),
              "model-00002-of-00003.safetensors": lambda k: k.startswith("model.mtp_"),
              "model-00003-of-00003.safetensors": lambda k: k in ("model.norm.weight", "lm_head.weight")}
    weight_map = {}
    for name, holds in shards.items():
        save_file({k: v for k, v in weights.items() if holds(k)}, str(source / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in weights if holds(k)})
    assert weight_map.keys() == weights.keys()
    (source / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert mtp_shards(str(source)) == ["model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]


def test_a_quantized_conversion_drafts_exactly(tiny, tmp_path):
    out = tmp_path / "q8"
    proc = run_cli("convert", "--hf-path", str(tiny["glm4_moe"]), "--mlx-path", str(out), "-q", "--q-bits", "8",
                   "--q-group-size", "32")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["mtp_quantization"] == {"group_size": 32, "bits": 8}
    engine = mlx_spec.load(str(out), draft_len=2)
    ids = engine.encode(HEAD_TEXTS[0])
    result = engine.generate(ids, max_tokens=40)
    assert result.tokens == plain_greedy(out, ids, 40) and 0 < result.stats.accepted < result.stats.drafted


def test_unsupported_nextn_variants_are_refused(tiny, tmp_path):
    declared = shutil.copytree(tiny["qwen3"], tmp_path / "declares")
    config = json.loads((declared / "config.json").read_text())
    (declared / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    assert_one_line_error(run_cli("generate", "--model", str(declared), "--drafter", "mtp", "--prompt", "hi"),
                          f"nextn layers of {', '.join(NEXTN_FAMILIES)} only", "'qwen3'", "--drafter ngram")
    misfit = edited_copy(tiny["glm4_moe"], tmp_path / "misfit",
                         lambda w: {k: (v[:, :-1] if k.endswith(".eh_proj.weight") else v) for k, v in w.items()})
    assert_one_line_error(run_cli("generate", "--model", str(misfit), "--prompt", "hi"),
                          "nextn layer's tensors do not fit")


def test_a_sparse_attentions_caches_are_never_quantized(tiny):
    """DeepSeek-V3.2 / GLM-5 attend through an indexer whose keys mlx-lm cannot quantize: --kv-bits is refused by
    name rather than decoding otherwise than asked."""
    from mlx_spec.seams.caches import make_caches

    target, _ = load_model(tiny["glm_moe_dsa"])
    with pytest.raises(mlx_spec.SpecError, match="sparse attention .* cannot be quantized: drop --kv-bits"):
        make_caches(target, 4, kv_bits=8)


def test_an_mtp_layer_claimed_under_a_key_not_read_is_told(tiny, tmp_path):
    """MiniMax M2 declares three MTP modules (`num_mtp_modules`, `use_mtp`) and publishes none: the default drafter
    says why it is not MTP, and `--drafter mtp` is refused naming the claim; a checkpoint that does hold such
    tensors (MiniMax M3's `language_model.model.mtp.layers.{i}`) is told apart by them."""
    from safetensors.numpy import save_file

    from mlx_spec.runners.checkpoint import unread_mtp_claim

    claims = shutil.copytree(tiny["qwen3"], tmp_path / "claims")
    config = json.loads((claims / "config.json").read_text())
    (claims / "config.json").write_text(json.dumps({**config, "use_mtp": True, "num_mtp_modules": 3}))
    proc = run_cli("generate", "--model", str(claims), "--prompt", "hi", "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    told = "claims declares 3 MTP layer(s) (num_mtp_modules) but holds no MTP tensors (none were published): " \
           "drafting with ngram"
    assert told in proc.stderr.splitlines() and "drafter: ngram" in proc.stderr
    assert told not in run_cli("generate", "--model", str(claims), "--prompt", "hi", "--max-tokens", "4",
                               "--drafter", "ngram").stderr  # chosen, not defaulted: nothing to tell
    assert_one_line_error(run_cli("generate", "--model", str(claims), "--drafter", "mtp", "--prompt", "hi"),
                          "declares 3 MTP layer(s) (num_mtp_modules) but holds no MTP tensors", "--drafter ngram")
    nested = tmp_path / "nested"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"text_config": {"num_mtp_modules": 1}}))
    save_file({"language_model.model.mtp.layers.0.eh_proj.weight": np.zeros((2, 4), np.float32)},
              str(nested / "model.safetensors"))
    assert unread_mtp_claim(json.loads((nested / "config.json").read_text()), nested) == \
        "nested declares 1 MTP layer(s) (num_mtp_modules) of a kind MTP drafting does not read yet"
    assert unread_mtp_claim(config, claims) is None
