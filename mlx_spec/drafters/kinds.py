"""The one table of drafters: what `--drafter` accepts (the CLI, the chat, bench and loading read it), and for
each name the drafter modules whose kinds serve it (each module's `KINDS`, tried in order: the first that
recognises the checkpoints given builds the drafter). It imports nothing heavy, so the command line's help and
argument errors come without loading MLX or mlx-lm. Adding a drafter: its module in drafters/ (its drafter and
its `KINDS`), its network in models/ if it has weights, and its module's name in a line below."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DrafterKind:
    name: str
    help: str
    max_draft_len: int  # the adaptive policy's upper bound unless models.toml or the drafter's kind says otherwise
    modules: tuple[str, ...] = ()  # the modules of mlx_spec.drafters whose KINDS serve this name, in order
    trees: bool = False  # whether --tree-width applies (token trees, where the drafter and target allow them)


DRAFTERS = {kind.name: kind for kind in [
    DrafterKind("mtp", "the checkpoint's own multi-token prediction layer (Qwen 3.5 / 3.6, Qwen3-Next, DeepSeek-V3, "
                       "GLM-4.5+, GLM-4.7-Flash, MiMo, K-EXAONE)", 3, ("qwen_mtp",)),
    DrafterKind("draft-model", "a smaller model of the same vocabulary, a Gemma 4 assistant, Medusa or EAGLE-3 "
                               "heads, or a DFlash / DFlash2 / DSpark block drafter (--draft-model)", 8,
                ("gemma4_assistant", "medusa", "eagle3", "dflash", "draft_model"), trees=True),
    DrafterKind("ngram", "prompt lookup: continue as the prompt or output continued before; no extra memory", 6,
                ("ngram",), trees=True),
    DrafterKind("suffix", "suffix decoding: continue as this request and earlier ones (kept while the process "
                          "runs; across runs with --suffix-cache) continued most often; no weights", 8,
                ("suffix",), trees=True),
    DrafterKind("lookahead", "lookahead decoding: Jacobi trajectories run beside each verification fill an n-gram "
                             "pool; no extra weights (targets that verify token trees)", 4, ("lookahead",)),
    DrafterKind("off", "plain decoding", 0, trees=True),
]}
DEFAULT_ORDER = ("the draft model given with --draft-model, else the checkpoint's MTP layer when it has one, "
                 "else the draft model models.toml lists, else ngram")


def default_drafter(draft_model_given: bool, has_mtp: bool, listed_draft_model: bool) -> str:
    """The drafter used when none is chosen, in DEFAULT_ORDER."""
    if draft_model_given:
        return "draft-model"
    return "mtp" if has_mtp else "draft-model" if listed_draft_model else "ngram"
