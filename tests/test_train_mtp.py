"""`mlx-spec train-mtp`: the training step, a trained head drafting exactly, the command line, resuming after a
kill, refusals."""

import json
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from helpers import (assert_cli_decodes_greedily, assert_one_line_error, assert_same_weights, converted_q8,
                     kill_at_checkpoint, plain_greedy, run_cli)
from tiny import HEAD_TEXTS, corpus_text
from tiny_heads import greedy_continuations

import mlx_spec
from mlx_spec.seams.caches import make_caches
from mlx_spec.loading import load_target
from mlx_spec.core.prompts import render_prompt
from mlx_spec.train.mtp import Trainer
from mlx_spec.train.common import answer_rows, read_prompts


@pytest.mark.parametrize("draft_steps,reuse,layer_lr", [(1, 1, 0.1), (2, 3, 0.0)])
def test_the_training_step_lowers_the_loss(tiny, draft_steps, reuse, layer_lr):
    target = load_target(str(tiny["qwen3"]))
    sequences = greedy_continuations(target.model, target.tokenizer, HEAD_TEXTS[:2], tokens=40)
    length = min(map(len, sequences))
    rows = np.array([s[:length] for s in sequences], dtype=np.int32)
    trainer = Trainer(target.model, target.config, rows, 128, length - 1, 3e-3, seed=0, draft_steps=draft_steps,
                      reuse=reuse, layer_lr=layer_lr)
    losses = [trainer.train_step() for _ in range(12)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert trainer.head.ids.shape == (128,) and len(trainer.evaluate()) == draft_steps
    copied = dict(tree_flatten(target.model.model.layers[-1].parameters()))
    changed = [name for name, value in tree_flatten(trainer.head.layers[0].parameters())
               if not mx.array_equal(value, copied[name])]
    assert (changed == []) == (layer_lr == 0), changed


def test_training_unrolls_the_drafts_as_drafting_runs_them(tiny):
    """The outputs of chained draft steps 1..3 that the loss sees, for every row at once, equal those of the head
    run as the drafter runs it: step-1 rows up to p in its cache, then one token at a time from its own output."""
    target = load_target(str(tiny["qwen3"]))
    sequences = greedy_continuations(target.model, target.tokenizer, HEAD_TEXTS[:2], tokens=24)
    rows = np.array([s[:min(map(len, sequences))] for s in sequences], dtype=np.int32)
    trainer = Trainer(target.model, target.config, rows, 128, rows.shape[1] - 1, 3e-3, seed=0, draft_steps=3)
    for _ in range(3):  # away from the starting weights
        trainer.train_step()
    tokens, hidden = trainer.features(rows[:1])
    outs = [np.array(out[0]) for out in trainer.unroll(trainer.head, tokens, hidden)]
    embed = target.model.model.embed_tokens
    for p in (0, 7, outs[0].shape[0] - 1):
        caches = make_caches(trainer.head, 8)
        out = trainer.head(embed(tokens[:, 1:p + 2]), hidden[:, :p + 1], caches)[:, -1:]
        for j in range(3):
            np.testing.assert_allclose(np.array(out[0, 0]), outs[j][p], atol=2e-4, err_msg=f"step {j + 1}, row {p}")
            out = trainer.head(embed(tokens[:, p + j + 2:p + j + 3]), out, caches)


def test_a_trained_head_drafts_exactly_and_well(tiny):
    """The suite's head (256 of 512 tokens, trained on the target's continuations of the head texts): drafting
    those texts is greedy-exact and its first drafts are mostly accepted; tokens outside its vocabulary are never
    proposed."""
    engine = mlx_spec.load(str(tiny["qwen3"]), mtp_path=str(tiny["qwen3-mtp-head"]), draft_len=2)
    assert engine.status().drafter == "mtp"
    first = []
    for text in HEAD_TEXTS:
        ids = engine.encode(text)
        result = engine.generate(ids, max_tokens=60)
        assert result.tokens == plain_greedy(tiny["qwen3"], ids, 60)
        first.append(result.stats.per_position_acceptance[0])
    assert min(first) > 0.5, first
    head = engine.drafter.mtp
    outside = np.setdiff1d(np.arange(512), np.array(head.ids))
    logits = np.array(head.logits(head(engine.target.model.model.embed_tokens(mx.array([[3, 4]])),
                                       mx.ones((1, 2, 64))))[0])
    assert np.isneginf(logits[:, outside]).all() and np.isfinite(logits[:, np.array(head.ids)]).all()


def test_the_targets_answers_are_its_own_decoding_and_survive_a_kill(tiny, tmp_path):
    """--prompts: each answer is the target's plain greedy decoding of the rendered prompt (chat prompts too),
    packed into rows; a store cut short by a kill keeps its whole lines and only the rest are generated again."""
    prompts = [*HEAD_TEXTS[:2], [{"role": "user", "content": HEAD_TEXTS[2]}], "import os"]
    file = tmp_path / "prompts.jsonl"
    file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    target, said = load_target(str(tiny["qwen3"])), []
    rows = answer_rows(target, read_prompts(str(file)), 24, 15, tmp_path / "kept", False, said.append)
    assert "answers 4 of 4 prompts" in said[0]
    store = tmp_path / "kept" / "answers.jsonl"
    answers = {item["index"]: item["tokens"] for item in map(json.loads, store.read_text().splitlines())}
    for index, prompt in enumerate(prompts):
        ids = render_prompt(target.tokenizer, prompt)  # through the chat template, as bench and the chat do
        assert ids != target.tokenizer.encode(HEAD_TEXTS[index] if index < 3 else prompt)
        assert answers[index] == ids + plain_greedy(tiny["qwen3"], ids, 24), index
    stream = [t for index in sorted(answers) for t in answers[index]]
    assert rows.shape[1] == 16 and 0 <= len(stream) - rows.size < 16
    np.testing.assert_array_equal(rows.ravel(), stream[:rows.size])

    whole = store.read_text()
    store.write_text(whole[:-len(whole.splitlines()[-1]) // 2])  # a kill in the middle of the last line
    said.clear()
    again = answer_rows(target, read_prompts(str(file)), 24, 15, tmp_path / "kept", False, said.append)
    assert "answers 1 of 4 prompts" in said[0]
    np.testing.assert_array_equal(again, rows)


def train_command(tiny, data, out, *extra):
    return [sys.executable, "-m", "mlx_spec.cli", "train-mtp", "--model", str(tiny["qwen3"]), "--data", str(data),
            "--out", str(out), "--seq-len", "32", "--batch-tokens", "1024", "--vocab-top", "128", "--eval-every", "20",
            "--checkpoint-every", "3", "--draft-steps", "2", "--reuse", "2", *extra]


@pytest.fixture
def corpus(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    text = corpus_text()
    for i in range(4):
        (data / f"part{i}.py").write_text(text[i * 3000:(i + 1) * 3000])
    return data


def test_train_mtp_on_text_and_resume_after_a_kill(tiny, tmp_path, corpus):
    """With two chained draft steps and each batch reused twice (the kept batches rebuilt after the kill)."""
    unbroken = subprocess.run(train_command(tiny, corpus, tmp_path / "unbroken", "--steps", "15"),
                              capture_output=True, text=True, timeout=300)
    assert unbroken.returncode == 0, unbroken.stderr
    assert "held-out first-draft acceptance" in unbroken.stderr and "--mtp-path" in unbroken.stderr
    config = json.loads((tmp_path / "unbroken" / "config.json").read_text())
    assert config["architectures"] == ["MTPHead"] and config["training"]["steps"] == 15

    out = tmp_path / "killed"
    checkpoint = tmp_path / ".killed.train-mtp-checkpoint" / "step.json"
    kill_at_checkpoint(train_command(tiny, corpus, out, "--steps", "15"), checkpoint)
    assert checkpoint.exists() and not out.exists()
    resumed = subprocess.run(train_command(tiny, corpus, out, "--steps", "15"), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from step" in resumed.stderr and not checkpoint.parent.exists()
    assert_same_weights(tmp_path / "unbroken", out)

    assert_cli_decodes_greedily(tiny["qwen3"], "--mtp-path", str(out), "--num-draft", "2")


def test_train_mtp_on_text_and_answers(tiny, tmp_path, corpus):
    """Both kinds of data: held-out acceptance is reported on each, the answers first (the headline)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in [*HEAD_TEXTS, "import os"]))
    proc = subprocess.run(train_command(tiny, corpus, tmp_path / "head", "--steps", "4", "--prompts", str(prompts),
                                        "--answer-tokens", "40", "--eval-every", "2"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "the target answers 4 of 4 prompts" in proc.stderr, proc.stderr
    assert proc.stderr.count("% on answers (per draft position: ") == 2 and proc.stderr.count("% on text (") == 2
    training = json.loads((tmp_path / "head" / "config.json").read_text())["training"]
    assert set(training["held_out_acceptance_per_position"]) == {"answers", "text"}
    assert training["held_out_first_draft_acceptance"] == training["held_out_acceptance_per_position"]["answers"][0]
    assert training["data_tokens"]["answers"] > 0 == training["data_tokens"]["answers"] % 33  # rows of 33


def test_train_mtp_refusals(tiny, tmp_path, corpus):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(run_cli(*train_command(tiny, empty, tmp_path / "a")[3:]), "holds no text files")
    short = train_command(tiny, corpus, tmp_path / "c")[3:]
    short[short.index("--seq-len") + 1] = "1"
    assert_one_line_error(run_cli(*short), "--seq-len must be >= 2")
    steps = train_command(tiny, corpus, tmp_path / "d")[3:]
    steps[steps.index("--draft-steps") + 1] = "0"
    assert_one_line_error(run_cli(*steps), "--draft-steps must be >= 1")
    assert_one_line_error(run_cli(*train_command(tiny, corpus, tmp_path / "e", "--layer-lr", "2")[3:]),
                          "--layer-lr must be from 0 (frozen) to 1")
    nothing = train_command(tiny, corpus, tmp_path / "f")[3:]
    del nothing[nothing.index("--data"):nothing.index("--data") + 2]
    assert_one_line_error(run_cli(*nothing), "nothing to train on", "--prompts")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hi"}\n')
    assert_one_line_error(run_cli(*train_command(tiny, corpus, tmp_path / "g", "--prompts", str(bad))[3:]),
                          "bad.jsonl:1", "\"prompt\"")
    exists = tmp_path / "exists"
    exists.mkdir()
    assert_one_line_error(run_cli(*train_command(tiny, corpus, exists)[3:]), "already exists")
    hybrid = train_command(tiny, corpus, tmp_path / "b")[3:]
    hybrid[hybrid.index("--model") + 1] = str(tiny["qwen3_5"])
    assert_one_line_error(run_cli(*hybrid), "'qwen3_5'", "ship their own MTP layer")
    wrong = run_cli("generate", "--model", str(tiny["llama"]), "--mtp-path", str(tiny["qwen3-mtp-head"]),
                    "--prompt", "hi")
    assert_one_line_error(wrong, "trained for a target with model_type 'qwen3'", "mlx-spec train-mtp")


def test_mtp_head_flags(tiny):
    """A head drafts by --mtp-path only; the mtp drafter without one says how to get one."""
    head = str(tiny["qwen3-mtp-head"])
    as_draft = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", head, "--prompt", "hi")
    assert_one_line_error(as_draft, "is an MTP head", f"--mtp-path {head}")
    not_head = run_cli("generate", "--model", str(tiny["qwen3"]), "--mtp-path", str(tiny["llama"]), "--prompt", "hi")
    assert_one_line_error(not_head, "holds no MTP head", "train-mtp")
    none = run_cli("generate", "--model", str(tiny["qwen3"]), "--drafter", "mtp", "--prompt", "hi")
    assert_one_line_error(none, "declares no MTP layer", "--mtp-path")
    pre = run_cli("generate", "--model", str(tiny["qwen3"]), "--mtp-path", head, "--mtp-hidden", "pre",
                  "--prompt", "hi")
    assert_one_line_error(pre, "post-norm hidden state")
    engine = mlx_spec.load(str(tiny["qwen3"]), mtp_path=head, drafter="ngram")
    assert "mtp" in engine.status().drafters and engine.with_drafter("mtp").status().drafter == "mtp"


def test_heads_for_a_quantized_target(tiny, tmp_path, corpus):
    """Most Macs run quantized targets: the suite's head, trained on the float model, drafts exactly for its 8-bit
    conversion (drafts accepted and rejected: on random weights 8 bits change many continuations), and train-mtp trains on the quantized target itself (frozen as it is, the head
    in float), writing a head that drafts for it exactly."""
    q8 = tmp_path / "q8"
    converted_q8(tiny["qwen3"], q8)
    engine = mlx_spec.load(str(q8), mtp_path=str(tiny["qwen3-mtp-head"]), draft_len=2)
    assert type(engine.target.model.layers[0].self_attn.q_proj).__name__ == "QuantizedLinear"
    first = []
    for text in HEAD_TEXTS:
        ids = engine.encode(text)
        result = engine.generate(ids, max_tokens=40)
        assert result.tokens == plain_greedy(q8, ids, 40)
        first.append(result.stats.per_position_acceptance[0])
    assert 0 < min(first) and max(first) < 1, first
    command = train_command(tiny, corpus, tmp_path / "head", "--steps", "3")
    command[command.index(str(tiny["qwen3"]))] = str(q8)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    engine = mlx_spec.load(str(q8), mtp_path=str(tmp_path / "head"), draft_len=2)
    assert type(engine.drafter.mtp.layers[0].self_attn.q_proj).__name__ == "Linear"
    ids = engine.encode(HEAD_TEXTS[0])
    assert engine.generate(ids, max_tokens=40).tokens == plain_greedy(q8, ids, 40)
