"""Drafting with Medusa heads: every head scores one future position from the target's last verified hidden
state, so a round's drafts cost one small matmul per head and no sequential steps.

Head i over the hidden state of the position whose target logits gave the context's last token proposes the
draft at position i + 1. A chain takes each head's top token; with `width` > 1 a tree adds, at every depth,
the `width` - 1 next-best tokens of that head as siblings of the chain's node (Medusa's candidate trees are
built from the heads' top-k the same way). Drafts are deterministic (one-hot q), which keeps verification
exact at every temperature. `BatchedMedusa` drafts chains for a batch: every row's heads in one call.
"""

from __future__ import annotations

import mlx.core as mx

from ..core.sampling import SamplingParams
from ..models.medusa import MedusaHeads, is_medusa, load_medusa, medusa_shape
from ..runners.checkpoint import vocab_size
from ..runners.target import Step
from ..seams.errors import SpecError
from .protocol import (
    BatchDrafter,
    Draft,
    Drafter,
    Kind,
    LastHiddenRows,
    Pairing,
    RowDrafters,
)


class MedusaDrafter(Drafter):
    name = "medusa"
    hidden_tail = 1  # of the prompt's hidden states it reads the last only

    def __init__(self, heads: MedusaHeads, width: int = 1):
        """The target must be run with `Target(..., hidden="post")`."""
        self.heads = self.weights = heads
        self.caches: list = []
        self.width = width
        self.hidden: mx.array | None = None

    def batched(self, target_batch) -> BatchDrafter:
        """Drafting for a batch: chains of every row in one pass of the heads; trees (width > 1) row by row."""
        if self.width > 1:
            return RowDrafters(self.name, lambda: MedusaDrafter(self.heads, self.width))
        return BatchedMedusa(self.heads)

    def begin(self, context: list[int], prompt_step: Step) -> None:
        hidden = prompt_step.hidden
        self.hidden = hidden[-1:] if hidden is not None and hidden.shape[0] else None

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        k = min(k, len(self.heads.heads))
        if self.hidden is None or k == 0:
            return Draft.empty()
        logits = self.heads(self.hidden, k)
        if self.width == 1:
            return Draft(mx.argmax(logits, axis=-1).astype(mx.int32))
        top = mx.argsort(-logits, axis=-1)[:, : self.width].tolist()
        chain = [row[0] for row in top]
        paths = [chain] + [chain[:depth] + [top[depth][j]] for depth in range(k) for j in range(1, self.width)]
        return Draft.from_paths(paths)

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        self.hidden = step.hidden[-1:]


class BatchedMedusa(LastHiddenRows):
    """Medusa heads drafting chains for a batch (`BatchedDecoder`), each row from its own last verified hidden
    state as alone."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads):
        super().__init__()
        self.heads = heads

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        lengths = [min(k, len(self.heads.heads)) if h is not None else 0 for k, h in zip(lengths, self.last_hidden)]
        if max(lengths) == 0:
            return [Draft.empty() for _ in contexts]
        hidden = self.stacked()
        tokens = mx.stack([mx.argmax(head(hidden), axis=-1) for head in self.heads.heads[:max(lengths)]], axis=1)
        return [Draft(tokens[row, :k].astype(mx.int32)) if k else Draft.empty() for row, k in enumerate(lengths)]


def build(pairing: Pairing, runner) -> MedusaDrafter:
    """Medusa heads, checked against their target."""
    path, config, target = pairing.draft_path, pairing.draft_config, pairing.target
    heads = load_medusa(path, config)
    vocab, hidden = heads.heads[0].out.weight.shape
    text = target.config.get("text_config", target.config)
    trained_for = config.get("base_model_name_or_path", "another model")
    if hidden != text["hidden_size"] or vocab != vocab_size(target.config):
        raise SpecError(f"the Medusa heads {path} (hidden size {hidden}, vocabulary {vocab}) were trained for "
                        f"{trained_for}, not {target.path} (hidden size {text['hidden_size']}, vocabulary "
                        f"{vocab_size(target.config)}): use heads trained for this target")
    return MedusaDrafter(heads)


KINDS = [Kind("medusa", build, recognises=lambda pairing: is_medusa(pairing.draft_config),
              reads=lambda pairing: "post",
              max_draft_len=lambda pairing: medusa_shape(pairing.draft_config, pairing.draft_path)[0])]
