"""Counters and timings of a generation, and the metrics users read (names as vLLM / llama.cpp use them); the
seconds of a round's parts (`RoundCosts`, for `bench`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx


@dataclass
class Stats:
    drafter: str = "off"
    policy: str = ""  # the draft-length policy's last decision and why
    policy_reasons: list[str] = field(default_factory=list)  # the adaptive policy's figures behind it (`explain`)
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # of those, already in the cache from the previous generation
    image_tokens: int = 0  # of those, the images' (a vision-language model's)
    generated_tokens: int = 0
    rounds: int = 0  # target forward passes after the prefill
    drafted: int = 0  # drafted positions (a tree counts its depth)
    accepted: int = 0
    nodes: int = 0  # drafted tokens verified (a tree's nodes, a chain's length)
    position_drafted: list[int] = field(default_factory=list)  # rounds that drafted position j
    position_accepted: list[int] = field(default_factory=list)  # rounds that accepted position j
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    peak_memory: int = 0
    active_memory: int = 0
    drafter_report: str = ""  # figures of the drafter's own (lookahead: its n-gram pool)
    batch_size: int = 1  # the most sequences decoded together with this one (batched decoding)
    prediction: tuple[int, int] | None = None  # a predicted output's tokens accepted as drafts, and the rest
    forced: tuple[int, int] | None = None  # drafts of the text a grammar forced, and those accepted

    def record_round(self, verdict) -> None:
        """Count a finished round (an engine `Round`)."""
        draft_len, accepted = verdict.draft_len, verdict.accepted
        self.rounds += 1
        self.drafted += draft_len
        self.accepted += accepted
        self.nodes += verdict.nodes
        grow = draft_len - len(self.position_drafted)
        if grow > 0:
            self.position_drafted += [0] * grow
            self.position_accepted += [0] * grow
        for j in range(draft_len):
            self.position_drafted[j] += 1
            self.position_accepted[j] += j < accepted

    def record_memory(self) -> None:
        self.active_memory = mx.get_active_memory()
        self.peak_memory = max(self.peak_memory, mx.get_peak_memory())

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted positions (a tree's depth: the fraction of the deepest path)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per target forward (tau = 1 + accepted / rounds)."""
        return 1 + self.accepted / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted)]

    @property
    def prefill_tps(self) -> float:
        ran = self.prompt_tokens - self.reused_prompt_tokens
        return ran / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def to_dict(self) -> dict:
        names = ["drafter", "policy", "policy_reasons", "prompt_tokens", "reused_prompt_tokens", "image_tokens",
                 "generated_tokens", "rounds", "drafted", "accepted", "nodes", "acceptance_rate",
                 "mean_acceptance_length", "per_position_acceptance", "prefill_tps", "decode_tps", "prefill_seconds",
                 "decode_seconds", "peak_memory", "active_memory", "drafter_report", "batch_size", "prediction",
                 "forced"]
        return {name: getattr(self, name) for name in names}

    def summary(self) -> str:
        line = (f"{self.generated_tokens} tokens, {self.decode_tps:.1f} tok/s decode, "
                f"{self.prefill_tps:.1f} tok/s prefill ({self.prompt_tokens} prompt tokens"
                f"{f', {self.reused_prompt_tokens} cached' if self.reused_prompt_tokens else ''})")
        if self.drafter != "off":
            positions = " ".join(f"{a:.0%}" for a in self.per_position_acceptance)
            line += (f" | {self.drafter}: acceptance {self.acceptance_rate:.1%} "
                     f"({self.accepted}/{self.drafted}), {self.mean_acceptance_length:.2f} tokens/step, "
                     f"per position [{positions}]"
                     + (f", {self.nodes / self.rounds:.1f} tree nodes/round" if self.nodes > self.drafted else "")
                     + (f", {self.drafter_report}" if self.drafter_report else "")
                     + (f", forced by the grammar {self.forced[1]}/{self.forced[0]}" if self.forced else "")
                     + f"; {self.policy}")
        else:
            line += " | drafting off"
        return line + f" | peak memory {self.peak_memory / 2**20:.0f} MiB"


@dataclass
class RoundCosts:
    """Seconds of a round's parts, each evaluated on its own (`Engine.profile`)."""

    verify: dict[int, float]  # k -> the target's forward over the last token and k drafts (k = 0: a plain step)
    draft: dict[int, float]  # k -> the drafter proposing k tokens

    def relative(self, k: float) -> float:
        """k c + v(k): a round with k drafts in plain steps; a fractional k (a policy's mean) interpolates
        between the lengths measured."""
        lengths = sorted(self.verify)
        below = max((n for n in lengths if n <= k), default=lengths[0])
        above = min((n for n in lengths if n >= k), default=lengths[-1])
        cost = {n: self.verify[n] + self.draft.get(n, 0.0) for n in (below, above)}
        share = (k - below) / (above - below) if above > below else 0.0
        return (cost[below] + share * (cost[above] - cost[below])) / self.verify[0]

    def bound(self, draft_len: float, tokens_per_round: float) -> float:
        """E[N] / (k c + v(k)): the speedup over plain decoding that rounds of `draft_len` drafts emitting
        `tokens_per_round` tokens reach when only the draft and the verify forward take time."""
        return tokens_per_round / self.relative(draft_len)
