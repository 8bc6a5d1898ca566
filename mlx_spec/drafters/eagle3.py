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
from ..models.eagle3 import Eagle3, feature_layers, is_eagle3, load_eagle3
from ..models.eagle3 import read_config as eagle3_config
from ..runners.checkpoint import check_memory, vocab_size
from ..seams import compat, layout
from ..seams.caches import tree_forward
from ..seams.errors import SpecError
from .protocol import BatchDrafter, Draft, Kind, Pairing, RowDrafters, grow_tree
from .qwen_mtp import MTPDrafter


class Eagle3Drafter(MTPDrafter):
    name = "eagle3"
    hidden_tail = None  # rows for every prompt position: its features are layer inputs, which cost nothing extra

    def __init__(self, head: Eagle3, target_model):
        """The target must be run with `Target(..., hidden=feature_layers(...))`."""
        embed = head.embed_tokens if "embed_tokens" in head else layout.input_embedding(target_model)
        super().__init__(head, embed, head.logits)
        compat.positioned_ropes(head)  # tree levels put several nodes at one position
        self.width, self.target_model = 1, target_model

    def batched(self, target_batch) -> BatchDrafter:
        """Drafting for a batch: chains of every row in one forward of the head; trees (width > 1) row by row,
        each row's head cache its own."""
        if self.width == 1:
            return super().batched(target_batch)

        def row() -> Eagle3Drafter:
            drafter = Eagle3Drafter(self.mtp, self.target_model)
            drafter.width = self.width
            return drafter
        return RowDrafters(self.name, row)

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


def features(pairing: Pairing) -> list[int]:
    """The target layers an EAGLE-3 head reads, after checking that the head was trained for this target."""
    path, target = pairing.draft_path, pairing.target
    text = target.config.get("text_config", target.config)
    layers, hidden = text["num_hidden_layers"], text["hidden_size"]
    head = eagle3_config(pairing.draft_config, path)
    read = feature_layers(head, layers)
    if head["target_hidden"] != hidden or head["vocab_size"] != vocab_size(target.config) or max(read) >= layers:
        raise SpecError(f"the EAGLE-3 head {path} (target hidden size {head['target_hidden']}, vocabulary "
                        f"{head['vocab_size']}, features of layers {read}) was not trained for {target.path} "
                        f"(hidden size {hidden}, vocabulary {vocab_size(target.config)}, {layers} layers): use the "
                        "head published for this target (see models.toml)")
    return read


def build(pairing: Pairing, runner) -> Eagle3Drafter:
    check_memory(pairing.draft_path, None, what="EAGLE-3 head")
    return Eagle3Drafter(load_eagle3(pairing.draft_path, pairing.draft_config), pairing.target.model)


def tree_problem(pairing: Pairing, drafter: Eagle3Drafter) -> str | None:
    return f"{pairing.draft_path.name} has sliding-window layers, which draft chains only" if drafter.mtp.windowed \
        else None


KINDS = [Kind("eagle3", build, recognises=lambda pairing: is_eagle3(pairing.draft_config), reads=features,
              tree_problem=tree_problem)]
