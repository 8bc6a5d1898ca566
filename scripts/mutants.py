"""Prove the suite catches what it claims to: apply small deliberate bugs to the code, one at a time, each in a
fresh copy of the working tree, and run the few tests that should catch it (pytest -x: the first failure ends
the run). Every mutant must make them fail. They cover verification (dense-q and greedy chains, sampled trees),
sampling and penalties, rollback (sliding windows, trees, quantized KV, Gated DeltaNet states), the draft model's
cache alone and in a batch, the drafting helpers, n-gram, suffix and lookahead drafting, MTP and nextn layers,
Medusa, EAGLE-3 and Gemma 4 drafters, block drafters (alone, in a batch) and their training, ragged batches
(per-row keys, rows joining), the prompt cache (drafter state taken back), the draft-length policy's off state
and its stops where a draft model is unsure, images' positions, Gemma 4's whole images and Qwen3-VL's deepstack,
request parsing, convert, constrained output and its forced drafts, predicted outputs, distributed batches and
the Responses API.

    python scripts/mutants.py              # all of them, two at a time (--jobs)
    python scripts/mutants.py --only 3,7   # some; --list shows them; --verbose how their tests ended

Every mutant's line is looked for in the code, and its tests collected, before any runs. Exit status 0 when every
mutant was caught, 1 when one survived, 2 when one no longer applies (its line or a test is gone, or its tests could
not run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    what: str
    file: str
    old: str  # must occur exactly once in `file`
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, run with -x: the likeliest to fail first
    slow: bool = False  # its tests take minutes: started first, so that the last ones running end together


VERIFY = "tests/test_verify.py::test_stochastic_draft_output_follows_p"
SAMPLED = "tests/test_sampling.py::test_sampled_sequences_follow_the_target"
SAMPLED_BATCH = "tests/test_sampling.py::test_every_row_of_a_sampled_batch_draws_what_plain_sampling_draws"
ACCEPTANCE = "tests/test_acceptance.py"
BLOCK = "tests/test_block.py::test_draft_distributions_equal_the_reference_round_after_round"
NGRAM_CHAINS = ("tests/test_batched.py::test_ngram_chains_continue_down_to_the_last_token_and_past_the_end_of_their_"
                "copy_alone_and_in_a_batch")
MUTANTS = [
    Mutant("a dense-q draft is accepted with probability p, whatever q", "mlx_spec/core/verify.py",
           "(uniform * q_draft < p_draft)", "(uniform < p_draft)", (VERIFY,)),
    Mutant("a rejected position is resampled from p, not from the residual max(p - q, 0)", "mlx_spec/core/verify.py",
           "residual = mx.maximum(p[:k] - q, 0.0)", "residual = p[:k]", (VERIFY,)),
    Mutant("greedy: the next token is the last position's choice, not the first rejected one's",
           "mlx_spec/core/verify.py",
           "return accepted, choice[accepted]", "return accepted, choice[-1]",
           ("tests/test_lossless.py::test_every_acceptance_length_rolls_back_exactly",)),
    Mutant("a sampled tree: every node's draw takes the root position's key, not its depth's", "mlx_spec/core/verify.py",
           "keys[mx.array([0, *draft.depths()])]", "keys[mx.array([0] * (len(tokens) + 1))]",
           ("tests/test_trees.py::test_tree_verification_samples_the_target_distribution",)),
    Mutant("top-k keeps k + 1 tokens", "mlx_spec/core/sampling.py",
           "[:, vocab - params.top_k][:, None]", "[:, vocab - params.top_k - 1][:, None]",
           ("tests/test_sampling.py::test_processed_distribution_matches_numpy",)),
    Mutant("penalties do not see the draft just before a position", "mlx_spec/core/sampling.py",
           "drafts[max(0, j - window):j]", "drafts[max(0, j - window):j - 1]",
           ("tests/test_sampling.py::test_penalties_see_history_and_preceding_drafts",)),
    Mutant("a sliding-window ring buffer rolled back across its wrap does not wrap back", "mlx_spec/seams/caches.py",
           "            index += cache.max_size - cache.keep\n", "            pass\n",
           ("tests/test_caches.py::test_random_forward_and_rollback_match_a_fresh_forward",)),
    Mutant("a tree's kept path is not moved into place in full KV caches", "mlx_spec/seams/caches.py",
           "if kept != list(range(len(kept))):  # a chain's prefix is already in place",
           "if False:", ("tests/test_trees.py",)),
    Mutant("a tree's kept path moves a quantized cache's data but not its scales and biases", "mlx_spec/seams/caches.py",
           "for buffer in buffers if isinstance(buffers, tuple) else (buffers,):",
           "for buffer in buffers[:1] if isinstance(buffers, tuple) else (buffers,):",
           ("tests/test_trees.py::test_tree_forward_and_compaction_match_a_fresh_forward[8]",)),
    Mutant("a Gated DeltaNet layer rolled back keeps a conv window one position early", "mlx_spec/seams/caches.py",
           "(conv_input[:, j + 1:j + 1 + width, :], state)", "(conv_input[:, j:j + width, :], state)",
           ("tests/test_caches.py::test_random_forward_and_rollback_match_a_fresh_forward[qwen3_5-None]",)),
    Mutant("a replaying recurrent layer rolled back keeps the state after its whole forward",
           "mlx_spec/seams/caches.py", "functools.partial(replay, m) for m in range(1, n)",
           "functools.partial(replay, n) for m in range(1, n)",
           ("tests/test_caches.py::test_random_forward_and_rollback_match_a_fresh_forward[nemotron_h-None]",)),
    Mutant("a replaying recurrent layer replays from its state after the forward, not before",
           "mlx_spec/models/recurrence.py", "held.cache = list(before)", "held.cache = list(cache.cache)",
           ("tests/test_caches.py::test_random_forward_and_rollback_match_a_fresh_forward[nemotron_h-None]",)),
    Mutant("Ling 3.0's MTP block is converted as its target's layer 0 (whose experts mlx-lm does not stack)",
           "mlx_spec/models/nextn.py", 'block_config=lambda config: {**config, "first_k_dense_replace": 0}),',
           "block_config=lambda config: config),",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[bailing_moe_v3]",)),
    Mutant("Nemotron-H's MTP attention sublayer drafts without its cache (seeing the new positions only)",
           "mlx_spec/models/nextn.py", 'cache=cache if layer.block_type == "*" else None)', "cache=None)",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[nemotron_h]",)),
    Mutant("a constrained job that crosses to other ranks leaves its grammar behind", "mlx_spec/decode/rounds.py",
           "return replace(self, grammar=Grammar(tokenizer, *self.grammar)) if self.grammar else self",
           "return replace(self, grammar=None)",
           ("tests/test_distributed.py::test_constrained_output_on_two_ranks_is_plain_constrained_decoding",
            "tests/test_distributed.py::test_tensor_parallel_qwen3_with_a_draft_model_serves_clients_in_a_batch")),
    Mutant("a job's images do not cross to other ranks", "mlx_spec/decode/rounds.py",
           "return replace(self, grammar=self.grammar.source) if self.grammar else self",
           "return replace(self, grammar=self.grammar.source if self.grammar else None, images=None)",
           ("tests/test_distributed.py::test_images_on_two_ranks_are_mlx_vlms_plain_greedy",)),
    Mutant("a checkpoint claiming MTP layers under a key not read is told to hold none whatever it holds",
           "mlx_spec/runners/checkpoint.py",
           'held = any(part.startswith("mtp") for name in tensor_names(path) for part in name.split("."))',
           "held = False",
           ("tests/test_nextn.py::test_an_mtp_layer_claimed_under_a_key_not_read_is_told",)),
    Mutant("Kimi K3's MTP layer reads the target's state after its final norm (vLLM hands it the state before)",
           "mlx_spec/models/nextn.py", 'layers.{n}.", reads="pre", arguments=', 'layers.{n}.", arguments=',
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[kimi_k3]",)),
    Mutant("a draft model's cache keeps one rejected draft after a round", "mlx_spec/drafters/draft_model.py",
           "valid = min(self.runner.offset, self.proposed_from + accepted)",
           "valid = min(self.runner.offset, self.proposed_from + accepted + 1)",
           ("tests/test_caches.py::test_draft_model_cache_holds_exactly_the_accepted_context",)),
    Mutant("a batch's draft model keeps one rejected draft of each row after a round",
           "mlx_spec/drafters/draft_model.py",
           "kept = [fed + min(count, k, longest - 1)", "kept = [fed + min(count + 1, k, longest - 1)",
           ("tests/test_batched.py::test_every_row_equals_decoding_it_alone[qwen3-draft-model-qwen3-draft-2]",)),
    Mutant("a tree node does not see its ancestors", "mlx_spec/core/draft.py",
           "sees[i + 1] |= sees[parent + 1]", "sees[i + 1] |= sees[0]", ("tests/test_trees.py",)),
    Mutant("sampled drafts drawn greedily, their q dropped (one at a time)", "mlx_spec/drafters/protocol.py",
           "        if params.greedy:  # deterministic draft", "        if True:  # deterministic draft",
           (ACCEPTANCE,)),
    Mutant("sampled drafts drawn greedily, their q dropped (in a batch)", "mlx_spec/drafters/protocol.py",
           "                if p.greedy:  # deterministic draft", "                if True:  # deterministic draft",
           (ACCEPTANCE,)),
    Mutant("sampled drafts drawn as the argmax of the q they report", "mlx_spec/drafters/protocol.py",
           "tokens.append(sample(dists[-1], step_key))", "tokens.append(mx.argmax(dists[-1], axis=-1))",
           (SAMPLED,), slow=True),
    Mutant("n-gram lookup keeps the earliest occurrence of a suffix, not the latest", "mlx_spec/drafters/ngram.py",
           "                    ends.insert(0, end)\n                    del ends[self.width:]\n",
           "                    if len(ends) < self.width:\n                        ends.append(end)\n",
           (NGRAM_CHAINS,)),
    Mutant("lookahead pools what the target predicts one node before each column's end",
           "mlx_spec/drafters/lookahead.py",
           "rows = mx.array([end + 1 for end in self.ends])", "rows = mx.array([end for end in self.ends])",
           ("tests/test_lookahead.py::test_the_pool_learns_a_repeating_text_from_its_trajectories",)),
    Mutant("an MTP layer's rows pair each verified hidden state with the token before the one that follows it",
           "mlx_spec/drafters/qwen_mtp.py",
           "self.pending.append((context[-(accepted + 1):], step.hidden))",
           "self.pending.append((context[-(accepted + 2):-1], step.hidden))",
           ("tests/test_qwen_mtp.py::test_mtp_cache_is_rebuilt_from_verified_hidden_states",)),
    Mutant("Medusa heads draft from the round's first verified hidden state, not its last",
           "mlx_spec/drafters/medusa.py",
           "    def accept(self, context: list[int], accepted: int, step: Step) -> None:\n"
           "        self.hidden = step.hidden[-1:]",
           "    def accept(self, context: list[int], accepted: int, step: Step) -> None:\n"
           "        self.hidden = step.hidden[:1]",
           ("tests/test_medusa.py::test_medusa_drafts_exactly[1]",)),
    Mutant("an EAGLE-3 head's reduced vocabulary is read as the target's first ids (d2t ignored)",
           "mlx_spec/models/common.py",
           "index[mx.arange(draft_vocab) + d2t.astype(mx.int32)]", "index[mx.arange(draft_vocab)]",
           ("tests/test_eagle3.py::test_head_matches_a_numpy_transcription",)),
    Mutant("a Gemma 4 assistant queries one position past the round's first input",
           "mlx_spec/drafters/gemma4_assistant.py",
           "self.shared_kv(), len(context) - 1, self.last_hidden[None]",
           "self.shared_kv(), len(context), self.last_hidden[None]",
           ("tests/test_gemma4.py::test_drafts_follow_the_reference_equations[gemma4-assistant]",)),
    Mutant("a batch row's draws take the first row's seed", "mlx_spec/decode/rounds.py",
           "position_keys(row.seed, len(row.context) + emitting,",
           "position_keys(rows[0].seed, len(row.context) + emitting,", (SAMPLED_BATCH,)),
    Mutant("a batch's round planned ahead keys its draws one position early", "mlx_spec/decode/rounds.py",
           "position_keys(row.seed, len(row.context) + emitting,", "position_keys(row.seed, len(row.context),",
           (SAMPLED_BATCH,)),
    Mutant("a prompt joining a batch swaps Gated DeltaNet states with the rows already there", "mlx_spec/runners/ragged.py",
           "_stack_rows(a, self.size, b, other.size)", "_stack_rows(b, other.size, a, self.size)",
           ("tests/test_batched.py::test_a_queued_prompt_joins_as_soon_as_a_row_leaves_with_drafting_off[qwen3_5]",)),
    Mutant("a batch row keeps one rejected position", "mlx_spec/runners/ragged.py",
           "self.valid[row, new[count:]] = False", "self.valid[row, new[count + 1:]] = False",
           ("tests/test_batched.py::test_one_rows_rollback_leaves_the_others_untouched",)),
    Mutant("a batch's sliding window holds one position too many", "mlx_spec/runners/ragged.py",
           "queries[:, :, None] - positions[:, None, :] < window", "queries[:, :, None] - positions[:, None, :] <= window",
           ("tests/test_batched.py::test_one_rows_rollback_leaves_the_others_untouched",)),
    Mutant("an emptied batch's sliding-window layers keep their first column", "mlx_spec/runners/ragged.py",
           "            self.columns, self.starts = 0, {}", "            self.columns = 0",
           ("tests/test_batched.py::test_one_rows_rollback_leaves_the_others_untouched[gemma3-False]",)),
    Mutant("a batch's sliding-window layers keep every column", "mlx_spec/runners/ragged.py",
           "            if self.columns - first <= 2 * keep or not self.size:", "            if True:",
           ("tests/test_prompt_cache.py::test_rows_far_past_the_sliding_window_hold_only_the_window",)),
    Mutant("a batch's sliding-window layers leave a row's oldest visible positions behind", "mlx_spec/runners/ragged.py",
           "first, keep = self.starts.get(window, 0), window + 1", "first, keep = self.starts.get(window, 0), window - 2",
           ("tests/test_batched.py::test_one_rows_rollback_leaves_the_others_untouched[gemma3-False]",)),
    Mutant("a sliding cache restored from a batch row's window holds fewer slots than its offset needs",
           "mlx_spec/seams/caches.py", "min(n, cache.max_size) - part.shape[2])", "0)",
           ("tests/test_prompt_cache.py::test_rows_far_past_the_sliding_window_hold_only_the_window",)),
    Mutant("a restored sequence's drafter starts afresh, its stored state not taken back", "mlx_spec/runners/prompt_cache.py",
           "drafter.resume(best.held if best.drafter is drafter and n == len(best.tokens) else None)",
           "drafter.resume(None)",
           ("tests/test_prompt_cache.py::test_alternating_conversations_reuse_their_turns_exactly[eagle3]",
            "tests/test_prompt_cache.py::test_alternating_conversations_reuse_their_turns_exactly[dflash]")),
    Mutant("drafting once off never probes again", "mlx_spec/policy/sequence.py",
           "if k == 0 and (self.uncosted or (probe_due(", "if k == 0 and (self.uncosted and (probe_due(",
           ("tests/test_policy.py::test_turns_off_for_useless_drafts_and_back_on_for_good_ones",)),
    Mutant("a request's max_tokens is ignored (the server's default instead)", "mlx_spec/serve/request_fields.py",
           'whole(body, "max_completion_tokens", 1, whole(body, "max_tokens", 1, server.max_tokens))',
           'whole(body, "max_completion_tokens", 1, server.max_tokens)',
           ("tests/test_server.py::test_chat_and_completions_through_the_openai_client",)),
    Mutant("the server drops a request's sampling fields (temperature, top-p/k, min-p, penalties)",
           "mlx_spec/serve/request_fields.py", "params = replace(server.defaults, **sampling)", "params = server.defaults",
           ("tests/test_server_sampling.py::test_every_sampling_field_alone_and_as_a_batch_row_is_the_target_alone",)),
    Mutant("a batch row's penalties do not see its own history", "mlx_spec/decode/rounds.py",
           "row.job.params, row.context,\n                                 keys[",
           "row.job.params, [],\n                                 keys[",
           ("tests/test_sampling_fields.py::test_each_rows_sampling_and_penalties_are_its_own",)),
    Mutant("a converted MTP layer's norms are shifted again when it loads", "mlx_spec/commands/convert.py",
           'mx.save_safetensors(str(partial), weights, metadata={"format": "mlx"})',
           "mx.save_safetensors(str(partial), weights)",
           ("tests/test_convert.py::test_float_round_trip_keeps_mtp_and_loads_everywhere[qwen3_5]",)),
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
    Mutant("draft j learns the target's distribution one position late", "mlx_spec/train/block.py",
           "at = (anchors[..., None] + mx.arange(self.k)).reshape(b, -1)",
           "at = (anchors[..., None] + mx.arange(1, self.k + 1)).reshape(b, -1)",
           ("tests/test_train_block.py::test_a_trained_block_drafter_drafts_exactly_and_well",), slow=True),
    Mutant("every verified row is masked by the grammar state before the drafts", "mlx_spec/core/grammar.py",
           "return self.masked_tree(logits, [drafts[:j] for j in range(logits.shape[0])])",
           "return self.masked_tree(logits, [[] for j in range(logits.shape[0])])",
           ("tests/test_grammar.py::test_greedy_constrained_output_equals_plain_constrained_decoding",)),
    Mutant("drafters draft without the grammar", "mlx_spec/drafters/protocol.py",
           "self.drafter.constrain = grammar_mask(grammars[0])", "self.drafter.constrain = None",
           ("tests/test_grammar.py::test_drafters_draft_within_the_grammar",)),
    Mutant("a batch row's log-probabilities are read one verified row late", "mlx_spec/decode/rounds.py",
           "else mx.arange(keep)]", "else mx.arange(keep)[::-1]]",
           ("tests/test_logprobs.py::test_logprobs_of_batch_rows_equal_plain_decoding",)),
    Mutant("a batch row keeps its tree's first inputs, not its accepted path", "mlx_spec/decode/rounds.py",
           "kept.append([0, *(node + 1 for node in path)])", "kept.append(len(path) + 1)",
           ("tests/test_trees.py::test_token_trees_in_a_batch_equal_plain_decoding",)),
    Mutant("a batch row's tree nodes are placed at consecutive positions", "mlx_spec/runners/ragged.py",
           "mx.array(self.offsets[:, None] + self.depths, dtype=mx.int32)",
           "mx.array(self.offsets[:, None] + np.arange(n), dtype=mx.int32)",
           ("tests/test_trees.py::test_token_trees_in_a_batch_equal_plain_decoding",)),
    Mutant("a tree row's head reads the states of its first inputs, not of its accepted path",
           "mlx_spec/decode/rounds.py", "if hidden is not None and trees:",
           "if hidden is not None and trees and False:",
           ("tests/test_medusa.py::test_medusa_drafts_exactly[3]",)),
    Mutant("a lookahead row of a batch learns from the first row's tree", "mlx_spec/drafters/protocol.py",
           "tree_logits=tree_logits and tree_logits[row]", "tree_logits=tree_logits and tree_logits[0]",
           ("tests/test_lookahead.py::test_lookahead_rows_of_a_batch_are_the_target_greedy_output[qwen3]",)),
    Mutant("a pin sent while a served request runs does not reach its row", "mlx_spec/serve/generator.py",
           "                job.row.draft_len = draft_len", "                pass",
           ("tests/test_tui.py::test_the_chat_on_a_server",), slow=True),
    Mutant("a tree row of a batch is masked by its grammar as if it were a chain", "mlx_spec/decode/rounds.py",
           "    return row.job.grammar.masked_tree(logits, draft.prefixes())",
           "    return row.job.grammar.masked(logits, draft.tokens.tolist())",
           ("tests/test_grammar.py::test_constrained_rows_of_a_batch_equal_plain_constrained_decoding[draft-model tree]",)),
    Mutant("a batch's block queries see the padding of longer rows' blocks", "mlx_spec/models/dflash.py",
           "mx.arange(n)[None] < lengths[:, None]], axis=1)", "mx.arange(n)[None] < lengths[:, None] + n], axis=1)",
           ("tests/test_block_rows.py::test_every_rows_block_drafts_in_one_forward_what_the_reference_drafts_for_it",)),
    Mutant("a batch's block rows see the holes of their context", "mlx_spec/drafters/dflash.py",
           "positions = np.array([[start + j if j < count else -1 for j in range(longest)]",
           "positions = np.array([[start + j for j in range(longest)]",
           ("tests/test_block_rows.py::test_every_rows_block_drafts_in_one_forward_what_the_reference_drafts_for_it",)),
    Mutant("a prediction the output departed from is never found again", "mlx_spec/core/prediction.py",
           "            self.at = self._find(context[self.start:])", "            self.at = None",
           ("tests/test_prediction.py::test_greedy_output_with_a_prediction_is_plain_decoding",)),
    Mutant("a pin shared with a batch's other ranks is dropped", "mlx_spec/seams/distributed.py",
           "jobs[key][1].draft_len = value // 2 - 1 if value // 2 else None",
           "jobs[key][1].draft_len = None",
           ("tests/test_distributed.py::test_a_batchs_pins_stops_and_joins_reach_every_rank",)),
    Mutant("each rank cuts its own cache back where it can, whatever the other ranks' can",
           "mlx_spec/seams/distributed.py", "engine.target.ranks_trim = bool(self._sum(mine)[0] == self.size)",
           "self._sum(mine)",
           ("tests/test_distributed.py::test_conversations_on_two_ranks_reuse_the_prompt_cache_exactly",), slow=True),
    Mutant("each rank's prompt cache counts its own bytes", "mlx_spec/seams/distributed.py",
           "            cache.agree = self.largest", "            pass",
           ("tests/test_distributed.py::test_conversations_on_two_ranks_reuse_the_prompt_cache_exactly",), slow=True),
    Mutant("a chain that carries forced drafts is verified with the keys of its planned length only",
           "mlx_spec/decode/rounds.py", "        if any(forced):  # the keys", "        if False:  # the keys",
           ("tests/test_forced_drafts.py::test_sampled_output_with_forced_drafts_is_plain_constrained_sampling",)),
    Mutant("the grammar stays at the chain's end after its forced text is read", "mlx_spec/core/grammar.py",
           "        if taken:\n            self.matcher.rollback(taken)\n        return self.tokenizer",
           "        return self.tokenizer",
           ("tests/test_forced_drafts.py::test_the_forced_text_is_the_schemas_keys_and_punctuation",)),
    Mutant("a batched draft model keeps steps it fed for tokens it never drafted", "mlx_spec/drafters/draft_model.py",
           "kept = [fed + min(count, k, longest - 1) for fed, count, k in", "kept = [fed + min(count, longest - 1) for fed, count, k in",
           ("tests/test_forced_drafts.py::test_a_batched_draft_model_keeps_only_its_own_fed_drafts",)),
    Mutant("previous_response_id does not put the stored conversation first", "mlx_spec/serve/responses.py",
           "        history = list(stored.get(previous, \"previous_response_id\")[1])",
           "        stored.get(previous, \"previous_response_id\")",
           ("tests/test_responses.py::test_a_codex_like_exchange_of_calls_and_outputs",)),
    Mutant("MiMo's MTP layer reads [embedding, hidden] as the other families do", "mlx_spec/models/nextn.py",
           "copies=(), hidden_first=True, feeds_normed=True", "copies=(), hidden_first=False, feeds_normed=True",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[mimo]",)),
    Mutant("MiMo's MTP layer reads the target's post-norm state", "mlx_spec/models/nextn.py",
           "feeds_normed=True, reads=\"pre\")", "feeds_normed=True, reads=\"post\")",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[mimo]",)),
    Mutant("K-EXAONE's MTP layer feeds back its block's output, not its output norm's", "mlx_spec/models/nextn.py",
           "block_prefix=\"layers.0.\", copies=(), feeds_normed=True)", "block_prefix=\"layers.0.\", copies=())",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[exaone_moe]",)),
    Mutant("the policy never stops a draft model's chain where it is unsure", "mlx_spec/policy/sequence.py",
           "        go_on = one_more_pays(confidences, 0, chain.cost(j), chain.cost(j + 1))",
           "        go_on = True",
           ("tests/test_policy_kinds.py::test_the_default_never_loses_to_plain_decoding_on_any_kind_of_work",)),
    Mutant("a lone drafter drafts on after the policy said stop", "mlx_spec/drafters/protocol.py",
           "            if not go_on([confidence]):\n                break", "            go_on([confidence])",
           ("tests/test_draft_stops.py::test_a_draft_model_stops_its_chain_where_it_is_unsure",)),
    Mutant("a batch's draft model drafts its rows on after the policy said stop", "mlx_spec/drafters/protocol.py",
           "lengths = [j + 1 if row in chances else k for row, k in enumerate(lengths)]",
           "lengths = [k for row, k in enumerate(lengths)]",
           ("tests/test_draft_stops.py::test_a_draft_model_stops_its_chain_where_it_is_unsure",)),
    Mutant("a stopped chain's probabilities are read at the wrong draft", "mlx_spec/drafters/protocol.py",
           "            confidence.append(chances[0, tokens[-1][0]].item())",
           "            confidence.append(chances[0, tokens[0][0]].item())",
           ("tests/test_draft_stops.py::test_a_draft_model_stops_its_chain_where_it_is_unsure",)),
    Mutant("one more draft is weighed against the round's cost with it, not as it stands", "mlx_spec/policy/interface.py",
           "    return chances * now >= expected * (more - now)", "    return chances * more >= expected * (more - now)",
           ("tests/test_draft_stops.py::test_a_chain_goes_on_while_one_more_sure_draft_beats_the_rounds_rate",)),
    Mutant("a batch's stops forget the rows that draft no more", "mlx_spec/policy/batch.py",
           "one_more_pays(confidences, self.rows - len(confidences), now, more)",
           "one_more_pays(confidences, 0, now, more)",
           ("tests/test_draft_stops.py::test_a_batchs_chains_go_on_while_one_more_sure_draft_each_beats_the_rounds_rate",)),
    Mutant("a batch's chains stop while a pinned row still drafts", "mlx_spec/decode/rounds.py",
           "    return lambda confidences: any(c is not None and not mine for c, mine in zip(confidences, chosen)) or \\",
           "    return lambda confidences: False or \\",
           ("tests/test_draft_stops.py::test_a_batchs_chains_stop_together_where_their_draft_model_is_unsure",)),
    Mutant("ERNIE's MTP layer feeds back its output norm's state, not its block's", "mlx_spec/models/nextn.py",
           "(\"mtp_emb_norm.0\", \"mtp_hidden_norm.0\", \"mtp_linear_proj.0\", \"norm\"), \"model.\", block_prefix=\"mtp_block.0.\",\n        copies=()),",
           "(\"mtp_emb_norm.0\", \"mtp_hidden_norm.0\", \"mtp_linear_proj.0\", \"norm\"), \"model.\", block_prefix=\"mtp_block.0.\",\n        copies=(), feeds_normed=True),",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[ernie4_5_moe]",)),
    Mutant("a nextn layer's tensors are every tensor under its prefix", "mlx_spec/models/nextn.py",
           "    return name if name.startswith((family.block_prefix, *(f\"{theirs}.\" for theirs in own))) else None",
           "    return name",
           ("tests/test_nextn.py::test_add_mtp_fetches_only_the_shards_that_hold_the_layer",)),
    Mutant("a sliding-window nextn block attends to everything before it", "mlx_spec/models/nextn.py",
           "        mask = create_attention_mask(x, attention, window_size=self.window, return_array=True)",
           "        mask = create_attention_mask(x, attention, return_array=True)",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[mimo_v2_flash]",)),
    Mutant("Step 3.5's zero-centred norms are read as plain ones", "mlx_spec/models/nextn.py",
           "            weights = {k: v + 1 if k.endswith(\"norm.weight\") else v for k, v in weights.items()}",
           "            weights = {k: v for k, v in weights.items()}",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[step3p5]",)),
    Mutant("LongCat's layer embeds the drafted token with the target's embedding", "mlx_spec/drafters/qwen_mtp.py",
           "    embed = nextn.embed if nextn.family.embedding else layout.input_embedding(target.model)",
           "    embed = layout.input_embedding(target.model)",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[longcat_flash]",)),
    Mutant("LongCat's MTP block skips its dense MLP", "mlx_spec/models/nextn.py",
           "        return h + self.mlp(self.post_attention_layernorm(h))", "        return h",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[longcat_flash]",)),
    Mutant("Step 3.5's layer scores with the target's head, not its own", "mlx_spec/drafters/qwen_mtp.py",
           "    head = nextn.head if nextn.family.head else layout.output_head(target.model)",
           "    head = layout.output_head(target.model)",
           ("tests/test_nextn.py::test_the_nextn_layer_is_its_equations[step3p5]",)),
    Mutant("a rollback leaves a sparse attention's indexer keys", "mlx_spec/seams/caches.py",
           "lower the draft length\")\n    for cache in layers_of(caches):",
           "lower the draft length\")\n    for cache in [c.caches[0] if isinstance(c, CacheList) else c for c in caches]:",
           ("tests/test_nextn.py::test_nextn_drafting_is_exact[deepseek_v32]",)),
    Mutant("a sparse attention's nextn block masks as if its cache were the attention's", "mlx_spec/models/nextn.py",
           "        attention = cache[0][0] if self.family.indexed else cache[0]",
           "        attention = cache[0]",
           ("tests/test_nextn.py::test_nextn_drafting_is_exact[deepseek_v32]",)),
    Mutant("an image prompt is prefilled at its own positions, not shifted by what its images saved",
           "mlx_spec/runners/vision.py", "return mx.array(self.positions[:, start:end] + self.saved)",
           "return mx.array(self.positions[:, start:end])",
           ("tests/test_vision.py::test_greedy_output_over_images_is_mlx_vlms_plain_greedy[off]",)),
    Mutant("M-RoPE turns every frequency by the temporal axis", "mlx_spec/seams/compat.py",
           "out = mx.where(axis_of == axis, turned[axis], out)", "out = turned[0]",
           ("tests/test_vision.py::test_an_image_prompt_scores_as_mlx_vlms_model_does",)),
    Mutant("a batch row's image prompt is prefilled as text", "mlx_spec/decode/batched.py",
           "row.prefill.extend(row.job.prompt[:-1], row.read_hidden, self.hidden_tail, row.job.images,",
           "row.prefill.extend(row.job.prompt[:-1], row.read_hidden, self.hidden_tail, None,",
           ("tests/test_vision.py::test_image_rows_in_a_batch_decode_as_each_does_alone",)),
    Mutant("a cache holding one image serves a prompt showing another", "mlx_spec/runners/vision.py",
           "    keys = images.keyed(tokens)", "    keys = list(tokens)",
           ("tests/test_vision.py::test_a_returning_turn_with_the_same_image_reuses_its_prefix",)),
    Mutant("a cache in one M-RoPE frame serves a prompt in another", "mlx_spec/runners/vision.py",
           "        keys[0] = -(1 + images.saved) * 2 ** 80 + keys[0]", "        pass",
           ("tests/test_vision_qwen_vl.py::test_image_conversations_through_the_prompt_cache",)),
    Mutant("Gemma 4 reads an image's tokens causally", "mlx_spec/runners/vision.py",
           "        if not self.whole:\n            return None", "        if True:\n            return None",
           ("tests/test_vision_gemma4.py::test_a_gemma4_image_prompt_scores_as_mlx_vlms_model_does",)),
    Mutant("a prefill piece ends inside an image read whole", "mlx_spec/runners/vision.py",
           "        if (not self.whole or end >= len(self.prompt)", "        if (True or end >= len(self.prompt)",
           ("tests/test_vision_gemma4.py::test_a_gemma4_image_prompt_scores_as_mlx_vlms_model_does",
            "tests/test_vision_gemma4.py::test_gemma4_image_rows_in_a_batch_decode_as_each_does_alone")),
    Mutant("an image's tokens see one another only within the sliding window", "mlx_spec/seams/caches.py",
           "new if self.beyond is None else new | self.beyond", "new",
           ("tests/test_vision_gemma4.py::test_a_gemma4_image_prompt_scores_as_mlx_vlms_model_does",)),
    Mutant("a batch row's image tokens see one another only within the sliding window", "mlx_spec/runners/ragged.py",
           "                recent[:, :, held:] |= self.seen", "                pass",
           ("tests/test_vision_gemma4.py::test_gemma4_image_rows_in_a_batch_decode_as_each_does_alone",)),
    Mutant("Gemma 4's image features are scaled again by its embedding scale", "mlx_spec/runners/vision.py",
           "            features = features / scale", "            features = features",
           ("tests/test_vision_gemma4.py::test_a_gemma4_image_prompt_scores_as_mlx_vlms_model_does",)),
    Mutant("Gemma 4's per-layer embeddings read the image token", "mlx_spec/runners/vision.py",
           "mx.where(piece == self.token, self.layer_token, piece)", "piece",
           ("tests/test_vision_gemma4.py::test_a_gemma4_image_prompt_scores_as_mlx_vlms_model_does",)),
    Mutant("a prefill piece that starts before the hidden-state tail gives none of its states",
           "mlx_spec/runners/target.py", "states += [step.hidden[max(tail - start, 0):]] if read and end > tail else []",
           "states += [step.hidden] if read and start >= tail else []",
           ("tests/test_vision_gemma4.py::test_hidden_states_from_inside_an_image_read_whole",)),
    Mutant("a batch's policy counts a tree's forward as a chain's", "mlx_spec/policy/batch.py",
           "return rows * (1 + round(self.nodes.get((k, width), k * width)))", "return rows * (1 + k)",
           ("tests/test_policy.py::test_a_batch_drafts_trees_where_forwards_are_bandwidth_bound_and_chains_where_not",)),
    Mutant("a batch's rows draft the loaded tree width whatever its policy chose", "mlx_spec/decode/rounds.py",
           "self.drafters.set_width(self.tree_width if pinned else policy.width)",
           "self.drafters.set_width(self.tree_width)",
           ("tests/test_trees.py::test_a_batch_weighs_chains_against_trees",)),
    Mutant("a batch's lone row is masked as one sequence without its sliding windows", "mlx_spec/runners/ragged_kv.py",
           "    return create_attention_mask(n, held, return_array, window)",
           "    return create_attention_mask(n, held, return_array, None)",
           ("tests/test_batched.py::test_every_row_equals_decoding_it_alone[gemma3-ngram-None-2]",)),
    Mutant("a batch row's drafter joins without the prompt features its absorber took", "mlx_spec/decode/batched.py",
           "row.absorber.hold() if row.absorber else row.drafter_held", "row.drafter_held",
           ("tests/test_block.py::test_a_batch_row_streams_a_long_prompts_features_and_drafts_as_alone",)),
    Mutant("a batch row's prefill piece that starts before the hidden-state tail gives all its states",
           "mlx_spec/runners/ragged.py", "self.hidden += [read_hidden()[0][max(tail - done, 0):]]",
           "self.hidden += [read_hidden()[0]]",
           ("tests/test_vision_gemma4.py::test_hidden_states_from_inside_an_image_read_whole",)),
    Mutant("Qwen3-VL's first layers add no deepstack features", "mlx_spec/runners/vision.py",
           "            if self.deep:", "            if False:",
           ("tests/test_vision_qwen_vl.py::test_a_qwen_vl_image_prompt_scores_as_mlx_vlms_model_does[qwen3_vl]",)),
    Mutant("Qwen2.5-VL's M-RoPE sections are read interleaved", "mlx_spec/runners/vision.py",
           '    if not rope.get("mrope_interleaved"):', "    if False:",
           ("tests/test_vision_qwen_vl.py::test_a_qwen_vl_image_prompt_scores_as_mlx_vlms_model_does[qwen2_5_vl]",)),
]


def applies(mutant: Mutant) -> bool:
    """Whether the code holds the mutant's line exactly once (else it is stale: the code was rewritten)."""
    path = ROOT / mutant.file
    return path.is_file() and path.read_text().count(mutant.old) == 1


def missing_tests(mutants: list[Mutant]) -> list[str]:
    """The mutants' test ids that pytest does not find (a test renamed or re-parametrized), one collection for all."""
    ids = sorted({test for mutant in mutants for test in mutant.tests})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", *ids], cwd=ROOT, capture_output=True, text=True)
    return [test for test in ids if proc.returncode and f"not found: {ROOT / test}" in proc.stdout + proc.stderr]


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


def run(mutant: Mutant) -> tuple[str, float, float, str]:
    """Apply `mutant` to a fresh copy of the working tree and run its tests there: ("caught", "survived" or
    "broken" (pytest could not run them), the seconds taken, the CPU seconds pytest used, pytest's output)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlx-spec-mutant-") as tmp:
        copy = working_tree_copy(Path(tmp) / "tree")
        path = copy / mutant.file
        path.write_text(path.read_text().replace(mutant.old, mutant.new))
        env = {**os.environ, "PYTHONPATH": str(copy)}  # the copy's mlx_spec, here and in the CLI's subprocesses
        with open(Path(tmp) / "output", "w+") as output:
            proc = subprocess.Popen([sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider",
                                     "-p", "no:randomly", *mutant.tests],
                                    cwd=copy, env=env, stdout=output, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)  # pytest's own CPU time, its subprocesses' included
            proc.returncode = os.waitstatus_to_exitcode(status)
            output.seek(0)
            text = output.read()
    verdict = {0: "survived", 1: "caught"}.get(proc.returncode, "broken")
    return verdict, time.perf_counter() - start, usage.ru_utime + usage.ru_stime, text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutant numbers (from --list)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--verbose", action="store_true", help="show how each mutant's tests ended")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="mutants run at the same time (default: 2, or 1 on one core)")
    args = parser.parse_args()
    chosen = list(range(1, len(MUTANTS) + 1))
    if args.only:
        chosen = [int(n) for n in args.only.split(",")]
        if bad := [n for n in chosen if not 1 <= n <= len(MUTANTS)]:
            parser.error(f"--only: no mutant {bad[0]}; there are 1 to {len(MUTANTS)}")
    if args.list:
        for n in chosen:
            print(f"{n:2d}  {MUTANTS[n - 1].file}: {MUTANTS[n - 1].what}")
        return 0
    if stale := [n for n in chosen if not applies(MUTANTS[n - 1])]:
        for n in stale:
            print(f"{n:2d}  stale: {MUTANTS[n - 1].file} no longer holds {MUTANTS[n - 1].old!r} exactly once")
        print(f"mutants {stale} no longer apply: update their lines in scripts/mutants.py")
        return 2
    if missing := missing_tests([MUTANTS[n - 1] for n in chosen]):
        print("no such tests (renamed or re-parametrized? update scripts/mutants.py):\n  " + "\n  ".join(missing))
        return 2
    start, verdicts = time.perf_counter(), {}
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        running = {pool.submit(run, MUTANTS[n - 1]): n for n in sorted(chosen, key=lambda n: not MUTANTS[n - 1].slow)}
        for done in as_completed(running):
            n, mutant = running[done], MUTANTS[running[done] - 1]
            verdicts[n], seconds, cpu, output = done.result()
            print(f"{n:2d}  {verdicts[n]:8s} {seconds:4.0f} s ({cpu:4.0f} s CPU)  {mutant.file}: {mutant.what}",
                  flush=True)
            if verdicts[n] == "broken" or args.verbose:
                print(output[-3000:], flush=True)
    survived = sorted(n for n, v in verdicts.items() if v == "survived")
    broken = sorted(n for n, v in verdicts.items() if v == "broken")
    print(f"{len(verdicts) - len(survived) - len(broken)} of {len(verdicts)} mutants caught in "
          f"{time.perf_counter() - start:.0f} s" + (f"; survived: {survived}" if survived else "")
          + (f"; their tests could not run: {broken}" if broken else ""))
    return 2 if broken else 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
