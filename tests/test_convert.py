"""`mlx-spec convert` keeps the MTP layer; `--add-mtp` repairs conversions that lost it."""

import json
import shutil

import mlx_lm
import pytest
from helpers import PROMPT, converted_q8, plain_greedy
from safetensors.numpy import load_file, save_file
from test_cli import assert_one_line_error, run_cli

import mlx_spec
from mlx_spec.commands.convert import mtp_shards


def drafted_with_mtp(path, **sampling) -> tuple[list[int], int, int]:
    """(tokens, drafted, accepted) of MTP drafting on PROMPT: greedy tokens are plain decoding's whatever the layer
    drafts, so it is what the layer gets accepted (and, sampled, the tokens) that tells a converted layer apart."""
    engine = mlx_spec.load(str(path), draft_len=2)  # pinned: sampled runs then repeat exactly for a seed
    assert engine.drafter.name == "mtp"
    result = mlx_spec.generate(engine, PROMPT, max_tokens=40, **sampling)
    return result.tokens, result.stats.drafted, result.stats.accepted


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
def test_float_round_trip_keeps_mtp_and_loads_everywhere(tiny, tmp_path, family):
    """The converted MTP layer drafts as the original does: the same drafts accepted greedy (the layer fitted to
    the target's continuations of PROMPT: some accepted, some not) and the same sampled tokens."""
    source, out = tiny[f"{family}-fitted-mtp"], tmp_path / "mlx"
    proc = run_cli("convert", "--hf-path", str(source), "--mlx-path", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "mtp.safetensors").exists()
    greedy = drafted_with_mtp(source)
    assert greedy[0] == plain_greedy(source, mlx_spec.load(str(source), drafter="off").encode(PROMPT), 40)
    assert drafted_with_mtp(out) == greedy and 0 < greedy[2] < greedy[1]
    assert drafted_with_mtp(out, temperature=1.0, seed=5) == drafted_with_mtp(source, temperature=1.0, seed=5)
    model, _ = mlx_lm.load(str(out))  # plain mlx-lm still loads it
    assert len(model.layers) == len(mlx_lm.load(str(source))[0].layers)


def test_quantized_round_trip(tiny, tmp_path):
    out = tmp_path / "q8"
    assert converted_q8(tiny["qwen3_5"], out)["mtp_quantization"] == {"group_size": 32, "bits": 8}
    # pinned: the answer ends after 5 tokens, before a fresh adaptive policy has timed its first rounds
    engine = mlx_spec.load(str(out), draft_len=2)
    assert type(engine.drafter.mtp.fc).__name__ == "QuantizedLinear"
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=60)
    assert result.tokens == plain_greedy(out, ids, 60)  # lossless on the quantized target
    # drafted, never accepted: the 8-bit target ends its answer after 5 tokens (test_nextn's quantized conversion
    # shows drafts accepted and rejected on a quantized target)
    assert result.stats.drafted > 0


def test_a_conversion_converts_again_and_is_not_requantized(tiny, tmp_path):
    """Its own output (here 8-bit, MTP layer in mtp.safetensors) converts again as it is; asking to quantize it
    again, change its dtype or pass --q-bits without -q is a one-line refusal that writes nothing."""
    q8 = tmp_path / "q8"
    converted_q8(tiny["qwen3_5"], q8)
    again = tmp_path / "again"
    proc = run_cli("convert", "--hf-path", str(q8), "--mlx-path", str(again))
    assert proc.returncode == 0 and "Kept the MTP layer" in proc.stderr + proc.stdout, proc.stderr
    assert (again / "mtp.safetensors").read_bytes() == (q8 / "mtp.safetensors").read_bytes()
    engine = mlx_spec.load(str(again), draft_len=2)
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=30)
    assert result.tokens == plain_greedy(q8, ids, 30) and result.stats.drafted > 0
    for flags, fragment in ((["-q", "--q-bits", "4"], "already quantized (8-bit), which -q cannot undo"),
                            (["--dtype", "float16"], "which --dtype cannot undo"),
                            (["--q-bits", "4"], "--q-bits 4 applies only with -q")):
        proc = run_cli("convert", "--hf-path", str(q8), "--mlx-path", str(tmp_path / "refused"), *flags)
        assert_one_line_error(proc, fragment)
        assert not (tmp_path / "refused").exists()


def sharded_copy(src, dst):
    """The checkpoint split as published models are: mtp.* in the last shard, with an index."""
    dst = shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").unlink()
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in weights.items() if not k.startswith("mtp.")},
              "model-00002-of-00002.safetensors": {k: v for k, v in weights.items() if k.startswith("mtp.")}}
    for name, part in shards.items():
        save_file(part, str(dst / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_add_mtp_repairs_a_stripped_conversion(tiny, tmp_path):
    from mlx_lm.convert import convert

    source = sharded_copy(tiny["qwen3_5-fitted-mtp"], tmp_path / "hf")
    assert mtp_shards(str(source)) == ["model-00002-of-00002.safetensors"]  # only this shard is fetched
    stripped = tmp_path / "stripped"
    convert(str(source), str(stripped))  # what mlx_lm.convert and most published conversions give
    proc = run_cli("generate", "--model", str(stripped), "--prompt", "hi")
    assert_one_line_error(proc, "stripped", "mlx-spec convert --add-mtp")
    proc = run_cli("convert", "--add-mtp", "--hf-path", str(source), "--mlx-path", str(stripped))
    assert proc.returncode == 0, proc.stderr
    greedy = drafted_with_mtp(tiny["qwen3_5-fitted-mtp"])
    assert drafted_with_mtp(stripped) == greedy and 0 < greedy[2] < greedy[1]
    assert drafted_with_mtp(stripped, temperature=1.0, seed=1) == drafted_with_mtp(tiny["qwen3_5-fitted-mtp"],
                                                                                   temperature=1.0, seed=1)
    assert_one_line_error(run_cli("convert", "--add-mtp", "--hf-path", str(source), "--mlx-path", str(stripped)),
                          "already holds")


def test_failures_write_nothing(tiny, tmp_path):
    existing = tmp_path / "exists"
    existing.mkdir()
    assert_one_line_error(run_cli("convert", "--hf-path", str(tiny["qwen3_5"]), "--mlx-path", str(existing)),
                          "already exists")
    broken = shutil.copytree(tiny["qwen3_5"], tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"not safetensors at all")
    out = tmp_path / "out" / "model"
    assert_one_line_error(run_cli("convert", "--hf-path", str(broken), "--mlx-path", str(out)), "nothing was written")
    assert not out.exists() and list((tmp_path / "out").iterdir()) == []
