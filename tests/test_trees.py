"""Token trees: one target forward scores every branch (tree mask, per-node positions), the accepted path is
compacted in the cache, and verification stays exact, greedy and sampled, alone and as rows of a batch."""

import random

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, FlatCostBatchPolicy, assert_one_line_error, plain_greedy, plain_sampled, run_cli

import mlx_spec
from mlx_spec.core.draft import Draft
from mlx_spec.decode.rounds import Job
from mlx_spec.decode.engine import Engine
from mlx_spec.drafters.protocol import Drafter
from mlx_spec.core.sampling import SamplingParams, distributions
from mlx_spec.runners.target import Target
from mlx_spec.core.verify import position_keys, verify_tree

MAX_TOKENS = 120


class OracleTreeDrafter(Drafter):
    """A tree of `width` nodes per level around the known reference continuation: the right token at a random
    sibling place (sometimes corrupted, so rounds end at every depth), wrong siblings with children of their own.
    It drives the engine; it is not under test."""

    name = "oracle-tree"

    def __init__(self, reference: list[int], prompt_len: int, vocab: int, width: int = 3, seed: int = 0):
        self.reference, self.prompt_len, self.vocab, self.width = reference, prompt_len, vocab, width
        self.rng = random.Random(seed)

    def begin(self, context, prompt_step):
        pass

    def propose(self, context, k, params, key):
        done = len(context) - self.prompt_len
        tokens, parents = [], []
        on_path, level = -1, [-1]  # the node continuing the reference (None once corrupted), the last level
        for token in self.reference[done:done + k]:
            right_place = self.rng.randrange(self.width)
            new = []
            for place in range(self.width):
                if place == right_place and on_path is not None:
                    corrupted = self.rng.random() < 0.15
                    parents.append(on_path)
                    tokens.append((token + 1) % self.vocab if corrupted else token)
                    on_path = None if corrupted else len(tokens) - 1
                else:
                    parents.append(self.rng.choice(level))
                    tokens.append(self.rng.randrange(self.vocab))
                new.append(len(tokens) - 1)
            level = new
        if not tokens:
            return Draft.empty()
        return Draft(mx.array(tokens, dtype=mx.int32), parents=parents)

    def accept(self, context, accepted, step):
        pass


@pytest.mark.parametrize("family", ["qwen3", "llama", "deepseek_v32"])  # full attention, DeepSeek's sparse one
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_tree_rounds_equal_plain_decoding(tiny, family, penalty):
    plain = mlx_spec.load(str(tiny[family]), drafter="off")
    ids = plain.encode(PROMPT)
    reference = plain_greedy(tiny[family], ids, MAX_TOKENS + 8, penalty)
    drafter = OracleTreeDrafter(reference, len(ids), len(plain.tokenizer.get_vocab()))
    engine = Engine(Target(plain.target.model), plain.tokenizer, drafter, draft_len=4)
    rounds, result = [], None
    for event in engine.stream(ids, SamplingParams(repetition_penalty=penalty), MAX_TOKENS):
        if isinstance(event, mlx_spec.Round):
            rounds.append(event)
        elif isinstance(event, mlx_spec.Done):
            result = event
    assert result.tokens == reference[:MAX_TOKENS]
    assert {r.accepted for r in rounds} >= {0, 1, 2, 3, 4}  # every path length, rejections at every depth
    assert sum(r.nodes for r in rounds) > sum(r.draft_len for r in rounds)  # branches were verified


@pytest.mark.parametrize("family, draft", [("qwen3", "qwen3-draft"), ("llama", "llama-draft"), ("qwen3", "qwen3")])
@pytest.mark.parametrize("width", [2, 3])
def test_draft_model_tree_equals_plain_decoding(tiny, family, draft, width):
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(tiny[draft]), tree_width=width, draft_len=3)
    assert engine.status().shape == f"tree of width {width}"
    ids = engine.encode(PROMPT)
    for params in (SamplingParams(), SamplingParams(repetition_penalty=1.3)):
        result = engine.generate(ids, params, MAX_TOKENS)
        assert result.tokens == plain_greedy(tiny[family], ids, MAX_TOKENS, params.repetition_penalty)
        stats = result.stats
        assert stats.nodes == width * stats.drafted
        if draft == family and not params.has_penalties:
            # the target drafting for itself: every first child is right, so the draft's cache, compacted to
            # the accepted path each round (siblings interleaved before it), stayed exact
            assert stats.accepted == stats.drafted
        else:
            assert 0 < stats.accepted < stats.drafted


NGRAM_TEXTS = {"qwen3": PROMPT + "".join(f"value = {i}\n" for i in range(6)) + "value = ",  # went on six ways
               "llama": ") " * 20}  # the random llama writes none of those digits; after this it repeats itself


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_ngram_tree_equals_plain_decoding(tiny, family):
    """Several earlier continuations of the current suffix, merged into a tree."""
    engine = mlx_spec.load(str(tiny[family]), drafter="ngram", tree_width=3, draft_len=4)
    ids = engine.encode(NGRAM_TEXTS[family])
    result = engine.generate(ids, max_tokens=MAX_TOKENS)
    assert result.tokens == plain_greedy(tiny[family], ids, MAX_TOKENS)
    assert result.stats.nodes > result.stats.drafted  # some rounds verified several continuations
    assert 0 < result.stats.accepted < result.stats.drafted


def test_paths_merge_into_a_trie_in_depth_order():
    tree = Draft.from_paths([[5, 6, 7], [5, 8], [9, 6, 7], [5, 6, 7]])
    assert tree.tokens.tolist() == [5, 9, 6, 8, 6, 7, 7]
    assert tree.parents == [-1, -1, 0, 0, 1, 2, 4]
    assert tree.depths() == [1, 1, 2, 2, 2, 3, 3]
    assert Draft.from_paths([[1, 2, 3], [1, 2]]).parents is None  # one path: a chain
    assert Draft.from_paths([[]]).tokens.size == 0


def test_quantized_kv_tree_equals_plain_decoding(tiny):
    """With an 8-bit KV cache, trees keep exactly what plain decoding with that cache keeps (mlx-lm's own)."""
    tree = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), kv_bits=8, kv_group_size=32,
                         tree_width=3, draft_len=4)
    ids = tree.encode(PROMPT)
    result = tree.generate(ids, max_tokens=80)
    assert result.tokens == plain_greedy(tiny["qwen3"], ids, 80, kv_bits=8)
    assert 0 < result.stats.accepted < result.stats.drafted


@pytest.mark.parametrize("kv_bits", [None, 8])
def test_tree_forward_and_compaction_match_a_fresh_forward(tiny, kv_bits):
    plain = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    ids = plain.encode(PROMPT)
    tree = Draft(mx.array([11, 12, 13, 14, 15, 16], dtype=mx.int32), parents=[-1, -1, 0, 0, 1, 3])
    target = Target(plain.target.model, kv_bits, 32)
    target.prefill(ids[:-1])
    base = target.offset
    step = target.forward(mx.array([ids[-1], *tree.tokens.tolist()]), tree.attention(),
                          [base + d for d in [0, *tree.depths()]])
    for node in range(6):  # each node scores what a chain over its ancestors scores
        path = [ids[-1]] + [tree.tokens[a].item() for a in tree.ancestors(node)]
        fresh = Target(plain.target.model, kv_bits, 32)
        fresh.prefill(ids[:-1])
        expected = fresh.forward(path).logits[-1]
        assert mx.allclose(step.logits[node + 1], expected, atol=1e-4).item(), node
    target.keep(7, [0, 1, 4, 6])  # the path 11 -> 14 -> 16 (nodes 0, 3, 5: inputs 1, 4, 6) after the last token
    fresh = Target(plain.target.model, kv_bits, 32)
    fresh.prefill(ids[:-1])
    fresh.forward([ids[-1], 11, 14, 16])
    assert target.offset == fresh.offset == base + 4
    for mine, theirs in zip(target.cache, fresh.cache):
        for x, y in zip(buffers(mine), buffers(theirs)):
            assert mx.allclose(x[..., : target.offset, :], y[..., : fresh.offset, :], atol=1e-5).item()
    after = target.forward([17]).logits[-1]  # and decoding goes on from the compacted cache as from a fresh one
    assert mx.allclose(after, fresh.forward([17]).logits[-1], atol=1e-4).item()


def buffers(cache) -> list:
    """A KV cache's arrays (a quantized cache keeps data, scales and biases for keys and for values)."""
    return [b for kv in (cache.keys, cache.values) for b in (kv if isinstance(kv, tuple) else (kv,))]


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.8),
                                    SamplingParams(temperature=1.3, top_k=4)])
def test_tree_verification_samples_the_target_distribution(params):
    """Siblings (a repeated token among them, one the target may rule out) tried in order: the first emitted
    token follows p at the root, and the second, after the first child's token, follows p at that child."""
    vocab, draws = 8, 6000
    logits = mx.random.normal((7, vocab), key=mx.random.key(1)) * 1.5  # rows: [last, *nodes]
    p = np.array(distributions(logits, params, []))
    likely = [int(t) for t in np.argsort(-p[0])]  # root tokens, most probable first
    # root children: likely[0], likely[1], likely[0] again, the least likely; node 0 has two children
    tree = Draft(mx.array([likely[0], likely[1], likely[0], likely[-1], 3, 4], dtype=mx.int32),
                 parents=[-1, -1, -1, -1, 0, 0])
    first, second = np.zeros(vocab), np.zeros(vocab)
    for seed in range(draws):
        path, emitted = verify_tree(tree, logits, params, [], position_keys(mx.random.key(seed), 0, 3))
        assert emitted[:-1] == [tree.tokens[n].item() for n in path]
        first[emitted[0]] += 1
        if path[:1] == [0]:
            second[emitted[1]] += 1
    assert_follows(first, p[0])
    assert second.sum() > draws / 10 and 0 < first[likely[1]]
    assert_follows(second, p[1])  # node 0's row: what the target says after its token


def assert_follows(counts: np.ndarray, p: np.ndarray) -> None:
    """Chi-square goodness of fit at a fixed, generous threshold (deterministic seeds: no flakiness)."""
    n, support = counts.sum(), p > 0
    assert counts[~support].sum() == 0, "a token the target rules out was emitted"
    expected = n * p[support]
    chi2 = (((counts[support] - expected) ** 2) / expected).sum()
    assert chi2 < 3 * support.sum() + 10, (chi2, counts / n, p)


def test_sliding_window_targets_verify_trees_past_the_window(tiny):
    """A Gemma 3 target (16-token window) verifies the trees of a full-attention draft exactly, far past its
    window; its own layer-skip draft, sliding too, cannot grow trees level by level and drafts chains, saying
    why."""
    ids = mlx_spec.load(str(tiny["gemma3"]), drafter="off").encode(PROMPT * 2)
    expected = plain_greedy(tiny["gemma3"], ids, 90)
    engine = mlx_spec.load(str(tiny["gemma3"]), draft_model=str(tiny["qwen3-draft"]), tree_width=3, draft_len=3)
    assert engine.status().shape == "tree of width 3"
    result = engine.generate(ids, max_tokens=90)
    assert result.tokens == expected and result.stats.nodes > result.stats.drafted
    assert 0 < result.stats.accepted < result.stats.drafted
    engine = mlx_spec.load(str(tiny["gemma3"]), draft_model=str(tiny["gemma3-draft"]), tree_width=3, draft_len=3)
    assert engine.status().shape.startswith("chain (no tree: gemma3-draft has sliding-window or sparse-attention "
                                            "layers, which verify a tree in one forward but cannot grow one level by "
                                            "level")
    result = engine.generate(ids, max_tokens=60)
    assert result.tokens == expected[:60] and 0 < result.stats.accepted < result.stats.drafted


def test_the_sliding_window_tree_mask_is_the_brute_force_one():
    """After wraps and rollbacks, a tree's mask over a sliding-window cache: node i at position q_i sees a
    cached key at position p iff q_i - window < p, and a node at p iff it is an ancestor (or itself) with
    q_i - window < p; checked as mlx-lm lays the keys out for a multi-token update."""
    from mlx_spec.seams.caches import TreeRotatingKVCache, rollback, tree_forward

    window, slack = 6, 5
    cache = TreeRotatingKVCache(max_size=window + slack)
    for t in range(23):
        cache.update_and_fetch(mx.full((1, 1, 1, 1), float(t)), mx.zeros((1, 1, 1, 1)))
    rollback([cache], 3, slack)
    draft = Draft(mx.array([1, 2, 3, 4, 5, 6, 7]), parents=[-1, -1, 0, 1, 2, 4, 5])  # depths 1 1 2 2 3 4 5
    depths = [0, *draft.depths()]
    with tree_forward([cache], draft.attention(), [cache.offset + d for d in depths]):
        mask = np.array(cache.make_mask(8, window_size=window))
    prefix = min(cache.max_size - 1, cache.offset)
    ancestors = draft.attention()
    for i, d in enumerate(depths):
        q = cache.offset + d
        sees = [q - window < cache.offset - prefix + j for j in range(prefix)]
        sees += [bool(ancestors[i, a]) and q - window < cache.offset + depths[a] for a in range(8)]
        assert mask[i].tolist() == sees, i


def test_tree_width_refusals(tiny):
    proc = run_cli("generate", "--model", str(tiny["qwen3_5"]), "--drafter", "mtp", "--tree-width", "3",
                   "--prompt", "hi")
    assert_one_line_error(proc, "--tree-width needs a draft model", "the mtp drafter proposes chains only")
    proc = run_cli("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-draft"]),
                   "--tree-width", "0", "--prompt", "hi")
    assert_one_line_error(proc, "tree width must be from 1")


@pytest.mark.parametrize("family, options", [
    ("qwen3", {"draft_model": "qwen3-draft"}), ("qwen3", {"drafter": "ngram"}), ("qwen3", {"drafter": "suffix"}),
    ("qwen3", {"draft_model": "qwen3-eagle3"}), ("qwen3", {"draft_model": "qwen3-medusa"}),
    ("qwen3", {"draft_model": "qwen3-dflash"}), ("gemma3", {"draft_model": "qwen3-draft"}),
    ("deepseek_v32", {"draft_model": "qwen3-draft"})],
    ids=["draft-model", "ngram", "suffix", "eagle3", "medusa", "ddtree", "gemma3-window", "sparse-attention"])
def test_token_trees_in_a_batch_equal_plain_decoding(tiny, family, options):
    """Rows of a batch (joining and leaving) each verify their own token tree in the batch's one forward, at their
    own positions, and keep the accepted path (and, for heads that read them, the target's states along it): every
    row's output is mlx-lm's plain greedy decoding, greedy rows and sampled rows (its seeded draws) alike; trees
    are drafted (more nodes than depth), passing and failing. The Gemma 3 target's 16-token window is passed long
    before the end."""
    options = {k: str(tiny[v]) if k == "draft_model" else v for k, v in options.items()}
    engine = mlx_spec.load(str(tiny[family]), tree_width=3, draft_len=3, **options)
    assert engine.batch_problem() is None and engine.status().shape == "tree of width 3"
    engine.tokenizer.eos_token_ids = []  # rows run to their own max_tokens: they leave at different rounds
    copy = "for i in range(10):\n    print(i)\n" * 2
    prompts = [engine.encode(PROMPT), engine.encode(copy), engine.encode(PROMPT * 2), engine.encode(copy + PROMPT)]
    sampled = SamplingParams(temperature=0.8)
    jobs = [Job(prompts[0], max_tokens=48), Job(prompts[1], max_tokens=24), Job(prompts[2], sampled, 40, seed=5),
            Job(prompts[3], max_tokens=30)]
    results = dict(engine.generate_many(jobs, 3))
    for index, job in enumerate(jobs):
        expected = (plain_sampled(tiny[family], job.prompt, job.max_tokens, 0.8, seed=5) if job.params is sampled
                    else plain_greedy(tiny[family], job.prompt, job.max_tokens))
        assert results[index].tokens == expected[:job.max_tokens], index
        if job.params is not sampled and options.get("drafter") != "suffix":  # (the suffix index grows meanwhile)
            alone = engine.generate(job.prompt, max_tokens=job.max_tokens).stats  # the same trees as in the batch:
            drafted = lambda s: (s.drafted, s.nodes, s.accepted)  # noqa: E731  each row's drafter kept its own state
            assert drafted(results[index].stats) == drafted(alone), index
    stats = [result.stats for result in results.values()]
    assert max(s.batch_size for s in stats) == 3 and sum(s.nodes for s in stats) > sum(s.drafted for s in stats)
    assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)


def test_a_batch_weighs_chains_against_trees(tiny):
    """The adaptive batch policy of a draft model drafting trees 3 wide chooses each round's shape, chains or trees
    (costs modelled flat, as a bandwidth-bound GPU's, so that its choices follow acceptance, not the clock): it
    measures with chains, tries trees, and the rows draft the shape it chose (a tree's rows verify more nodes than
    levels, a chain's as many); every row is mlx-lm's plain greedy decoding."""
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), tree_width=3, draft_len=None)
    engine.batch_policy = policy = FlatCostBatchPolicy(engine.max_draft_len, widths=(1, 3))
    engine.tokenizer.eos_token_ids = []
    copy = "for i in range(10):\n    print(i)\n" * 2
    jobs = [Job(engine.encode(text), max_tokens=40) for text in (PROMPT, copy, PROMPT * 2)]
    waiting = list(enumerate(jobs))
    events = list(engine.stream_many(lambda: waiting.pop(0) if waiting else None, 3))
    rounds = [event for _, event in events if isinstance(event, mlx_spec.Round) and event.draft_len]
    assert any(r.nodes > r.draft_len for r in rounds) and any(r.nodes == r.draft_len for r in rounds)
    assert policy.tried == {1, 3}
    for key, event in events:
        if isinstance(event, mlx_spec.Done):
            assert event.tokens == plain_greedy(tiny["qwen3"], jobs[key].prompt, 40), key
