"""Qwen3.5 / 3.6 built-in multi-token prediction drafting.

MTP row p pairs embed(t_{p+1}) with the target's hidden state h_p and predicts t_{p+2}. The last row built
from verified target states scores the first draft of the next round; each further draft feeds back the MTP
layer's own post-norm output. After verification the draft-time rows are dropped; the rows for the
accepted tokens and the target's own next token are rebuilt from the target's verified hidden states when the
next draft is asked for, in one batched forward (the policy's "off": no MTP work per round then). Rows start at
the prompt's last PROMPT_ROWS positions, and start over on the last PROMPT_ROWS after a longer pause in drafting.
EAGLE-3 heads keep their rows the same way, but for every position (drafters/eagle3.py).
`BatchedMTP` does the same for a batch: every row's rows in one RaggedBatch, built and drafted together.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..core.sampling import SamplingParams
from ..models.mtp_head import ARCHITECTURE as MTP_HEAD
from ..models.mtp_head import is_mtp_head, load_head
from ..models.nextn import check_supported, is_nextn, load_nextn, target_state
from ..models.qwen3_5 import checkpoint_files, lm_head, load_mtp, text_model
from ..runners.ragged import RaggedBatch
from ..runners.target import MAX_DRAFT_LEN, PREFILL_CHUNK, Step
from ..seams import layout
from ..seams.caches import make_caches, restore, rollback, snapshot
from ..seams.errors import SpecError
from .protocol import (
    BatchDrafter,
    Draft,
    Drafter,
    Kind,
    Pairing,
    draft_autoregressively,
    draft_batch,
)

# The prompt positions the layer gets rows for: its last 16. Their hidden states make the target's last layer
# run in full where they are read (the cache alone skips its attention output and MLP): 29% of the demo's 4-layer
# prefill over every position. Measured on the demo (alone, two drafts, 16 prompts x 64 tokens): 39.3% of drafts
# accepted with rows for every position, 40.2% with the last 16.
PROMPT_ROWS = 16


def window(pending: list[tuple[list[int], mx.array]], tail: int | None) -> tuple[list[int], mx.array, bool]:
    """The tokens and hidden states of `pending` rounds, their last `tail` only (None: all), and whether that
    left some out (the layer then starts over on them)."""
    tokens, hidden = [t for chunk, _ in pending for t in chunk], mx.concatenate([h for _, h in pending])
    if tail is None or len(tokens) <= tail:
        return tokens, hidden, False
    return tokens[-tail:], hidden[-tail:], True


class MTPDrafter(Drafter):
    name = "mtp"
    hidden_tail = PROMPT_ROWS

    def __init__(self, mtp, embed, head):
        """mtp(embeddings, hidden, caches) -> the hidden state fed back; `head` scores it; `embed`: the target's
        embedding. The target must be run with `Target(..., hidden=...)`: its Steps carry the hidden states."""
        self.mtp = self.weights = mtp
        self.caches: list = []
        self.pending: list[tuple[list[int], mx.array]] = []  # verified (tokens, hidden) without rows yet
        self.embed, self.head = embed, head
        self.last_hidden = None  # the target's hidden state at the last position of its cache

    def batched(self, target_batch) -> "BatchedMTP":
        """Drafting for a batch: every row's rows and draft steps in one forward of the layer, chains."""
        return BatchedMTP(self)

    def begin(self, context: list[int], prompt_step: Step) -> None:
        """Rows for the prompt positions whose hidden states the target returned (its last `hidden_tail`). When
        the target reused a cached prefix and returned all it ran (it only extends its cache for hidden-state
        drafters), the rows already built for the prefix stay and its last one is rebuilt."""
        hidden = prompt_step.hidden
        first = len(context) - 1 - hidden.shape[0] if hidden is not None else len(context) - 1  # its position
        if 0 < first == prompt_step.start and self.last_hidden is not None:
            self._catch_up()  # the previous sequence's rows, up to the reused prefix's last position
            rollback(self.caches, 1, self.caches[0].offset)  # it paired that position with another next token
            hidden, first = mx.concatenate([self.last_hidden, hidden]), first - 1
        else:
            self.caches, self.pending = make_caches(self.mtp, MAX_DRAFT_LEN + 1), []
        self.draft_rows = 0  # rows added while drafting, dropped after verification
        self.next_logits = None  # scores the first draft of the next round
        for start in range(first, len(context) - 1, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, len(context) - 1)
            self._rows(context[start + 1:end + 1], hidden[start - first:end - first])
            mx.eval([c.state for c in self.caches])
        if len(context) > 1 and hidden is not None:
            self.last_hidden = hidden[-1:]

    def hold(self) -> tuple:
        """Its state for the sequence the target's cache holds (`prompt_cache`): rows, and verified states
        without rows yet."""
        return snapshot(self.caches), list(self.pending), self.last_hidden

    def resume(self, held: tuple | None) -> None:
        """Take back a state `hold` gave; None: start afresh where the target's cache ends."""
        self.caches, self.pending, self.last_hidden = make_caches(self.mtp, MAX_DRAFT_LEN + 1), [], None
        if held is not None:
            restore(self.caches, held[0])
            self.pending, self.last_hidden = list(held[1]), held[2]

    def _rows(self, tokens, hidden: mx.array) -> mx.array:
        """Append MTP rows pairing embed(tokens[i]) with hidden[i]; returns the last row's logits."""
        tokens = mx.array(tokens, dtype=mx.int32) if isinstance(tokens, list) else tokens
        self.mtp_hidden = self.mtp(self.embed(tokens)[None], hidden[None], self.caches)[0, -1:]
        self.next_logits = self.head(self.mtp_hidden)
        return self.next_logits

    def _catch_up(self) -> None:
        """Build the rows of every round since the last draft, in one forward; after more than `hidden_tail`
        positions without drafting, the layer starts over on the last `hidden_tail` of them, as on a prompt."""
        if self.pending:
            tokens, hidden, restart = window(self.pending, self.hidden_tail)
            if restart:
                self.caches = make_caches(self.mtp, MAX_DRAFT_LEN + 1)
            self._rows(tokens, hidden)
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
        return draft_autoregressively(self.next_logits, self._draft_step, k, params, context, key, self.constrain,
                                      self.go_on)

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        if self.draft_rows:
            rollback(self.caches, self.draft_rows, self.draft_rows)
            self.draft_rows = 0
        self.pending.append((context[-(accepted + 1):], step.hidden))
        self.last_hidden = step.hidden[-1:]


class MTPRows:
    """The layer as a RaggedBatch runs a model: inputs (B, n, E + H) are each row's token embedding and hidden
    state side by side (E: the embedding's width)."""

    def __init__(self, drafter: MTPDrafter):
        self.drafter, self.split = drafter, None

    def make_cache(self) -> list:
        return make_prompt_cache(self.drafter.mtp)

    def inputs(self, tokens: list[int] | mx.array, hidden: mx.array) -> mx.array:
        """(n, E + H): embed(tokens[i]) beside hidden[i]."""
        tokens = mx.array(tokens, dtype=mx.int32) if isinstance(tokens, list) else tokens
        embeddings = self.drafter.embed(tokens)
        self.split = embeddings.shape[-1]
        return mx.concatenate([embeddings, hidden.astype(embeddings.dtype)], axis=-1)

    def __call__(self, inputs: mx.array, cache: list) -> mx.array:
        return self.drafter.mtp(inputs[..., :self.split], inputs[..., self.split:], cache)


class BatchedMTP(BatchDrafter):
    """The MTP layer (or head) drafting for a whole batch (`BatchedDecoder`), row by row as `MTPDrafter` drafts
    alone: the rows of the positions a sequence verified since it last drafted are built when it drafts next
    (one forward for the batch, each row its own count, padded), each draft step feeds every row's drafted token
    with the layer's own output, and after verification the draft steps' rows are dropped (`RaggedBatch.keep`).
    The decoder hands it the target's hidden states: the prompt's at `join`, each round's at `accept`."""

    def __init__(self, drafter: MTPDrafter):
        self.name, self.head, self.rows, self.tail = drafter.name, drafter.head, MTPRows(drafter), drafter.hidden_tail
        self.batch = RaggedBatch(self.rows)
        self.pending: list[list[tuple[list[int], mx.array]]] = []  # per row: verified (tokens, hidden), no rows yet
        self.built = None  # after a draft: how many rows each row built for verified positions

    def join(self, context: list[int], hidden: mx.array | None, ready: bool = True, held=None) -> None:
        """A row whose prompt is `context`; `hidden` (n, H): the target's states over the last n positions before
        its last token. Its rows are built now but the last, which scores its first draft. Without them (None: not
        `ready`, or none read) the row gets rows from the positions it decodes, as after a pause."""
        alone, first = RaggedBatch(self.rows, rows=1), len(context) - 1 - (0 if hidden is None else hidden.shape[0])
        for start in range(first, len(context) - 2, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, len(context) - 2)
            inputs = self.rows.inputs(context[start + 1:end + 1], hidden[start - first:end - first])
            alone.forward(inputs[None], [end - start])
            mx.eval([c.state for c in alone.caches])
        self.batch.join(alone)
        self.pending.append([(context[-1:], hidden[-1:])] if len(context) > 1 and hidden is not None else [])

    def select(self, rows: list[int]) -> None:
        self.batch.select(rows)
        self.pending = [self.pending[i] for i in rows]

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        lengths = [k if pending else 0 for k, pending in zip(lengths, self.pending)]  # a one-token prompt: no row
        longest, self.built = max(lengths), None
        if longest == 0:
            return [Draft.empty() for _ in contexts]
        built, counts = [], []
        for row, pending in enumerate(self.pending):
            tokens, hidden, restart = window(pending, self.tail) if pending else ([], None, False)
            if restart:
                self.batch.forget(row)  # as alone: after a long pause the layer starts over on its last rows
            built.append(self.rows.inputs(tokens, hidden) if tokens else None)
            counts.append(len(tokens))
        width = max(counts)
        like = next(rows for rows in built if rows is not None)
        inputs = mx.stack([mx.pad(rows, [(0, width - count), (0, 0)]) if rows is not None
                           else mx.zeros((width, like.shape[-1]), like.dtype) for rows, count in zip(built, counts)])
        self.batch.mark()
        out = self.batch.forward(inputs, counts)
        self.built, self.pending = counts, [[] for _ in contexts]
        hidden = out[mx.arange(len(counts)), mx.array([max(0, count - 1) for count in counts])]

        def next_logits(column: mx.array) -> mx.array:
            nonlocal hidden
            hidden = self.batch.forward(self.rows.inputs(column, hidden)[:, None], [1] * len(column))[:, 0]
            return self.head(hidden)

        return draft_batch(self.head(hidden), next_logits, contexts, lengths, params, keys,
                           self.constraints, self.go_on)

    def accept(self, contexts: list[list[int]], accepted: list[int], hidden: mx.array, tree_logits=None) -> None:
        """Drop the draft steps' rows; each row's accepted drafts and the target's next token wait for rows
        (`hidden` (B, n, H): the target's states over the round's inputs)."""
        if self.built is not None:
            self.batch.keep(self.built)
            self.built = None
        for row, (context, count) in enumerate(zip(contexts, accepted)):
            self.pending[row].append((context[-(count + 1):], hidden[row, :count + 1]))


def check_head(pairing: Pairing) -> None:
    """A trained MTP head (--mtp-path) is one, and reads what it was trained on."""
    if not is_mtp_head(pairing.head_config):
        raise SpecError(f"--mtp-path {pairing.mtp_path} holds no MTP head (its config.json does not name the "
                        f"architecture {MTP_HEAD}): give a folder `mlx-spec train-mtp` wrote")
    if pairing.mtp_hidden == "pre":
        raise SpecError("--mtp-hidden pre: a trained MTP head reads the target's post-norm hidden state; drop it")


def build_head(pairing: Pairing, runner) -> MTPDrafter:
    target = pairing.target
    head = load_head(pairing.head_path, pairing.head_config, target.model, target.config)
    return MTPDrafter(head, layout.input_embedding(target.model), head.logits)


def build_nextn(pairing: Pairing, runner) -> MTPDrafter:
    target = pairing.target
    check_supported(target.config, target.path)
    nextn = load_nextn(target.path, target.config, checkpoint_files(target.path))
    head = nextn.head if nextn.family.head else layout.output_head(target.model)
    embed = nextn.embed if nextn.family.embedding else layout.input_embedding(target.model)
    return MTPDrafter(nextn, embed, lambda x: head(nextn.head_input(x)))


def build_qwen(pairing: Pairing, runner) -> MTPDrafter:
    target = pairing.target
    if text_model(target.model) is None:
        raise SpecError(f"MTP drafting supports Qwen3.5 / 3.6 and Qwen3-Next checkpoints; {target.path} is "
                        f"{target.config.get('model_type')!r}: use --drafter ngram or --draft-model")
    return MTPDrafter(load_mtp(target.path, target.config), text_model(target.model).model.embed_tokens,
                      lm_head(target.model))


KINDS = [
    Kind("mtp-head", build_head, recognises=lambda pairing: pairing.head_path is not None, check=check_head,
         reads=lambda pairing: "post"),
    Kind("nextn", build_nextn, recognises=lambda pairing: is_nextn(pairing.target.config),
         reads=lambda pairing: pairing.mtp_hidden or target_state(pairing.target.config)),
    Kind("qwen-mtp", build_qwen, reads=lambda pairing: pairing.mtp_hidden or "post"),
]
