"""Drafting with a Gemma 4 assistant checkpoint.

The assistant has no cache of its own: every draft step attends to the target's verified K/V, read from the
target's caches once per round (`caches.visible_kv`; all positions for full layers). For sliding layers it
reads the last `sliding_window + 1` positions, p - w..p when the cache holds positions 0..p, however often
the ring buffer has wrapped or been rolled back: the transformers reference (`Gemma4AssistantForCausalLM.
create_attention_masks`) flips the key axis newest-first and applies the bidirectional sliding-window mask
`abs(q_idx - kv_idx) <= w` to its single query at index 0, which keeps w + 1 keys, one more than the target's
own causal window. The query position is that of the round's first input token (the target's last sampled
token, p + 1) for every step, as in the reference; drafted tokens reach the next step only through the
fed-back `post_projection` state and their embedding.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core.sampling import SamplingParams
from ..models.gemma4_assistant import Gemma4Assistant, is_assistant, load_assistant
from ..runners.checkpoint import check_memory
from ..runners.target import Step, Target
from ..seams.caches import visible_kv
from ..seams.errors import SpecError
from .protocol import (
    Draft,
    Drafter,
    Kind,
    LastHiddenRows,
    Pairing,
    draft_autoregressively,
    draft_batch,
)

MAX_DRAFT_LEN = 4  # the adaptive policy's upper bound for an assistant, unless models.toml recommends one


def text_model(target_model):
    """The Gemma 4 text model (inside the multimodal `gemma4` Model, or a `gemma4_text` Model's own)."""
    return getattr(target_model, "language_model", target_model).model


def shared_kv_sources(target_model) -> dict[str, int]:
    """Layer type -> index of the target's last non-KV-shared layer of that type (its cache holds the K/V)."""
    text = text_model(target_model)
    first_shared = len(text.layers) - text.config.num_kv_shared_layers
    return {layer.layer_type: i for i, layer in enumerate(text.layers[:first_shared])}


class AssistantDrafter(Drafter):
    name = "assistant"
    hidden_tail = 1  # of the prompt's hidden states it reads the last only

    def __init__(self, assistant: Gemma4Assistant, target: Target):
        """`target` must return post-norm hidden states (`Target(..., hidden="post")`)."""
        self.assistant, self.target = assistant, target
        self.weights = assistant
        text = text_model(target.model)
        self.embed, self.embed_scale = text.embed_tokens, text.embed_scale
        self.sliding_keys = text.window_size + 1  # the reference's mask: abs(q - kv) <= sliding_window
        self.sources = shared_kv_sources(target.model)

    def batched(self, target_batch) -> "BatchedAssistant":
        return BatchedAssistant(self, target_batch)

    def begin(self, context: list[int], prompt_step: Step) -> None:
        self.last_hidden = prompt_step.hidden[-1:] if len(context) > 1 and prompt_step.hidden is not None else None

    def shared_kv(self) -> dict:
        return {kind: visible_kv(self.target.cache[i], self.sliding_keys if kind == "sliding_attention" else None)
                for kind, i in self.sources.items()}

    def _step(self, token: mx.array) -> mx.array:
        embedding = self.embed(token.reshape(1, 1)) * self.embed_scale
        logits, self.hidden = self.assistant(embedding, self.hidden, self.kv, self.position)
        return logits[0]

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        if k == 0 or self.last_hidden is None:
            return Draft.empty()
        self.kv, self.position, self.hidden = self.shared_kv(), len(context) - 1, self.last_hidden[None]
        first_logits = self._step(mx.array(context[-1:], dtype=mx.int32))
        return draft_autoregressively(first_logits, self._step, k, params, context, key, self.constrain,
                                      self.go_on)

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        self.last_hidden = step.hidden[-1:]  # at the last accepted position, whose logits gave context[-1]


class BatchedAssistant(LastHiddenRows):
    """The assistant drafting for a batch (`BatchedDecoder`): each step for every row at once, each row attending,
    as alone, to its own verified K/V in the target's RaggedBatch (its valid columns; for sliding layers those of
    its last window + 1 positions, by mask) from the position after its last verified one, and starting from its
    own last verified hidden state."""

    name = "assistant"

    def __init__(self, drafter: AssistantDrafter, target_batch):
        super().__init__()
        self.drafter, self.target = drafter, target_batch

    def propose(self, contexts: list[list[int]], lengths: list[int], params: list[SamplingParams],
                keys: list[mx.array]) -> list[Draft]:
        lengths = [k if h is not None else 0 for k, h in zip(lengths, self.last_hidden)]
        if max(lengths) == 0:
            return [Draft.empty() for _ in contexts]
        drafter, batch = self.drafter, self.target
        valid = batch.valid[:, :batch.columns]
        query = batch.offsets  # each row's next position: that of the round's first input
        seen = {"full_attention": valid,
                "sliding_attention": valid & (query[:, None] - batch.column_positions() <= drafter.sliding_keys)}
        kv, masks = {}, {}
        for kind, i in drafter.sources.items():  # a sliding layer's columns from its window's first
            kv[kind] = batch.caches[i].held()
            masks[kind] = mx.array(seen[kind][:, None, None, batch.caches[i].first:])
        position = mx.array(query.astype(np.int32))
        hidden = self.stacked()[:, None]

        def next_logits(tokens: mx.array) -> mx.array:
            nonlocal hidden
            embedding = drafter.embed(tokens[:, None]) * drafter.embed_scale
            logits, hidden = drafter.assistant(embedding, hidden, kv, position, masks)
            return logits[:, 0]

        first = next_logits(mx.array([context[-1] for context in contexts], dtype=mx.int32))
        return draft_batch(first, next_logits, contexts, lengths, params, keys, self.constraints, self.go_on)


def mismatch(assistant_cfg: dict, target_cfg: dict) -> str | None:
    """Why a Gemma 4 assistant cannot serve this target (None when it can)."""
    text, own = target_cfg.get("text_config", target_cfg), assistant_cfg["text_config"]
    if not text.get("model_type", "").startswith("gemma4"):
        return f"the target is {target_cfg.get('model_type')!r}, not a Gemma 4 model"
    if assistant_cfg["backbone_hidden_size"] != text["hidden_size"]:
        return (f"it was trained on a backbone of hidden size {assistant_cfg['backbone_hidden_size']}, the target's "
                f"is {text['hidden_size']}")
    if own["vocab_size"] != text["vocab_size"]:
        return f"vocabulary sizes differ ({text['vocab_size']} vs {own['vocab_size']})"
    for key in ("head_dim", "global_head_dim", "num_key_value_heads"):
        if own.get(key) != text.get(key):
            return f"its {key} is {own.get(key)}, the target's K/V have {text.get(key)}"
    return None


def check(pairing: Pairing) -> None:
    """The assistant pairs with the target: trained on its backbone, reading float K/V it has."""
    path, target, config = pairing.draft_path, pairing.target, pairing.draft_config
    if why := mismatch(config, target.config):
        raise SpecError(f"the Gemma 4 assistant {path} does not pair with {target.path}: {why}; use the assistant "
                        "published for this target (see models.toml)")
    if pairing.kv_bits:
        raise SpecError("the Gemma 4 assistant reads the target's K/V, which must stay float: drop --kv-bits")
    missing = set(config["text_config"]["layer_types"]) - set(shared_kv_sources(target.model))
    if missing:
        raise SpecError(f"{target.path} has no non-shared {', '.join(sorted(missing))} layer for the assistant")


def build(pairing: Pairing, runner: Target) -> AssistantDrafter:
    check_memory(pairing.draft_path, None, what="draft model")
    return AssistantDrafter(load_assistant(pairing.draft_path), runner)


KINDS = [Kind("assistant", build, recognises=lambda pairing: is_assistant(pairing.draft_config), check=check,
              reads=lambda pairing: "post", max_draft_len=lambda pairing: MAX_DRAFT_LEN,
              chains_only="a Gemma 4 assistant proposes chains only")]
