"""The adaptive policy's profile kept between runs (mlx_spec/policy/profiles.py): a command starts from what the
last one with the same target and drafter learnt on this machine, and nothing else changes what it outputs."""

import json

import pytest
from helpers import PROMPT, plain_greedy, run_cli

import mlx_spec


def load(tiny, **drafter):
    engine = mlx_spec.load(str(tiny["qwen3"]), **(drafter or {"draft_model": str(tiny["qwen3-draft"])}))
    engine.tokenizer.eos_token_ids = []  # every generation runs to max_tokens
    return engine


def test_a_run_starts_from_the_profile_the_last_one_kept(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SPEC_POLICY_PROFILES", str(tmp_path))
    ids = load(tiny).encode(PROMPT)
    reference = plain_greedy(tiny["qwen3"], ids, 48)
    first = load(tiny)
    assert first.status().reasons[1:] == ["still measuring: a plain step, then a draft"]
    assert first.generate(ids, max_tokens=48).tokens == reference
    [kept] = tmp_path.glob("*.json")
    profile = json.loads(kept.read_text())["profile"]
    assert set(profile["shapes"]) == {"1"} and profile["shapes"]["1"]["costs"]

    second = load(tiny)  # a later command: the costs and acceptance measured, from its first round
    reasons = second.status().reasons
    assert reasons[1].startswith("chains: k=1 ") and "a round costs k=1 " in reasons[2]
    assert second.generate(ids, max_tokens=48).tokens == reference
    assert [path.name for path in tmp_path.glob("*.json")] == [kept.name]  # updated in place

    other = load(tiny, drafter="ngram")  # another drafter: its own profile
    assert other.status().reasons[1:] == ["still measuring: a plain step, then a draft"]
    kept.write_text("{not json")  # a broken profile is not read
    assert load(tiny).status().reasons[1:] == ["still measuring: a plain step, then a draft"]


def test_a_later_command_starts_from_what_the_ngram_drafter_learnt_of_its_drafts(tiny, tmp_path, monkeypatch):
    """The n-gram drafter's estimates of its drafts' acceptance by match length (what its outlook weighs) are kept
    in the profile: a later command's drafter starts from them, not from the prior, and still outputs plain
    greedy decoding; estimates that are not a list of (passed, judged) pairs leave the prior."""
    monkeypatch.setenv("MLX_SPEC_POLICY_PROFILES", str(tmp_path))
    first = load(tiny, drafter="ngram")
    ids = first.encode(PROMPT)
    ids = ids + plain_greedy(tiny["qwen3"], ids, 40) + ids  # a prompt that holds the answer: copies to learn from
    reference, prior = plain_greedy(tiny["qwen3"], ids, 40), first.drafter.estimates()
    assert first.generate(ids, max_tokens=40).tokens == reference
    learnt = first.drafter.estimates()
    [kept] = tmp_path.glob("*.json")
    saved = json.loads(kept.read_text())
    assert learnt != prior and saved["profile"]["drafter"] == learnt
    second = load(tiny, drafter="ngram")
    assert second.drafter.estimates() == learnt
    assert second.generate(ids, max_tokens=40).tokens == reference
    saved["profile"]["drafter"] = [[1, 0]] * len(prior)
    kept.write_text(json.dumps(saved))
    assert load(tiny, drafter="ngram").drafter.estimates() == prior


def test_profiles_are_kept_nowhere_when_turned_off(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SPEC_POLICY_PROFILES", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    engine = load(tiny)
    engine.generate(engine.encode(PROMPT), max_tokens=24)
    assert not list(tmp_path.rglob("*.json"))


def test_a_profile_that_cannot_be_written_is_said_once_and_the_run_goes_on(tiny, tmp_path):
    """The real CLI in a subprocess, its profile folder under a file: one line on stderr, the answer as usual."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    done = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-draft"]), "--prompt",
                   PROMPT, "--max-tokens", "16", env={"MLX_SPEC_POLICY_PROFILES": str(blocked / "policy")})
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "cannot keep the draft-length profile" in line]
    assert len(warnings) == 1 and "MLX_SPEC_POLICY_PROFILES" in warnings[0] and done.stdout.strip()


@pytest.mark.parametrize("broken", [{"plain_time": 1.0, "shapes": {"1": {"acceptance": "x"}}}, {"shapes": 3}, []])
def test_a_profile_of_the_wrong_shape_starts_the_policy_from_nothing(broken):
    from mlx_spec.policy.sequence import AdaptiveDraftLength
    policy = AdaptiveDraftLength(4, profile=broken)
    assert policy.plain_time is None and policy.explain()[1:] == ["still measuring: a plain step, then a draft"]
