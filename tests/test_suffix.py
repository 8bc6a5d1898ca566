"""Suffix decoding: the index finds the longest earlier match and what followed it as often as a brute-force
scan of every sequence does; drafts are its most frequent continuations, as long as the match allows; the
index keeps to its budget, dropping the oldest; its file survives a run and a damaged one is a warning and a
fresh start. Exact decoding with it (chains, trees, batches, sampled) is in test_lossless.py, test_batched.py
and test_sampling.py."""

from collections import Counter

import numpy as np
import pytest
from helpers import KEY as API_KEY
from helpers import PROMPT, assert_one_line_error, plain_greedy, run_cli, start_server

import mlx.core as mx
import mlx_spec
from mlx_spec.drafters.suffix import (KEY, MAX_MATCH, MIN_PROBABILITY, SuffixDrafter, SuffixIndex, best_paths,
                                      continuations)
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.runners.target import Step


def brute_force(sequences: list[list[int]], context: list[int]) -> tuple[int, Counter]:
    """The longest match (up to MAX_MATCH) of the end of `context` anywhere before a token of some sequence, and
    how often each continuation of 4 tokens followed it, by comparing at every position of every sequence."""
    best, found = 0, []
    for sequence in sequences:
        for end in range(1, len(sequence)):
            n = 0
            while n < min(MAX_MATCH, end, len(context)) and sequence[end - 1 - n] == context[-1 - n]:
                n += 1
            if n > best:
                best, found = n, []
            if n == best and n:
                found.append(tuple(sequence[end:end + 4]))
    return best, Counter(found)


@pytest.mark.parametrize("seed", range(6))
def test_matches_and_their_continuations_equal_a_brute_force_scan(seed):
    """Random sequences over a small vocabulary (so that suffixes recur, at every match length), the context
    the last one: the same longest match, and its continuations as often as a full scan finds them."""
    rng = np.random.default_rng(seed)
    vocab = 3 + seed
    sequences = [rng.integers(0, vocab, rng.integers(20, 120)).tolist() for _ in range(5)]
    sequences.append(sequences[1][:30] + rng.integers(0, vocab, 10).tolist())  # a long match too
    index = SuffixIndex()
    for sequence in sequences:
        index.add(sequence)
    match, found = index.occurrences(sequences[-1])
    expected_match, expected = brute_force(sequences, sequences[-1])
    assert match == expected_match > 0
    assert Counter(tuple(c) for c in continuations(index, found, 4)) == expected


def test_drafts_are_the_most_frequent_continuations_as_long_as_the_match():
    index = SuffixIndex()
    for tail in ([5, 6, 7], [5, 6, 7], [5, 6, 8], [5, 9, 9]):
        index.add([1, 2, 3, 4] + tail)
    drafter = SuffixDrafter(index)
    drafter.begin([0, 2, 3, 4], Step(None))  # a match of 3: "2 3 4"
    assert drafter.propose([0, 2, 3, 4], 8, SamplingParams(), mx.random.key(0)).tokens.tolist() == [5, 6, 7]
    drafter.begin([0, 0, 0, 4], Step(None))  # a match of 1 drafts 1 token
    assert drafter.propose([0, 0, 0, 4], 8, SamplingParams(), mx.random.key(0)).tokens.tolist() == [5]
    tree = SuffixDrafter(index, width=3)
    tree.begin([0, 2, 3, 4], Step(None))
    draft = tree.propose([0, 2, 3, 4], 3, SamplingParams(), mx.random.key(0))
    paths = {tuple(draft.tokens[i].item() for i in node_path(draft, end)) for end in draft.ends}
    assert paths == {(5, 6, 7), (5, 6, 8), (5, 9, 9)}  # every continuation at 1/4 or more


def node_path(draft, node):
    path = []
    while node >= 0:
        path.insert(0, node)
        node = draft.parents[node]
    return path


def test_best_paths_keep_to_the_budget_and_the_least_probability():
    paths = [[1, 2, 3]] * 6 + [[1, 2, 4]] * 3 + [[1, 5, 5]] * 1 + [[7, 7, 7]] * 11
    assert best_paths(paths, 3, 1) == [[7, 7, 7]]
    chosen = best_paths(paths, 7, 3)
    assert [7, 7, 7] in chosen and [1, 2, 3] in chosen and [1, 2, 4] in chosen
    assert not any(path[:2] == [1, 5] for path in chosen)  # 1/21 < MIN_PROBABILITY
    assert MIN_PROBABILITY == 0.1 and sum(len(p) for p in chosen) <= 7 + 3  # shared prefixes counted once


def test_the_index_keeps_to_its_budget_dropping_the_oldest():
    index = SuffixIndex(budget=100)
    ids = [index.add(list(range(i, i + 40))) for i in range(5)]
    index.evict(keep={ids[0]})
    assert index.size == 80 and list(index.sequences) == [ids[0], ids[4]]
    assert all(entry >> 32 in index.sequences for found in index.ends.values() for entry in found)
    match, found = index.occurrences([99, 1, 2])  # "1 2" only the first sequence holds now
    assert match == 2 and found == [(ids[0], 3)]


def test_a_request_that_extends_the_last_extends_its_sequence():
    index = SuffixIndex()
    drafter = SuffixDrafter(index)
    drafter.begin([1, 2, 3], Step(None))
    drafter.accept([1, 2, 3, 4], 0, Step(None))
    drafter.begin([1, 2, 3, 4, 5, 6], Step(None))  # the next turn of a chat
    assert list(index.sequences.values()) == [[1, 2, 3, 4, 5, 6]]
    drafter.begin([9, 9], Step(None))
    assert list(index.sequences.values()) == [[1, 2, 3, 4, 5, 6], [9, 9]]


def test_the_cache_file_round_trips_and_a_damaged_one_starts_afresh(tmp_path, capsys):
    index = SuffixIndex()
    for sequence in ([1, 2, 3], [], [4, 5, 6, 7]):
        index.add(sequence)
    path = tmp_path / "cache.npz"
    index.save(path)
    again = SuffixIndex.load(path)
    assert list(again.sequences.values()) == [[1, 2, 3], [], [4, 5, 6, 7]] and again.ends == index.ends
    assert [p.name for p in tmp_path.iterdir()] == ["cache.npz"]  # nothing staged left behind
    for damage in (b"not a cache at all", path.read_bytes()[:60]):
        path.write_bytes(damage)
        fresh = SuffixIndex.load(path)
        assert not fresh.sequences
        warning = capsys.readouterr().err.strip()
        assert warning.startswith("[WARN] the suffix cache") and "fresh" in warning and len(warning.splitlines()) == 1


def test_a_command_line_agent_drafts_from_its_earlier_runs(tiny, tmp_path):
    """Two runs of the same request with --suffix-cache: the second drafts the first's answer, nearly all of it
    accepted; the file is written whole; a damaged one is a warning line and the run goes on."""
    cache = tmp_path / "agent.npz"
    args = ("generate", "--model", str(tiny["qwen3"]), "--drafter", "suffix", "--suffix-cache", str(cache),
            "--num-draft", "6",
            "--prompt", PROMPT, "--max-tokens", "40", "--raw", "--json")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    second = run_cli(*args)
    assert second.returncode == 0, second.stderr
    import json

    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert one["tokens"] == two["tokens"]
    assert two["stats"]["accepted"] > max(one["stats"]["accepted"], 20)
    assert "2 sequences" in two["stats"]["drafter_report"]
    cache.write_bytes(b"garbage")
    third = run_cli(*args)
    assert third.returncode == 0 and "[WARN] the suffix cache" in third.stderr
    assert len(SuffixIndex.load(cache).sequences) == 1


def test_suffix_cache_flags_are_checked_before_loading(tiny, tmp_path):
    assert_one_line_error(run_cli("generate", "--model", str(tiny["qwen3"]), "--suffix-cache", str(tmp_path / "c"),
                                  "--prompt", "x"), "--suffix-cache", "--drafter suffix")
    assert_one_line_error(run_cli("generate", "--model", str(tiny["qwen3"]), "--drafter", "suffix", "--suffix-cache",
                                  str(tmp_path), "--prompt", "x"), "--suffix-cache", "folder")


def test_the_engine_offers_suffix_and_keys_are_the_lookup():
    assert KEY >= 2 and "suffix" in mlx_spec.load(None).drafters


@pytest.mark.parametrize("family,width", [("qwen3", 1), ("gemma3", 3), ("qwen3_5", 1)])
def test_greedy_output_is_the_targets_own_as_the_index_grows(tiny, family, width):
    """Three requests through one engine (chains; Gemma 3's sliding windows with trees; a Gated DeltaNet
    target): each output is mlx-lm's plain greedy one, while the later ones draft from the earlier ones, drafts
    both accepted and rejected."""
    engine = mlx_spec.load(str(tiny[family]), drafter="suffix", tree_width=width, draft_len=6)  # not the clock's
    ids = engine.encode(PROMPT)
    drafted = accepted = 0
    for prompt in (ids, ids, ids[:len(ids) // 2]):
        result = mlx_spec.generate(engine, prompt, max_tokens=96, repetition_penalty=1.3)
        assert result.tokens == plain_greedy(tiny[family], prompt, 96, 1.3)
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert 0 < accepted < drafted


@pytest.mark.parametrize("batch_size", ["1", "4"])
def test_a_server_drafts_each_request_from_the_ones_before_and_keeps_them(tiny, tmp_path, batch_size):
    """The same question three times: the later answers draft the first one's (in a batch too); at shutdown the
    index is saved to --suffix-cache, every answer in it."""
    import signal

    import httpx

    cache = tmp_path / "server.npz"
    proc, url = start_server(tiny, "--batch-size", batch_size, "--num-draft", "6",
                             drafter=("--drafter", "suffix", "--suffix-cache", str(cache)))
    try:
        usages = []
        for _ in range(3):
            reply = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                               timeout=120, json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
                                     "temperature": 0})
            assert reply.status_code == 200, reply.text
            usages.append(reply.json()["usage"])
        assert usages[2]["draft_n_accepted"] > max(usages[0]["draft_n_accepted"], 20)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert len(SuffixIndex.load(cache).sequences) >= 3
