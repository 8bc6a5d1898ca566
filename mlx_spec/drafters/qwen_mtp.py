"""Qwen3.5 / 3.6 built-in multi-token prediction drafting.

MTP row p pairs embed(t_{p+1}) with the target's hidden state h_p and predicts t_{p+2}. The last row built
from verified target states scores the first draft of the next round; each further draft feeds back the MTP
layer's own post-norm output. After verification the draft-time rows are dropped; the rows for the
accepted tokens and the target's own next token are rebuilt from the target's verified hidden states when the
next draft is asked for, in one batched forward however many rounds ran without drafting (the policy's
"off": no MTP work per round then). EAGLE-3 heads keep their rows the same way (drafters/eagle3.py).
"""

from __future__ import annotations

import mlx.core as mx

from ..caches import make_caches, rollback
from ..sampling import SamplingParams
from ..target import MAX_DRAFT_LEN, PREFILL_CHUNK, Step
from . import Draft, draft_autoregressively


class MTPDrafter:
    name = "mtp"

    def __init__(self, mtp, embed, head):
        """mtp(embeddings, hidden, caches) -> the hidden state fed back; `head` scores it; `embed`: the target's
        embedding. The target must be run with `Target(..., hidden=...)`: its Steps carry the hidden states."""
        self.mtp = self.weights = mtp
        self.caches: list = []
        self.pending: list[tuple[list[int], mx.array]] = []  # verified (tokens, hidden) without rows yet
        self.embed, self.head = embed, head
        self.last_hidden = None  # the target's hidden state at the last position of its cache

    def begin(self, context: list[int], prompt_step: Step) -> None:
        """Rows for every prompt position; when the target reused a cached prefix (it only extends its cache
        for hidden-state drafters), the rows already built for it stay and the last one is rebuilt."""
        first = prompt_step.start - 1  # the first row to (re)build
        if first < 0:
            self.caches, first, hidden = make_caches(self.mtp, MAX_DRAFT_LEN + 1), 0, prompt_step.hidden
            self.pending = []
        else:
            self._catch_up()  # the previous sequence's rows, of which the reused prefix keeps some
            rows = self.caches[0].offset
            rollback(self.caches, rows - first, rows)
            hidden = mx.concatenate([self.last_hidden, prompt_step.hidden])
        self.draft_rows = 0  # rows added while drafting, dropped after verification
        self.next_logits = None  # scores the first draft of the next round
        for start in range(first, len(context) - 1, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, len(context) - 1)
            self._rows(context[start + 1:end + 1], hidden[start - first:end - first])
            mx.eval([c.state for c in self.caches])
        if len(context) > 1:
            self.last_hidden = hidden[-1:]

    def _rows(self, tokens, hidden: mx.array) -> mx.array:
        """Append MTP rows pairing embed(tokens[i]) with hidden[i]; returns the last row's logits."""
        tokens = mx.array(tokens, dtype=mx.int32) if isinstance(tokens, list) else tokens
        self.mtp_hidden = self.mtp(self.embed(tokens)[None], hidden[None], self.caches)[0, -1:]
        self.next_logits = self.head(self.mtp_hidden)
        return self.next_logits

    def _catch_up(self) -> None:
        """Build the rows of every round since the last draft, in one forward."""
        if self.pending:
            tokens = [t for chunk, _ in self.pending for t in chunk]
            self._rows(tokens, mx.concatenate([hidden for _, hidden in self.pending]))
            self.pending = []

    def _draft_step(self, token: mx.array) -> mx.array:
        self.draft_rows += 1
        return self._rows(token, self.mtp_hidden)

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        if k == 0:
            return Draft.empty()
        self._catch_up()
        if self.next_logits is None:
            return Draft.empty()
        return draft_autoregressively(self.next_logits, self._draft_step, k, params, context, key)

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        if self.draft_rows:
            rollback(self.caches, self.draft_rows, self.draft_rows)
            self.draft_rows = 0
        self.pending.append((context[-(accepted + 1):], step.hidden))
        self.last_hidden = step.hidden[-1:]
