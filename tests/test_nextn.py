"""DeepSeek-V3 (MLA + MoE) and GLM-4.5 (GQA + MoE) nextn MTP layers: the layer against a NumPy transcription of
its equations, exact drafting with rollbacks of every cache, convert keeping and grafting the layer, refusals."""

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from helpers import assert_one_line_error, edited_copy, plain_greedy, run_cli
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load_model
from tiny import HEAD_TEXTS
from tiny_nextn import NEXTN_FAMILIES

import mlx_spec

FAMILIES = list(NEXTN_FAMILIES)


def rms(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("family", FAMILIES)
def test_the_nextn_layer_is_its_equations(tiny, family):
    """x = eh_proj(concat[enorm(embed(t+1)), hnorm(h)]), the decoder block, lm_head(shared_head.norm(x)): the
    drafter's scores against NumPy on the checkpoint's own tensors, the block run as mlx-lm runs a layer of a
    model one layer deeper (so that mlx-lm's own loader converts its tensors), the hidden state the target's
    post-norm output."""
    from safetensors.numpy import load_file

    path = tiny[family]
    config = json.loads((path / "config.json").read_text())
    n, raw = config["num_hidden_layers"], load_file(str(path / "model.safetensors"))
    p = f"model.layers.{n}."
    deeper, _ = load_model(path, strict=False, model_config={"num_hidden_layers": n + 1})
    engine = mlx_spec.load(str(path))
    ids = engine.encode(HEAD_TEXTS[1])
    hidden = np.array(deeper.model.norm(_run(deeper, ids, n)))  # the target's post-norm states
    e = raw["model.embed_tokens.weight"][ids[1:]]
    x = np.concatenate([rms(e, raw[p + "enorm.weight"]), rms(hidden[:-1], raw[p + "hnorm.weight"])], -1)
    x = x @ raw[p + "eh_proj.weight"].T
    xa = mx.array(x)[None]
    y = np.array(deeper.model.layers[n](xa, mask=create_attention_mask(xa, None, return_array=True), cache=KVCache())[0])
    logits = rms(y, raw[p + "shared_head.norm.weight"]) @ raw["lm_head.weight"].T

    drafter, target = engine.drafter, engine.target
    step = target.prefill(ids[:-1])
    drafter.begin(ids, step)
    np.testing.assert_allclose(np.array(drafter.next_logits[0]), logits[-1], rtol=1e-3, atol=1e-3)
    proposal = drafter.propose(ids, 1, mlx_spec.SamplingParams(), mx.random.key(0)).tokens.tolist()
    assert proposal == [int(logits[-1].argmax())]


def _run(model, ids, layers):
    """The last decoder layer's output over `ids` (before the final norm), through the first `layers`."""
    h = model.model.embed_tokens(mx.array(ids)[None])
    mask = create_attention_mask(h, None, return_array=True)
    for layer in model.model.layers[:layers]:
        h = layer(h, mask, None)
    return h[0]


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


def test_convert_keeps_and_grafts_the_nextn_layer(tiny, tmp_path):
    from mlx_lm.convert import convert

    source = tiny["deepseek_v3"]
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
                          "nextn layers of deepseek_v3, glm4_moe only", "'qwen3'", "--drafter ngram")
    misfit = edited_copy(tiny["glm4_moe"], tmp_path / "misfit",
                         lambda w: {k: (v[:, :-1] if k.endswith(".eh_proj.weight") else v) for k, v in w.items()})
    assert_one_line_error(run_cli("generate", "--model", str(misfit), "--prompt", "hi"),
                          "nextn layer's tensors do not fit")
