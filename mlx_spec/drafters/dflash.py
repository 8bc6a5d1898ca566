"""Drafting with a block drafter (models/dflash.py: DFlash, DSpark): k drafts from one drafter forward.

The drafter's context is the target's features at every position it has verified: the prompt's (the target
returns them all) and, after each round, those of the round's last token and accepted drafts. They wait until the
next draft, which appends them to the drafter's cache and runs the block `[last token, MASK ...]` after them in
the same forward. Each position's q is the drafter's own distribution there (DSpark's with its Markov bias from
the token drafted before; DFlash2's over its candidate selector's choices after that token), sampled left to
right, so verification is exact at every temperature.

With a tree width W > 1 a DFlash drafter proposes a DDTree (Algorithm 1 of its paper): the W k prefixes of highest
probability under the block's per-position distributions, taken best-first (a prefix only after its parent),
verified in one target forward as a token tree (its nodes are one-hot candidates: exact at every temperature).
DSpark and DFlash2 drafters draft chains: each position's distribution depends on the token drafted before.
In a batch (`RowDrafters`) each row keeps its own context and drafts its own block, one drafter forward a row.
"""

from __future__ import annotations

from heapq import heappop, heappush

import mlx.core as mx

from ..core.sampling import SamplingParams
from ..models.dflash import BlockDrafterModel, block_kind, load_block_drafter
from ..models.dflash import read_config as block_config
from ..runners.checkpoint import check_memory, vocab_size
from ..runners.target import MAX_DRAFT_LEN, PREFILL_CHUNK, Step
from ..seams import compat
from ..seams.caches import restore, snapshot
from ..seams.errors import SpecError
from .protocol import Draft, Drafter, Kind, Pairing, RowDrafters, draft_autoregressively


def best_first_tree(logits: mx.array, budget: int) -> Draft:
    """DDTree: the `budget` most probable prefixes under independent per-position distributions softmax(logits)
    (k, V), each after its parent; ties go to the earlier. Nodes in order of depth."""
    top = min(budget, logits.shape[-1])
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    ids = mx.argpartition(-logprobs, top - 1, axis=-1)[:, :top]  # each position's top tokens, then in order
    ids = mx.take_along_axis(ids, mx.argsort(-mx.take_along_axis(logprobs, ids, axis=-1), axis=-1), axis=-1)
    scores = mx.take_along_axis(logprobs, ids, axis=-1).tolist()
    ids = ids.tolist()
    heap, chosen = [(-scores[0][0], 0, (0,), -1)], []  # (-log-probability, order, ranks per depth, parent)
    while heap and len(chosen) < budget:
        score, _, ranks, parent = heappop(heap)
        chosen.append((ranks, parent))
        depth, rank = len(ranks), ranks[-1]
        if rank + 1 < top:  # the next sibling
            heappush(heap, (score + scores[depth - 1][rank] - scores[depth - 1][rank + 1], len(chosen) * 2,
                            ranks[:-1] + (rank + 1,), parent))
        if depth < len(ids):  # the first child
            heappush(heap, (score - scores[depth][0], len(chosen) * 2 + 1, ranks + (0,), len(chosen) - 1))
    order = sorted(range(len(chosen)), key=lambda i: (len(chosen[i][0]), i))
    place = {node: i for i, node in enumerate(order)}
    return Draft(mx.array([ids[len(chosen[n][0]) - 1][chosen[n][0][-1]] for n in order], dtype=mx.int32),
                 parents=[place[chosen[n][1]] if chosen[n][1] >= 0 else -1 for n in order])


class BlockDrafter(Drafter):
    hidden_tail = None  # the context is every position's features

    def __init__(self, model: BlockDrafterModel, target_model):
        """The target must be run with `Target(..., hidden=...)` reading the outputs of the drafter's target
        layers (`features`)."""
        self.model = self.weights = model
        self.name, self.target_model = model.config["kind"], target_model
        self.embed = model.embed_tokens if "embed_tokens" in model else compat.input_embedding(target_model)
        self.head = model.lm_head if "lm_head" in model else compat.output_head(target_model)
        self.caches, self.pending, self.start = model.make_cache(), [], 0  # start: the next feature's position
        self.blocks, self.block_drafts, self.confidence = 0, 0, []  # this generation's, for `report`

    def batched(self, target_batch) -> RowDrafters:
        """Drafting for a batch: each row its own drafter (its context, the weights shared), chains or DDTrees."""
        def row() -> BlockDrafter:
            drafter = BlockDrafter(self.model, self.target_model)
            drafter.width = self.width
            return drafter
        return RowDrafters(self.name, row)

    def covered(self) -> int:
        """The positions whose features the drafter holds or has waiting."""
        return self.start + sum(h.shape[0] for h in self.pending)

    def resume_at(self, position: int, reused: int) -> None:
        """Features continue from `position`: what the drafter holds stays when it ends there and the target
        reused its cache that far (`reused` positions); otherwise the context starts afresh from there."""
        self._catch_up()
        if not 0 < position == self.start <= reused:
            self.caches = self.model.make_cache()
        self.start = position

    def hold(self) -> tuple:
        """Its context for the sequence the target's cache holds (`prompt_cache`)."""
        return snapshot(self.caches), list(self.pending), self.start

    def resume(self, held: tuple | None) -> None:
        """Take back a context `hold` gave; None: start afresh where the target's cache ends."""
        self.caches, self.pending, self.start = self.model.make_cache(), [], 0
        if held is not None:
            restore(self.caches, held[0])
            self.pending, self.start = list(held[1]), held[2]

    def absorb(self, start: int, hidden: mx.array) -> None:
        """The features of a prefill chunk from position `start` join the context as the target runs it."""
        if start != self.covered():  # not where the features it holds end: the context starts afresh here
            self.caches, self.pending, self.start = self.model.make_cache(), [], start
        self.pending.append(hidden)
        self._catch_up()
        mx.eval([c.state for c in self.caches])

    def begin(self, context: list[int], prompt_step: Step) -> None:
        """The prompt's features join the context now, in pieces, unless `absorb` took them during the prefill."""
        self.blocks, self.block_drafts, self.confidence = 0, 0, []
        if not prompt_step.absorbed:
            rows = 0 if prompt_step.hidden is None else prompt_step.hidden.shape[0]
            self.resume_at(len(context) - 1 - rows, prompt_step.start)
            self.pending += [prompt_step.hidden] if rows else []
        self._catch_up()

    def _catch_up(self) -> None:
        """Append the waiting features to the drafter's cache, PREFILL_CHUNK positions a forward."""
        features = mx.concatenate(self.pending) if self.pending else None
        self.pending = []
        for piece in range(0, 0 if features is None else features.shape[0], PREFILL_CHUNK):
            chunk = features[piece:piece + PREFILL_CHUNK]
            self.model.extend(chunk[None], self.caches, self.start)
            self.start += chunk.shape[0]
            if features.shape[0] > PREFILL_CHUNK:
                mx.eval([c.state for c in self.caches])

    def propose(self, context: list[int], k: int, params: SamplingParams, key: mx.array) -> Draft:
        self._catch_up()
        if k == 0 or not self.caches[0].offset:
            return Draft.empty()
        c = self.model.config
        self.blocks, self.block_drafts = self.blocks + 1, self.block_drafts + k
        anchor = mx.array(context[-1:], dtype=mx.int32)
        block = mx.concatenate([anchor, mx.full((k - c["from_anchor"],), c["mask"], dtype=mx.int32)])
        embedded = self.embed(block) * c["input_scale"] if c["input_scale"] != 1 else self.embed(block)
        hidden = self.model(embedded[None], self.caches, self.start)[0, 0 if c["from_anchor"] else 1:]
        logits = self.head(hidden) * c["output_scale"] if c["output_scale"] != 1 else self.head(hidden)
        if c["softcap"]:
            logits = mx.tanh(logits / c["softcap"]) * c["softcap"]
        if self.width > 1:
            return best_first_tree(self.model.to_target(logits), self.width * k)
        markov = self.model.markov_head if "markov_head" in self.model else None
        selector = self.model.candidate_selector if "candidate_selector" in self.model else None
        if selector is not None:
            ids, unary, projected = selector.candidates(logits, hidden)
        row = iter(range(1, k))

        def position_logits(previous: mx.array, i: int) -> mx.array:
            if selector is not None:
                return selector(previous, ids[i], unary[i], projected[i], logits.shape[-1])
            return self.model.to_target(logits[i:i + 1] + (markov(previous) if markov is not None else 0))

        draft = draft_autoregressively(position_logits(anchor, 0), lambda token: position_logits(token, next(row)),
                                       k, params, context, key, self.constrain)
        if "confidence_head" in self.model:  # DSpark: each position's chance of acceptance, for the policy's cut
            previous = mx.concatenate([anchor, draft.tokens[:-1]])
            draft.confidence = self.model.confidence_head(hidden, markov.markov_w1(previous))
            self.confidence.append(draft.confidence)
        return draft

    def report(self) -> str:
        """This generation's blocks: how many, how long of the most the drafter drafts, and DSpark's mean estimate
        of each position's acceptance (to read beside the measured one)."""
        if not self.blocks:
            return ""
        text = (f"{self.blocks} blocks of {self.block_drafts / self.blocks:.1f} drafts (at most "
                f"{self.model.config['drafts']}) from one drafter forward each")
        if self.confidence:
            rows = [c.tolist() for c in self.confidence]
            means = [sum(r[i] for r in rows if len(r) > i) / sum(len(r) > i for r in rows)
                     for i in range(max(map(len, rows)))]
            text += f"; estimated acceptance per position [{' '.join(f'{m:.0%}' for m in means)}]"
        return text

    def accept(self, context: list[int], accepted: int, step: Step) -> None:
        self.pending.append(step.hidden)  # the round's last token and accepted drafts


def features(pairing: Pairing) -> list[int]:
    """The target's hidden states a block drafter reads (the outputs of its target layers, as `hidden_reader`
    indices), after checking that it was trained for this target."""
    path, target = pairing.draft_path, pairing.target
    block = block_config(pairing.draft_config, path)
    text = target.config.get("text_config", target.config)
    layers, hidden, vocab = text["num_hidden_layers"], text["hidden_size"], vocab_size(target.config)
    ids = block["target_layer_ids"]
    trained = (block["hidden_size"], block["target_layers"] or layers, block["vocab_size"])  # speculators': no count
    if trained != (hidden, layers, vocab) or max(ids) >= layers:
        counted = f"{block['target_layers']} target layers" if block["target_layers"] else f"layer ids up to {max(ids)}"
        raise SpecError(f"the {block['kind']} drafter {path} (hidden size {block['hidden_size']}, "
                        f"{counted}, vocabulary {block['vocab_size']}) was not trained "
                        f"for {target.path} (hidden size {hidden}, {layers} layers, vocabulary {vocab}): use the "
                        "drafter published for this target (see models.toml)")
    if not 0 <= block["mask"] < vocab:
        raise SpecError(f"the {block['kind']} drafter {path}: its mask token {block['mask']} is outside the "
                        f"vocabulary of {vocab}: re-download the drafter")
    return [i + 1 for i in ids]


def build(pairing: Pairing, runner) -> BlockDrafter:
    check_memory(pairing.draft_path, None, what="block drafter")
    return BlockDrafter(load_block_drafter(pairing.draft_path, pairing.draft_config), pairing.target.model)


def tree_problem(pairing: Pairing, drafter: BlockDrafter) -> str | None:
    if drafter.name in ("dspark", "dflash2"):
        return f"{pairing.draft_path.name} is a {drafter.name} drafter: each draft depends on the one before"
    return None


KINDS = [Kind("block", build, recognises=lambda pairing: bool(block_kind(pairing.draft_config)), reads=features,
              max_draft_len=lambda pairing: min(block_config(pairing.draft_config, pairing.draft_path)["drafts"],
                                                MAX_DRAFT_LEN),
              tree_problem=tree_problem)]
