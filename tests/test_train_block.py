"""`mlx-spec train-drafter --kind dflash|dspark`: the training forward is drafting at every anchor at once; a
trained drafter drafts exactly (greedy and sampled) with most drafts accepted; the written drafter loads in the
reference implementation (mlx-vlm) with the same distributions; kill and resume gives the same weights;
refusals."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from helpers import (assert_cli_decodes_greedily, assert_one_line_error, assert_same_weights, converted_q8,
                     kill_at_checkpoint, plain_greedy, run_cli)
from test_block import assert_rounds_match_the_reference
from test_sampling import assert_follows, exact_sequences
from tiny import HEAD_TEXTS
from tiny_block import random_block_drafter
from tiny_heads import greedy_continuations

import mlx_spec
from mlx_spec.loading import load_target
from mlx_spec.models.dflash import load_block_drafter
from mlx_spec.train.block import BlockTrainer, drafter_config


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_every_block_at_once_is_drafting_at_each_anchor(tiny, tmp_path, kind):
    """Training's forward (all blocks of a row in one masked forward, each rotated from its own anchor) gives what
    drafting gives: the context before the anchor appended to the cache, then the block after it."""
    path = random_block_drafter(tmp_path / "drafter", tiny["qwen3"], kind=kind)
    model = load_block_drafter(path, json.loads((path / "config.json").read_text()))
    features = mx.random.normal((2, 20, model.fc.weight.shape[1]), key=mx.random.key(0))
    anchors = mx.array([[1, 9, 15], [4, 5, 16]])
    blocks = mx.random.normal((2, 3, 4, model.config["hidden_size"]), key=mx.random.key(1))
    every = np.array(model.every_block(features, blocks, anchors))
    for row in range(2):
        for j, anchor in enumerate(anchors[row].tolist()):
            cache = model.make_cache()
            model.extend(features[row:row + 1, :anchor], cache, 0)
            alone = np.array(model(blocks[row:row + 1, j], cache, anchor)[0])
            np.testing.assert_allclose(every[row, j], alone, rtol=1e-4, atol=1e-5, err_msg=f"row {row}, block {j}")


# name: (target, kind, the drafter's vocabulary, optimizer steps: where its held-out acceptance passes 0.8)
TRAINED = {"qwen3-dflash": ("qwen3", "dflash", None, 150), "qwen3_5-dspark-reduced": ("qwen3_5", "dspark", 300, 100)}


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """Block drafters trained on the target's greedy continuations of the head texts (each row from the text's
    start, so drafting those texts meets the features it was trained on): a DFlash one over the whole vocabulary
    (z-lab's layout) and a DSpark one over 300 of the 512 tokens (speculators' layout), on a hybrid target."""
    out = {}
    for name, (family, kind, vocab_top, steps) in TRAINED.items():
        target = load_target(str(tiny[family]))
        texts = greedy_continuations(target.model, target.tokenizer, HEAD_TEXTS, tokens=100)
        rows = np.array([t[:min(map(len, texts))] for t in texts] * 2, dtype=np.int32)  # the held-out row: a copy
        vocab = target.config.get("text_config", target.config)["vocab_size"]
        used = np.unique(rows)  # and other tokens to make up `vocab_top`
        others = np.random.default_rng(0).permutation(np.setdiff1d(np.arange(vocab), used))
        ids = None if vocab_top is None else np.sort(np.concatenate([used, others])[:vocab_top]).astype(np.int32)
        config = drafter_config(kind, target.config, 1, 4, [1, 2], vocab - 1, 16, vocab if ids is None else len(ids))
        mx.random.seed(0)
        folder = tmp_path_factory.mktemp(name)
        trainer = BlockTrainer(target.model, target.config, config, None, rows, ids, rows.size, 3e-3, 0, 32,
                               folder / "features")
        for _ in range(steps):
            trainer.train_step()
        assert trainer.evaluate()[0] > 0.6
        trainer.save(folder / "drafter", {})
        out[name] = (family, folder / "drafter", texts)
    return out


@pytest.mark.parametrize("name", TRAINED)
def test_a_trained_block_drafter_drafts_exactly_and_well(tiny, trained, name):
    family, path, texts = trained[name]
    config = json.loads((path / "config.json").read_text())
    assert ("speculators_model_type" in config) == (name == "qwen3_5-dspark-reduced")
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(path), draft_len=3)
    assert engine.status().drafter == name.split("-")[1]
    acceptance = []
    for text in texts:
        prompt = text[:-100]
        result = engine.generate(prompt, max_tokens=60)
        assert result.tokens == plain_greedy(tiny[family], prompt, 60)
        acceptance.append(result.stats.per_position_acceptance)
    first, last = [a[0] for a in acceptance], [a[-1] for a in acceptance]
    assert min(first) > 0.5 and min(last) < 1, acceptance  # drafts mostly accepted, some rejected


@pytest.mark.parametrize("name", TRAINED)
def test_sampled_sequences_follow_the_target_under_a_trained_drafter(tiny, trained, name):
    """Three sampled tokens (T = 1, top-k 2) appear as often as the target alone would produce them."""
    family, path, texts = trained[name]
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(path), draft_len=2)
    prompt = texts[0][:-100][:32]
    exact = exact_sequences(tiny[family], prompt, 3, 2)
    observed, drafted, accepted = dict.fromkeys(exact, 0), 0, 0
    for seed in range(800):
        result = mlx_spec.generate(engine, prompt, max_tokens=3, temperature=1.0, top_k=2, seed=seed)
        observed[tuple(result.tokens)] += 1
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert 0 < accepted < drafted
    assert_follows(observed, exact, 800)


def test_the_written_drafter_drafts_what_the_reference_drafts(tiny, trained):
    """z-lab's layout as train-drafter writes it, read by mlx-vlm's DFlash model: the same distributions."""
    _, path, _ = trained["qwen3-dflash"]
    assert_rounds_match_the_reference(tiny["qwen3"], path, path)


def train_command(tiny, prompts, out, *extra):
    return [sys.executable, "-m", "mlx_spec.cli", "train-drafter", "--kind", "dspark", "--model", str(tiny["qwen3"]),
            "--prompts", str(prompts), "--answer-tokens", "60", "--out", str(out), "--seq-len", "24",
            "--batch-tokens", "50", "--block-size", "3", "--target-layers", "2", "--markov-rank", "8",
            "--eval-every", "4", "--checkpoint-every", "3", "--vocab-top", "200", "--quiet", *extra]


@pytest.fixture
def prompts(tmp_path):
    file = tmp_path / "prompts.jsonl"
    file.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in [*HEAD_TEXTS, "import os"]))
    return file


def test_train_drafter_resumes_after_a_kill_with_the_same_weights(tiny, tmp_path, prompts):
    """The killed run resumes from its checkpoint and its stored target features, ending where an unbroken run
    ends; the drafter it writes decodes exactly from the command line."""
    unbroken = subprocess.run(train_command(tiny, prompts, tmp_path / "unbroken", "--steps", "10"),
                              capture_output=True, text=True, timeout=300)
    assert unbroken.returncode == 0, unbroken.stderr
    assert "drafts a block on answers (per position: " in unbroken.stderr and "--draft-model" in unbroken.stderr
    training = json.loads((tmp_path / "unbroken" / "config.json").read_text())["training"]
    assert training["steps"] == 10 and len(training["held_out_acceptance_per_position"]["answers"]) == 3

    out = tmp_path / "killed"
    checkpoint = tmp_path / ".killed.train-drafter-checkpoint"
    kill_at_checkpoint(train_command(tiny, prompts, out, "--steps", "10"), checkpoint / "step.json")
    stored = np.load(checkpoint / "features" / "features-done.npy")
    assert (checkpoint / "step.json").exists() and not out.exists() and 0 < stored.sum()
    resumed = subprocess.run(train_command(tiny, prompts, out, "--steps", "10"), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from step 3" in resumed.stderr and not checkpoint.exists()
    assert_same_weights(tmp_path / "unbroken", out)

    assert_cli_decodes_greedily(tiny["qwen3"], "--draft-model", str(out), "--num-draft", "3")


def test_a_quantized_target_trains_as_it_runs(tiny, tmp_path, prompts):
    """The 8-bit target stays quantized and frozen; the drafter trains in float and drafts for it exactly."""
    q8 = tmp_path / "q8"
    converted_q8(tiny["qwen3"], q8)
    command = train_command(tiny, prompts, tmp_path / "drafter", "--steps", "3")
    command[command.index(str(tiny["qwen3"]))] = str(q8)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    engine = mlx_spec.load(str(q8), draft_model=str(tmp_path / "drafter"), draft_len=3)
    assert type(engine.target.model.layers[0].self_attn.q_proj).__name__ == "QuantizedLinear"
    assert type(engine.drafter.model.fc).__name__ == "Linear" and engine.status().drafter == "dspark"
    ids = engine.encode(HEAD_TEXTS[0])
    assert engine.generate(ids, max_tokens=30).tokens == plain_greedy(q8, ids, 30)


def test_train_drafter_refusals(tiny, tmp_path, prompts):
    block = train_command(tiny, prompts, tmp_path / "a")[3:]
    block[block.index("--block-size") + 1] = "1"
    assert_one_line_error(run_cli(*block), "--block-size must be >= 2")
    short = train_command(tiny, prompts, tmp_path / "b")[3:]
    short[short.index("--seq-len") + 1] = "2"
    assert_one_line_error(run_cli(*short), "--seq-len must be more than the block's 3 drafts")
    assert_one_line_error(run_cli(*train_command(tiny, prompts, tmp_path / "c", "--anchors", "0")[3:]),
                          "--anchors must be >= 1")
    exists = tmp_path / "exists"
    exists.mkdir()
    assert_one_line_error(run_cli(*train_command(tiny, prompts, exists)[3:]), "already exists")
    nothing = train_command(tiny, prompts, tmp_path / "d")[3:]
    del nothing[nothing.index("--prompts"):nothing.index("--prompts") + 2]
    assert_one_line_error(run_cli(*nothing), "nothing to train on")
    assert not any(p.name.startswith(".") for p in Path(tmp_path).iterdir())
    shutil.rmtree(exists)


def test_stored_features_serve_only_the_run_they_were_computed_for(tmp_path):
    """Features of other rows (or another target) in the same folder are computed afresh, not reused."""
    from mlx_spec.train.block import FeatureStore

    computed = []

    def compute(missing):
        computed.append(list(missing))
        return np.full((len(missing), 4, 3), len(computed), dtype=np.float16)

    FeatureStore(tmp_path, 5, 4, 3, "one").rows([0, 2], compute)
    np.testing.assert_array_equal(FeatureStore(tmp_path, 5, 4, 3, "one").rows([2, 0], compute), 1)
    assert computed == [[0, 2]]  # the same run resumed: read back
    np.testing.assert_array_equal(FeatureStore(tmp_path, 5, 4, 3, "two").rows([0], compute), 2)
    assert computed == [[0, 2], [0]]
