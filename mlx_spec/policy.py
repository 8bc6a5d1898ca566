"""How many tokens to draft next round."""

from __future__ import annotations


class FixedDraftLength:
    """Always `draft_len` (0 is plain decoding), never more than the tokens still wanted."""

    def __init__(self, draft_len: int):
        self.draft_len = draft_len

    def next_draft_len(self, remaining: int) -> int:
        return max(0, min(self.draft_len, remaining - 1))
