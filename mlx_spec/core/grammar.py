"""Constrained decoding: a JSON schema, any JSON object, a regular expression or a Lark grammar, through
llguidance (Rust; wheels for macOS arm64 and Linux; what llama.cpp, vLLM and SGLang use). Chosen over xgrammar,
which needs PyTorch (and Triton on Linux) for its masks, and outlines-core, which compiles regular languages only
(no recursive JSON): llguidance masks any context-free grammar in tens of microseconds a token and rolls back,
which masking the positions along a run of drafts needs.

Exactness under speculation: at every verified position the target's logits are masked by the grammar state
reached along that position's own path (the drafts before it, or a tree node's ancestors), so greedy output
equals plain constrained decoding token for token and sampled output follows the masked target exactly.
"""

from __future__ import annotations

import functools
import json

import mlx.core as mx
import numpy as np

from ..seams.errors import SpecError

KINDS = ("json_schema", "json_object", "regex", "lark")
FORCED_MOST = 16  # the most tokens a round drafts of the text a grammar forces
# JSON without free whitespace between tokens (`{"a": 1, "b": [2]}`): small models otherwise loop on blank lines
# inside an object; a schema's own "x-guidance" options override it
JSON_OPTIONS = {"whitespace_flexible": False}


def grammar_text(kind: str, value) -> str:
    """llguidance's grammar for a constraint; a SpecError naming what is wrong with it."""
    import llguidance

    if kind not in KINDS:
        raise SpecError(f"unknown constraint {kind!r}: choose one of {', '.join(KINDS)}")
    try:
        if kind in ("json_object", "json_schema"):
            if kind == "json_schema" and not isinstance(value, (dict, bool)):
                raise SpecError("a JSON schema must be an object")
            return llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps({"type": "object"} if kind == "json_object" else value), defaults=JSON_OPTIONS)
        if not isinstance(value, str) or not value:
            raise SpecError(f"a {kind} constraint must be non-empty text")
        return (llguidance.LLMatcher.grammar_from_regex if kind == "regex" else
                llguidance.LLMatcher.grammar_from_lark)(value)
    except ValueError as e:
        raise SpecError(f"the {kind.replace('_', ' ')} cannot be used: {first_line(str(e))}") from None


def first_line(message: str) -> str:
    return message.strip().splitlines()[0][:300] if message.strip() else "no reason given"


@functools.lru_cache(maxsize=4)
def ll_tokenizer(tokenizer):
    """llguidance's view of a tokenizer (up to a second to build: kept per tokenizer)."""
    import llguidance.hf

    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    return llguidance.hf.from_tokenizer(hf, eos_token=sorted(end_tokens(tokenizer)))


def end_tokens(tokenizer) -> set[int]:
    return set(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])


class Grammar:
    """One generation's constraint: `masked(logits, drafts)` masks the target's rows at the positions after
    each prefix of `drafts`, `masked_tree` those of a tree's nodes, `advance(tokens)` commits what was emitted."""

    def __init__(self, tokenizer, kind: str, value, what: str | None = None):
        """`kind` one of KINDS and its `value` (a schema, a regular expression, a Lark grammar; ignored for
        json_object); a SpecError when it cannot be used, naming it as `what` says (default: its kind)."""
        import llguidance

        text = grammar_text(kind, value)
        self.source = (kind, value)  # what builds it again (another rank's, over its own tokenizer)
        self.tokenizer = ll_tokenizer(tokenizer)
        failed, problems = llguidance.LLMatcher.validate_grammar_with_warnings(text, self.tokenizer)
        if failed:
            raise SpecError(f"{what or 'the ' + kind.replace('_', ' ')} cannot be used: {first_line(problems[0])}")
        self.matcher = llguidance.LLMatcher(self.tokenizer, text, log_level=0)
        self.vocab = self.tokenizer.vocab_size
        self.words, self.eos = (self.vocab + 31) // 32, end_tokens(tokenizer)

    def allowed(self, prefixes: list[list[int]]) -> mx.array:
        """(len(prefixes), vocab) bool: what may come after the committed tokens + each prefix (a prefix the
        grammar rejects allows everything after it: its own position rejects it already)."""
        bits = np.zeros((len(prefixes), self.words), dtype=np.int32)
        for row, prefix in enumerate(prefixes):
            taken = self.matcher.try_consume_tokens(prefix) if prefix else 0
            if taken == len(prefix) and not self.matcher.is_error():
                self.matcher.unsafe_compute_mask_ptr(bits[row].ctypes.data, bits[row].nbytes)
            else:
                bits[row] = -1
            if taken:
                self.matcher.rollback(taken)
        unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :self.vocab]
        return mx.array(unpacked.astype(bool))

    def masked(self, logits: mx.array, drafts: list[int]) -> mx.array:
        """The rows of `logits` (one per position: after the committed tokens, then after each draft) masked."""
        return self.masked_tree(logits, [drafts[:j] for j in range(logits.shape[0])])

    def masked_tree(self, logits: mx.array, prefixes: list[list[int]]) -> mx.array:
        """Row i of `logits` masked by what may follow prefixes[i]; tokens past the tokenizer's are never
        allowed."""
        allowed, width = self.allowed(prefixes), logits.shape[-1]
        if width > self.vocab:
            allowed = mx.concatenate([allowed, mx.zeros((len(prefixes), width - self.vocab), dtype=mx.bool_)], 1)
        return mx.where(allowed[:, :width], logits, -mx.inf)

    def forced(self, prefix: list[int], most: int = FORCED_MOST) -> list[int]:
        """Up to `most` tokens of the text the grammar forces after the committed tokens + `prefix` (keys,
        punctuation, a tool call's wrapper), as the tokenizer writes it: drafts the masked target takes unless it
        writes that text in other tokens (llguidance's forced tokens are the few it must take)."""
        if most <= 0:
            return []
        taken = self.matcher.try_consume_tokens(prefix) if prefix else 0
        text = (self.matcher.compute_ff_bytes() if taken == len(prefix) and not self.matcher.is_error()
                and not self.matcher.is_stopped() else b"")
        if taken:
            self.matcher.rollback(taken)
        return self.tokenizer.tokenize_bytes(text)[:most] if text else []

    def valid_prefix(self, drafts: list[int]) -> int:
        """How many of `drafts` the grammar takes from here."""
        return self.matcher.validate_tokens(drafts)

    def advance(self, tokens: list[int]) -> None:
        """Commit emitted tokens (an end-of-sequence token the grammar no longer expects is not an error)."""
        for token in tokens:
            if self.matcher.is_stopped() and token in self.eos:
                return
            if not self.matcher.consume_token(token):
                raise SpecError(f"internal error: token {token} breaks the grammar ({self.matcher.get_error()})")
