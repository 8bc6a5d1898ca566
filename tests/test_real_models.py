"""Greedy identity with plain decoding on real pretrained models (`pytest -m real`; fetch them first with
`python scripts/real_models.py`). Each test skips with the command that fetches what it needs."""

import sys
from pathlib import Path

import pytest
from helpers import plain_greedy

import mlx_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import real_models  # noqa: E402

pytestmark = pytest.mark.real
CODE = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number iteratively, "
                                    "with a docstring and type hints."}]


def fetched(name: str) -> str:
    path = real_models.mlx_dir(name)
    if not path.exists():
        pytest.skip(f"{name} is not fetched: python scripts/real_models.py {name}")
    return str(path)


def assert_greedy_identity(engine, path: str, prompt, max_tokens: int):
    ids = mlx_spec.render_prompt(engine.tokenizer, prompt)
    result = engine.generate(ids, max_tokens=max_tokens)
    assert result.tokens == plain_greedy(path, ids, max_tokens)
    return result


@pytest.mark.parametrize("drafter", ["draft-model", "ngram"])
def test_qwen_coder_pair(drafter):
    target, draft = fetched("qwen2.5-coder-1.5b"), fetched("qwen2.5-coder-0.5b")
    engine = mlx_spec.load(target, draft_model=draft if drafter == "draft-model" else None, drafter=drafter,
                           draft_len=4)
    result = assert_greedy_identity(engine, target, CODE, 40)
    assert "def " in result.text and result.stats.drafted > 0
    if drafter == "draft-model":
        assert result.stats.acceptance_rate > 0.5  # a real pair agrees most of the time on code


def test_smollm2_ngram():
    path = fetched("smollm2-135m")
    engine = mlx_spec.load(path, drafter="ngram", draft_len=4)
    result = assert_greedy_identity(engine, path, [{"role": "user", "content": "List three primary colours."}], 48)
    assert result.text.strip()


def test_gemma3_ngram_well_past_the_sliding_window():
    path = fetched("gemma3-270m")
    engine = mlx_spec.load(path, drafter="ngram", draft_len=4)
    window = engine.target.model.args.sliding_window
    lines, ids = [], []
    while len(ids) < window - 100:  # a prompt just short of the window, so that the generation crosses it
        lines.append(f"Line {len(lines)}: the quick brown fox jumps over the lazy dog.")
        prompt = [{"role": "user", "content": "Repeat this text exactly:\n" + " ".join(lines)}]
        ids = mlx_spec.render_prompt(engine.tokenizer, prompt)
    assert len(ids) < window < len(ids) + 160
    result = assert_greedy_identity(engine, path, prompt, 160)
    assert result.stats.accepted > 0


def test_gemma3_rows_of_a_batch_well_past_the_sliding_window():
    """Gemma 3's sliding-window layers in a batch hold about a window, not the context (runners/ragged.py): a row
    whose prompt is past twice the window and one whose answer crosses it, decoded together with n-gram drafts,
    equal mlx-lm's plain greedy decoding."""
    from mlx_spec.decode.rounds import Job

    path = fetched("gemma3-270m")
    engine = mlx_spec.load(path, drafter="ngram", draft_len=4)
    window = engine.target.model.args.sliding_window
    lines, ids = [], []
    while len(ids) < 2 * window + 300:  # past twice the window + 1 positions: its layers leave the oldest behind
        lines.append(f"Line {len(lines)}: the quick brown fox jumps over the lazy dog.")
        ids = mlx_spec.render_prompt(engine.tokenizer, [{"role": "user", "content": "Repeat this text exactly:\n"
                                                          + " ".join(lines)}])
    short = mlx_spec.render_prompt(engine.tokenizer, [{"role": "user", "content": "Count from 1 to 300."}])
    results = dict(engine.generate_many([Job(ids, max_tokens=120), Job(short, max_tokens=window)], 2))
    assert results[0].tokens == plain_greedy(path, ids, 120)
    assert results[1].tokens == plain_greedy(path, short, window)
    assert len(short) + len(results[1].tokens) > window and results[0].stats.accepted > 0
