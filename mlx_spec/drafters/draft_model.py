"""A separate, smaller model of the same vocabulary that drafts autoregressively with its own cache: a chain,
or with `width` > 1 a token tree (`grow_tree`: EAGLE-2's dynamic tree, the draft's own greedy chain kept)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core.sampling import SamplingParams
from ..models.mtp_head import is_mtp_head
from ..runners.checkpoint import (
    check_memory,
    kv_quantization_problem,
    load_checkpoint,
    vocab_mismatch,
    vocab_size,
)
from ..runners.prompt_cache import common_prefix
from ..runners.ragged import RaggedBatch
from ..runners.target import Step, Target
from ..seams.errors import SpecError
from .protocol import (
    BatchDrafter,
    Draft,
    Drafter,
    Kind,
    Pairing,
    RowDrafters,
    draft_autoregressively,
    draft_batch,
    grow_tree,
)


class DraftModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, model, vocab_size: int, kv_bits: int | None = None, kv_group_size: int = 64,
                 width: int = 1):
        self.runner = Target(model, kv_bits, kv_group_size)
        self.weights = model
        self.vocab_size = vocab_size  # the target's: padded vocabularies may differ by a few rows
        self.width = width
        self.context: list[int] = []  # the runner's cache holds context[:runner.offset]
        self.tree: Draft | None = None  # the last tree proposed
        self.fed: dict[int, int] = {}  # its nodes that the runner's cache holds -> their place after the context

    def batched(self, target_batch) -> BatchDrafter:
        """Drafting for a batch: chains by every row's draft step in one forward of the draft model; token trees
        (width > 1), and chains of a draft model whose caches do not batch, by a drafter of each row's own."""
        if self.width > 1 or RaggedBatch.problem(self.weights):
            return RowDrafters(self.name, lambda: DraftModelDrafter(self.weights, self.vocab_size, self.runner.kv_bits,
                                                                    self.runner.kv_group_size, self.width))
        return BatchedDraftModel(self.weights, self.vocab_size, self.runner)

    @property
    def caches(self) -> list:
        return self.runner.cache

    def _logits(self, tokens, attend=None, positions: list[int] | None = None) -> mx.array:
        logits = self.runner.forward(tokens, attend, positions).logits
        return fit_vocabulary(logits if attend is not None else logits[-1:], self.vocab_size)

    def begin(self, context: list[int], prompt_step: Step) -> None:
        self.runner.prefill(context[:-1], self.context)  # reuses the prefix it already holds
        self.context, self.proposed_from, self.tree = context, self.runner.offset, None

    def hold(self) -> tuple:
        """Its cache and context for the sequence the target's cache holds (`prompt_cache`)."""
        return self.runner.snapshot(), self.runner.offset, list(self.context)

    def resume(self, held: tuple | None) -> None:
        """Take back what `hold` gave (None: keep its own sequence, which `begin` reuses what it can of)."""
        if held is not None:
            self.runner.restore(held[0], held[1])
            self.context = list(held[2])

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        self.proposed_from, self.tree = len(context), None
        if k == 0:
            return Draft.empty()
        first_logits = self._logits(context[self.runner.offset:])
        if self.width == 1:
            return draft_autoregressively(first_logits, self._logits, k, params, context, key,  # the last is not fed
                                          self.constrain, self.go_on)
        self.tree = self._expand(first_logits, k, len(context))
        return self.tree

    def _expand(self, logits: mx.array, depth: int, position: int) -> Draft:
        """A tree of `depth` levels; `position`: that of its first level."""
        def score(nodes, tokens, parents, attend, level):
            return self._logits(mx.array([tokens[n] for n in nodes], dtype=mx.int32), attend,
                                [position + level] * len(nodes))
        tree, self.fed = grow_tree(logits, depth, self.width, score)
        return tree

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        if self.tree is None:
            valid = min(self.runner.offset, self.proposed_from + accepted)
            self.runner.rollback(self.runner.offset - valid)
        else:  # keep the accepted path's nodes that the runner has seen
            tokens, node, kept = self.tree.tokens.tolist(), -1, []
            for token in context[len(context) - 1 - accepted:-1]:
                node = next(c for c, p in enumerate(self.tree.parents) if p == node and tokens[c] == token)
                if node in self.fed:
                    kept.append(self.fed[node])
            self.runner.keep(len(self.fed), kept)
        # a round without drafting calls no propose: the runner then holds a prefix of its context as it is
        self.context, self.tree, self.proposed_from = context, None, self.runner.offset


def fit_vocabulary(logits: mx.array, vocab_size: int) -> mx.array:
    """The draft's scores over the target's vocabulary: padded rows cut, missing ones -inf."""
    width = logits.shape[-1]
    if width > vocab_size:
        return logits[..., :vocab_size]
    if width < vocab_size:
        return mx.pad(logits, [(0, 0)] * (logits.ndim - 1) + [(0, vocab_size - width)], constant_values=-mx.inf)
    return logits


class BatchedDraftModel(BatchDrafter):
    """The draft model drafting for a whole batch (`BatchedDecoder`): each draft step of every row in one forward
    over a RaggedBatch of the draft model's own, whose row i holds the first `batch.offsets[i]` tokens of its
    context; a round feeds each row the rest, then the drafted tokens, and keeps what the target accepted."""

    name, resumes = "draft-model", True

    def __init__(self, model, vocab_size: int, runner: Target):
        """runner: the draft model alone (`DraftModelDrafter`'s), whose cache layout the prompt cache keeps."""
        self.model, self.vocab_size, self.runner = model, vocab_size, runner
        self.kv = {"kv_bits": runner.kv_bits, "kv_group_size": runner.kv_group_size}  # as its cache alone
        self.batch, self.fed = RaggedBatch(model, **self.kv), None

    def join(self, context: list[int], hidden=None, ready: bool = True, held: tuple | None = None) -> None:
        """A row whose tokens so far are `context`, prefilled in the draft model now, or if not `ready` at its
        first draft (where drafting does not pay, its prompt costs the draft model nothing). `held`: what the
        draft model held of a sequence it ran (`DraftModelDrafter.hold`, from the prompt cache), its start
        shared with `context` kept."""
        reuse = min(held[1], common_prefix(held[2], context[:-1])) if held else 0
        if reuse < (held[1] if held else 0) and not self.runner.cuttable:
            reuse = 0
        if not reuse:
            self.batch.join(RaggedBatch.prefilled(self.model, [context[:-1] if ready else []], **self.kv))
            return
        row = RaggedBatch.holding(self.model, self.runner.held_positions(held[0], reuse), reuse, **self.kv)
        while ready and not row.extend(context[:-1]):
            pass
        self.batch.join(row)

    def row_state(self, row: int, context: list[int]) -> tuple | None:
        """What the draft model holds of row `row` (whose tokens are `context`), as `DraftModelDrafter.hold`
        gives it: for the prompt cache (None: nothing, a row that joined unready and never drafted)."""
        n = int(self.batch.offsets[row])
        return (self.runner.snapshot_of(self.batch.row_positions(row), n), n, context[:n]) if n else None

    def _prefill_unready(self, contexts: list[list[int]]) -> None:
        """Prefill the rows that joined unready and hold nothing yet, each alone, in their places: their whole
        contexts in the next forward would pad every row to their length."""
        for row, (context, held) in enumerate(zip(contexts, self.batch.offsets)):
            if held == 0 and len(context) > 1:
                self.batch.join(RaggedBatch.prefilled(self.model, [context[:-1]], **self.kv))
                order = list(range(self.batch.size - 1))
                order[row] = self.batch.size - 1
                self.batch.select(order)

    def select(self, rows: list[int]) -> None:
        self.batch.select(rows)

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        longest, self.fed = max(lengths), None
        if longest == 0:
            return [Draft.empty() for _ in contexts]
        self._prefill_unready(contexts)
        tails = [context[held:] for context, held in zip(contexts, self.batch.offsets)]
        inputs = np.zeros((len(tails), max(map(len, tails))), dtype=np.int32)
        for row, tail in enumerate(tails):
            inputs[row, :len(tail)] = tail
        self.batch.mark()
        logits = self.batch.forward(mx.array(inputs), [len(t) for t in tails])
        logits = fit_vocabulary(logits[mx.arange(len(tails)), mx.array([len(t) - 1 for t in tails])], self.vocab_size)

        def next_logits(column: mx.array) -> mx.array:
            return fit_vocabulary(self.batch.forward(column[:, None], [1] * len(tails))[:, 0], self.vocab_size)

        drafts = draft_batch(logits, next_logits, contexts, lengths, params, keys, self.constraints, self.go_on)
        self.fed, self.lengths = [len(t) for t in tails], [d.tokens.shape[0] for d in drafts]
        return drafts

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden=None, tree_logits=None) -> None:
        """Keep each row's fed tail and its accepted drafts that were fed (the round's last draft never is; a
        row's accepted tokens past its own drafts, a prediction's or a grammar's, were not fed)."""
        if self.fed is None:
            return  # a round without drafting: the rows' tails wait for the next draft
        longest = max(self.lengths)
        kept = [fed + min(count, k, longest - 1) for fed, count, k in zip(self.fed, accepted, self.lengths)]
        self.batch.keep(kept)
        self.fed = None


def check(pairing: Pairing) -> None:
    if is_mtp_head(pairing.draft_config):
        raise SpecError(f"{pairing.draft_model} is an MTP head: draft with it by --mtp-path {pairing.draft_model}")


def build(pairing: Pairing, runner) -> DraftModelDrafter:
    """A draft model of the target's vocabulary, whose cache rolls back."""
    path, target, kv_bits = pairing.draft_path, pairing.target, pairing.kv_bits
    check_memory(path, None, what="draft model")
    draft, draft_tok, draft_cfg = load_checkpoint(path, "draft model")
    if kv_bits and (problem := kv_quantization_problem(draft_cfg, pairing.kv_group_size)):
        raise SpecError(f"--kv-bits cannot be used with the draft model {path}: {problem}")
    if why := vocab_mismatch(target.tokenizer, target.config, draft_tok, draft_cfg):
        raise SpecError(f"draft model {path} does not share the target's vocabulary: {why}; "
                        "use a draft from the same model family")
    drafter = DraftModelDrafter(draft, vocab_size(target.config), kv_bits, pairing.kv_group_size)
    if problem := drafter.runner.rollback_problem():
        raise SpecError(f"draft model {path} cannot be used: {problem}")
    return drafter


def tree_problem(pairing: Pairing, drafter: DraftModelDrafter) -> str | None:
    problem = drafter.runner.tree_problem(by_levels=True)
    return f"{pairing.draft_path.name} {problem}" if problem else None


KINDS = [Kind("draft-model", build, check=check, tree_problem=tree_problem)]
