"""The live panel: drafter and policy, acceptance, speed against plain decoding, memory and pressure."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Sparkline, Static

from mlx_spec.core.stats import Stats
from mlx_spec.seams.memory import MemoryReport

MIB = 2**20


class StatsPanel(VerticalScroll, can_focus=False):
    """Scrolls when the terminal is too short for all of it."""

    def compose(self) -> ComposeResult:
        yield Static("drafter: -", id="drafter", markup=False)
        yield Static("", id="acceptance", markup=False)
        yield Sparkline([], id="history")
        yield Static("", id="speed", markup=False)
        yield Static("", id="pressure", markup=False)
        yield Static("", id="memory", markup=False)

    def show_history(self, history: list[float]) -> None:
        """Tokens per target step of the latest rounds, live while a turn runs."""
        self.query_one("#history", Sparkline).data = history[-60:]

    def show(self, stats: Stats, history: list[float], plain_tps: float | None, memory: MemoryReport) -> None:
        self.query_one("#drafter", Static).update("\n".join([f"drafter: {stats.drafter}", stats.policy,
                                                             *stats.policy_reasons]))
        positions = " ".join(f"{a:.0%}" for a in stats.per_position_acceptance)
        self.query_one("#acceptance", Static).update(
            f"acceptance {stats.acceptance_rate:.1%} ({stats.accepted}/{stats.drafted})\n"
            f"{stats.mean_acceptance_length:.2f} tokens/step\nper position [{positions}]"
            + (f"\ntree: {stats.nodes / stats.rounds:.1f} nodes verified/round" if stats.nodes > stats.drafted else "")
            + (f"\n{stats.drafter_report}" if stats.drafter_report else "")
            if stats.rounds else "acceptance: after an answer")
        self.show_history(history)
        speed = f"{stats.decode_tps:.1f} tok/s decode" if stats.generated_tokens else "tok/s: after an answer"
        if not plain_tps:
            speed += "\n(speedup: a turn with F2 off)"
        elif stats.generated_tokens:
            speed += f", {stats.decode_tps / plain_tps:.2f}x plain"
        if stats.reused_prompt_tokens:
            speed += f"\n{stats.reused_prompt_tokens} of {stats.prompt_tokens} prompt tokens cached"
        if stats.image_tokens:
            speed += f"\n{stats.image_tokens} image tokens, prefill {stats.prefill_seconds:.2f} s"
        self.query_one("#speed", Static).update(speed)
        pressure = self.query_one("#pressure", Static)
        pressure.update(f"memory pressure: {memory.pressure}\n({memory.pressure_detail})"
                        + ("\nhigh pressure: speculation's extra memory may cost more than it gains"
                           if memory.high else ""))
        pressure.set_class(memory.high, "warning")
        self.query_one("#memory", Static).update(
            f"model {size(memory.weights)}, drafter {size(memory.drafter_weights)}\n"
            f"KV cache {size(memory.kv_cache)}\n"
            f"MLX active {size(memory.mlx_active)}, peak {size(memory.mlx_peak)}, cache {size(memory.mlx_cache)}\n"
            f"system {memory.system_available / 2**30:.1f} of {memory.system_total / 2**30:.1f} GiB free")


def size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / MIB:.1f} MiB" if n < 10 * MIB else f"{n / MIB:.0f} MiB"
