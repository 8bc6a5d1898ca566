"""Prove the suite catches what it claims to: apply small deliberate bugs to the core (verification, sampling,
rollback, drafts, the drafting helpers, n-gram and suffix lookup, ragged batches, block drafters and their
training, constrained output), one at a time, each in a fresh copy of the working tree, and run the tests that should catch it. Every
mutant must make them fail.

    python scripts/mutants.py              # all of them (about 2 minutes on 2 cores)
    python scripts/mutants.py --only 3,7   # some; --list shows them

Exit status 0 when every mutant was caught, 1 when one survived, 2 when one no longer applies to the code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, run with -x


SAMPLED = "tests/test_sampling.py::test_sampled_sequences_follow_the_target"
ACCEPTANCE = "tests/test_acceptance.py"
BLOCK = "tests/test_block.py::test_draft_distributions_equal_the_reference_round_after_round"
MUTANTS = [
    Mutant("a draft is accepted with probability p, whatever q", "mlx_spec/verify.py",
           "passed = uniform * q_draft < p_draft", "passed = uniform < p_draft", (SAMPLED,)),
    Mutant("a rejected position is resampled from p, not from the residual max(p - q, 0)", "mlx_spec/verify.py",
           "residual = mx.maximum(p[:k] - q, 0.0)", "residual = p[:k]", (SAMPLED,)),
    Mutant("greedy: the next token is the last position's choice, not the first rejected one's",
           "mlx_spec/verify.py",
           "return accepted, choice[accepted]", "return accepted, choice[-1]",
           ("tests/test_lossless.py::test_every_acceptance_length_rolls_back_exactly",)),
    Mutant("a tree: a rejected child stays in the residual", "mlx_spec/verify.py",
           "            residual[x] = 0.0\n", "",
           ("tests/test_trees.py::test_tree_verification_samples_the_target_distribution",)),
    Mutant("top-k keeps k + 1 tokens", "mlx_spec/sampling.py",
           "[:, vocab - params.top_k][:, None]", "[:, vocab - params.top_k - 1][:, None]",
           ("tests/test_sampling.py::test_processed_distribution_matches_numpy",)),
    Mutant("penalties do not see the draft just before a position", "mlx_spec/sampling.py",
           "drafts[max(0, j - window):j]", "drafts[max(0, j - window):j - 1]",
           ("tests/test_sampling.py::test_penalties_see_history_and_preceding_drafts",)),
    Mutant("a sliding-window ring buffer rolled back across its wrap does not wrap back", "mlx_spec/caches.py",
           "            index += cache.max_size - cache.keep\n", "            pass\n",
           ("tests/test_caches.py::test_random_forward_and_rollback_match_a_fresh_forward",)),
    Mutant("a tree's kept path is not moved into place in full KV caches", "mlx_spec/caches.py",
           "if kept != list(range(len(kept))):  # a chain's prefix is already in place",
           "if False:", ("tests/test_trees.py",)),
    Mutant("a tree node does not see its ancestors", "mlx_spec/draft.py",
           "sees[i + 1] |= sees[parent + 1]", "sees[i + 1] |= sees[0]", ("tests/test_trees.py",)),
    Mutant("sampled drafts drawn greedily, their q dropped (one at a time)", "mlx_spec/drafters/__init__.py",
           "        if params.greedy:  # deterministic draft", "        if True:  # deterministic draft",
           (ACCEPTANCE,)),
    Mutant("sampled drafts drawn greedily, their q dropped (in a batch)", "mlx_spec/drafters/__init__.py",
           "                if p.greedy:  # deterministic draft", "                if True:  # deterministic draft",
           (ACCEPTANCE,)),
    Mutant("sampled drafts drawn as the argmax of the q they report", "mlx_spec/drafters/__init__.py",
           "tokens.append(sample(dists[-1], step_key))", "tokens.append(mx.argmax(dists[-1], axis=-1))",
           (SAMPLED,)),
    Mutant("n-gram lookup keeps the earliest occurrence of a suffix, not the latest", "mlx_spec/drafters/ngram.py",
           "                    ends.insert(0, end)\n                    del ends[self.width:]\n",
           "                    if len(ends) < self.width:\n                        ends.append(end)\n",
           ("tests/test_batched.py::test_ngram_chains_continue_down_to_the_last_token_and_past_the_end_of_their_copy_"
            "alone_and_in_a_batch",)),
    Mutant("a batch row keeps one rejected position", "mlx_spec/ragged.py",
           "self.valid[row, new[count:]] = False", "self.valid[row, new[count + 1:]] = False",
           ("tests/test_batched.py::test_one_rows_rollback_leaves_the_others_untouched",)),
    Mutant("a batch's sliding window holds one position too many", "mlx_spec/ragged.py",
           "queries[:, :, None] - held[:, None, :] < window", "queries[:, :, None] - held[:, None, :] <= window",
           ("tests/test_batched.py::test_one_rows_rollback_leaves_the_others_untouched",)),
    Mutant("a block drafter's context keys are rotated one position late", "mlx_spec/models/dflash.py",
           "self.kv_heads)), offset=start)", "self.kv_heads)), offset=start + 1)", (BLOCK,)),
    Mutant("DSpark's Markov bias and DFlash2's selector follow the anchor at every position",
           "mlx_spec/drafters/dflash.py",
           "lambda token: position_logits(token, next(row))", "lambda token: position_logits(anchor, next(row))",
           (BLOCK,)),
    Mutant("a block drafter's context misses each round's first verified position", "mlx_spec/drafters/dflash.py",
           "self.pending.append(step.hidden)", "self.pending.append(step.hidden[1:])", (BLOCK,)),
    Mutant("speculators' layer ids read as z-lab's", "mlx_spec/models/dflash.py",
           '"target_layer_ids": aux and [i - 1 for i in aux]', '"target_layer_ids": aux',
           ("tests/test_block.py::test_speculators_layout_drafts_what_the_reference_drafts_from_the_original",)),
    Mutant("a z-lab sliding layer's window stays at the first query", "mlx_spec/models/dflash.py",
           "mask = mask & (mx.abs(query - key) <= self.seen)", "mask = mask",
           ("tests/test_block.py::test_zlab_sliding_layers_attend_as_its_reference_does",)),
    Mutant("an extended prompt's features restart the block drafter's context", "mlx_spec/drafters/dflash.py",
           "if start != self.covered():", "if True:",
           ("tests/test_block.py::test_long_prompts_stream_their_features_and_extended_prompts_keep_them",)),
    Mutant("suffix drafts skip the token after each match", "mlx_spec/drafters/suffix.py",
           "index.sequences[sid][end:end + depth]", "index.sequences[sid][end + 1:end + 1 + depth]",
           ("tests/test_suffix.py::test_matches_and_their_continuations_equal_a_brute_force_scan",)),
    Mutant("training's blocks also see the context at their anchor", "mlx_spec/models/dflash.py",
           "mx.arange(length) < anchors[:, :, None, None]", "mx.arange(length) <= anchors[:, :, None, None]",
           ("tests/test_train_block.py::test_every_block_at_once_is_drafting_at_each_anchor",)),
    Mutant("training's blocks are rotated from position 0", "mlx_spec/models/dflash.py",
           "rotated = rope(blocks, offset=anchors.reshape(-1))", "rotated = rope(blocks)",
           ("tests/test_train_block.py::test_every_block_at_once_is_drafting_at_each_anchor",)),
    Mutant("draft j learns the target's distribution one position late", "mlx_spec/train_block.py",
           "at = (anchors[..., None] + mx.arange(self.k)).reshape(b, -1)",
           "at = (anchors[..., None] + mx.arange(1, self.k + 1)).reshape(b, -1)",
           ("tests/test_train_block.py::test_a_trained_block_drafter_drafts_exactly_and_well",)),
    Mutant("every verified row is masked by the grammar state before the drafts", "mlx_spec/grammar.py",
           "return self.masked_tree(logits, [drafts[:j] for j in range(logits.shape[0])])",
           "return self.masked_tree(logits, [[] for j in range(logits.shape[0])])",
           ("tests/test_grammar.py::test_greedy_constrained_output_equals_plain_constrained_decoding",)),
    Mutant("drafters draft without the grammar", "mlx_spec/engine.py",
           "self.drafter.constrain = self.constrain_drafts if self.grammar else None", "self.drafter.constrain = None",
           ("tests/test_grammar.py::test_drafters_draft_within_the_grammar",)),
]


def working_tree_copy(into: Path) -> Path:
    """The files git tracks or would track (not ignored), as they are now."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def run(mutant: Mutant) -> tuple[str, float]:
    """"caught", "survived" or "stale" (the code no longer holds the line it changes), and the seconds taken."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlx-spec-mutant-") as tmp:
        copy = working_tree_copy(Path(tmp))
        path = copy / mutant.file
        text = path.read_text()
        if text.count(mutant.old) != 1:
            return "stale", time.perf_counter() - start
        path.write_text(text.replace(mutant.old, mutant.new))
        env = {**os.environ, "PYTHONPATH": str(copy)}  # the copy's mlx_spec, here and in the CLI's subprocesses
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider",
                               *mutant.tests],
                              cwd=copy, env=env, capture_output=True, text=True)
        if proc.returncode not in (0, 1):
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"pytest could not run the tests of mutant {mutant.what!r} (exit {proc.returncode})")
    return ("caught" if proc.returncode == 1 else "survived"), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutant numbers (from --list)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    chosen = range(1, len(MUTANTS) + 1)
    if args.only:
        chosen = [int(n) for n in args.only.split(",")]
        if bad := [n for n in chosen if not 1 <= n <= len(MUTANTS)]:
            parser.error(f"--only: no mutant {bad[0]}; there are 1 to {len(MUTANTS)}")
    if args.list:
        for n in chosen:
            print(f"{n:2d}  {MUTANTS[n - 1].file}: {MUTANTS[n - 1].what}")
        return 0
    verdicts = {}
    for n in chosen:
        mutant = MUTANTS[n - 1]
        verdicts[n], seconds = run(mutant)
        print(f"{n:2d}  {verdicts[n]:8s} {seconds:5.0f} s  {mutant.file}: {mutant.what}", flush=True)
    if stale := [n for n, v in verdicts.items() if v == "stale"]:
        print(f"mutants {stale} no longer apply: update their lines in scripts/mutants.py")
        return 2
    survived = [n for n, v in verdicts.items() if v == "survived"]
    print(f"{len(verdicts) - len(survived)} of {len(verdicts)} mutants caught"
          + (f"; survived: {survived}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
