"""Lookahead decoding: exact output, the paper's attention layout, the pool learning from Jacobi trajectories."""

import json

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, assert_one_line_error, plain_greedy, run_cli

import mlx_spec
from mlx_spec.drafters.lookahead import LookaheadDrafter
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.runners.target import MAX_DRAFT_LEN, Step
from mlx_spec.core.verify import position_keys, verify_tree

REPEATED = "def f(x):\n    return x\n" * 4


@pytest.mark.parametrize("family", ["qwen3", "llama", "gemma3"])
def test_lookahead_output_is_the_target_greedy_output(tiny, family):
    """Pinned n-gram lengths 1..6 (6 narrows the window to stay within the node budget), a prompt and a
    repetitive one: the tokens are mlx-lm's own greedy decoding, and drafts are both accepted and rejected along the
    way (Gemma 3: far past its 16-token sliding window)."""
    accepted = drafted = 0
    for prompt in (PROMPT, REPEATED):
        engine = mlx_spec.load(str(tiny[family]), drafter="lookahead")
        ids = engine.encode(prompt)
        expected = plain_greedy(tiny[family], ids, 80)
        for k in (1, 2, 3, 4, 6):
            engine.pin(k)
            result = engine.generate(ids, max_tokens=80)
            assert result.tokens == expected, (prompt, k)
            assert result.stats.nodes > result.stats.drafted  # the lookahead branch ran beside the n-grams
            assert result.stats.drafter_report.startswith("pool hit rate")
            accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0 < accepted < drafted


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_lookahead_rows_of_a_batch_are_the_target_greedy_output(tiny, family):
    """Rows joining and leaving a batch each run their own lookahead window and pool, verified in the batch's one
    forward: every row's tokens are mlx-lm's greedy decoding, with pool n-grams both accepted and rejected, and
    each row drafts what it drafts alone (Gemma 3: past its 16-token window)."""
    engine = mlx_spec.load(str(tiny[family]), drafter="lookahead", draft_len=3)
    assert engine.batch_problem() is None
    engine.tokenizer.eos_token_ids = []  # rows run to their own max_tokens: they leave at different rounds
    prompts = [PROMPT, REPEATED, PROMPT * 2, REPEATED + PROMPT]
    jobs = [mlx_spec.Job(engine.encode(p), max_tokens=n) for p, n in zip(prompts, (40, 24, 32, 28))]
    results = dict(engine.generate_many(jobs, 3))
    for i, job in enumerate(jobs):
        assert results[i].tokens == plain_greedy(tiny[family], job.prompt, job.max_tokens), i
        alone = engine.generate(job.prompt, max_tokens=job.max_tokens).stats
        assert (results[i].stats.drafted, results[i].stats.accepted) == (alone.drafted, alone.accepted), i
    stats = [r.stats for r in results.values()]
    assert max(s.batch_size for s in stats) == 3 and sum(s.nodes for s in stats) > sum(s.drafted for s in stats)
    assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)


def brute_force_layout(root, columns, levels, ngrams):
    """The lookahead decoding batch as the paper and llama.cpp lay it out: (token, position, sequences), and
    which items see which (a shared sequence and an earlier or equal position). Level 0 of column i (i >= 1)
    belongs to sequences i..W-1 and sits at position i; level j >= 1 of column i to sequence i only, at i + j;
    verification n-gram g to sequence W + g; the root to all."""
    w = len(levels[0])
    items = [(root, 0, set(range(w + len(ngrams))))]
    items += [(levels[0][i], i, set(range(i, w))) for i in range(1, columns)]
    items += [(levels[j][i], i + j, {i}) for j in range(1, len(levels)) for i in range(columns)]
    items += [(token, d + 1, {w + g}) for g, ngram in enumerate(ngrams) for d, token in enumerate(ngram)]
    sees = np.array([[bool(sa & sb) and pb <= pa for _, pb, sb in items] for _, pa, sa in items])
    return items, sees


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_the_tree_is_the_papers_attention_layout(k):
    """With every token distinct (nothing merges), the drafted tree's mask, positions and candidates are the
    brute-force construction's, item for item."""
    drafter = LookaheadDrafter(window=4, ngrams=3)
    context = [1, 2, 3]
    drafter.begin(context, Step(None))
    drafter.levels = [[100 + 10 * j + i for i in range(4)] for j in range(k)]
    ngrams = [tuple(200 + 10 * g + d for d in range(k)) for g in range(3)]
    drafter.pool = {3: list(ngrams)}
    draft = drafter.propose(context, k, SamplingParams(), mx.random.key(0))
    levels = [list(level) for level in drafter.levels]
    items, sees = brute_force_layout(3, 4, levels, ngrams)
    tokens = [3, *draft.tokens.tolist()]
    assert sorted(tokens) == sorted(t for t, _, _ in items)
    order = [next(n for n, (t, _, _) in enumerate(items) if t == token) for token in tokens]
    assert (draft.attention() == sees[np.ix_(order, order)]).all()
    assert [0, *draft.depths()] == [items[n][1] for n in order]
    assert draft.candidates == [token >= 200 for token in tokens[1:]] and draft.depth == k


def test_trees_stay_within_the_node_budget():
    drafter = LookaheadDrafter()
    for k in range(1, MAX_DRAFT_LEN + 1):
        columns, candidates = drafter.sizes(k)
        assert columns >= 1 and candidates >= 0 and columns * k - 1 + candidates * k <= MAX_DRAFT_LEN


def test_the_pool_learns_a_repeating_text_from_its_trajectories():
    """A target that repeats 5 6 7 8 9 (what follows a token is fixed): the prompt never shows the cycle, so
    the first rounds find nothing; then the Jacobi trajectories and the verified text fill the pool and most
    rounds accept all three drafts, each verified exactly (recycled columns still pool some wrong n-grams)."""
    cycle = [5, 6, 7, 8, 9]

    def target_logits(tokens):
        following = [cycle[(cycle.index(t) + 1) % 5] if t in cycle else cycle[0] for t in tokens]
        return mx.array(np.eye(16, dtype=np.float32)[following] * 10)

    drafter, context = LookaheadDrafter(), [1, 2, 3, 5]
    drafter.begin(context, Step(None))
    accepted = []
    for _ in range(12):
        draft = drafter.propose(context, 3, SamplingParams(), mx.random.key(0))
        logits = target_logits([context[-1], *draft.tokens.tolist()])
        path, new_tokens = verify_tree(draft, logits, SamplingParams(), context, position_keys(mx.random.key(0), 0, 4))
        assert new_tokens == [cycle[(cycle.index(context[-1]) + 1 + i) % 5] for i in range(len(new_tokens))]
        context = context + new_tokens
        drafter.accept(context, len(path), Step(logits[mx.array([0, *(n + 1 for n in path)])], tree_logits=logits))
        accepted.append(len(path))
    assert accepted[:3] == [0, 0, 0] and sum(a == 3 for a in accepted[-6:]) >= 4, accepted
    assert drafter.report().startswith("pool hit rate")


def test_lookahead_from_the_command_line_and_its_refusals(tiny):
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--drafter", "lookahead", "--prompt", REPEATED,
                   "--raw", "--max-tokens", "24", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "drafter: lookahead, trees of 4 trajectories and up to 4 pool n-grams" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["stats"]["drafter"] == "lookahead" and "pool hit rate" in out["stats"]["drafter_report"]
    proc = run_cli("generate", "--model", str(tiny["qwen3_5"]), "--drafter", "lookahead", "--prompt", "x")
    assert_one_line_error(proc, "lookahead decoding verifies a token tree", "recurrent layers", "--drafter ngram")
    assert "lookahead" not in mlx_spec.load(str(tiny["qwen3_5"]), drafter="off").status().drafters
    assert "lookahead" in mlx_spec.load(str(tiny["gemma3"]), drafter="off").status().drafters
