"""Drafting with an EAGLE-3 head (models/eagle3.py) over the target's low/mid/high features.

The head keeps rows as the Qwen MTP layer does (row p pairs embed(t_{p+1}) with the target's features at p;
draft steps feed back the head's own output g), so it shares MTPDrafter's bookkeeping: verified rows are
built lazily, in one forward, when the next draft is asked for; draft rows are dropped after verification.
With `width` > 1 it drafts a dynamic tree (`grow_tree`): a level's nodes are fed together, each attending to
its own ancestors in the head's cache and placed at its depth's position.
"""

from __future__ import annotations

import mlx.core as mx

from ..core.sampling import SamplingParams
from ..models.eagle3 import Eagle3
from ..seams import compat
from ..seams.caches import tree_forward
from .protocol import Draft, grow_tree
from .qwen_mtp import MTPDrafter


class Eagle3Drafter(MTPDrafter):
    name = "eagle3"
    hidden_tail = None  # rows for every prompt position: its features are layer inputs, which cost nothing extra

    def __init__(self, head: Eagle3, target_model):
        """The target must be run with `Target(..., hidden=feature_layers(...))`."""
        embed = head.embed_tokens if "embed_tokens" in head else compat.input_embedding(target_model)
        super().__init__(head, embed, head.logits)
        compat.positioned_ropes(head)  # tree levels put several nodes at one position
        self.width = 1

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        if self.width == 1 or k == 0:
            return super().propose(context, k, params, key)
        self._catch_up()
        if self.next_logits is None:
            return Draft.empty()
        position, hidden_of = self.caches[0].offset, {-1: self.mtp_hidden}

        def score(nodes, tokens, parents, attend, level):
            self.draft_rows += len(nodes)
            hidden = mx.concatenate([hidden_of[parents[n]] for n in nodes])
            with tree_forward(self.caches, attend, [position + level] * len(nodes)):
                g = self.mtp(self.embed(mx.array([tokens[n] for n in nodes]))[None], hidden[None], self.caches)[0]
            hidden_of.update({n: g[i:i + 1] for i, n in enumerate(nodes)})
            return self.head(g)

        return grow_tree(self.next_logits, k, self.width, score)[0]
