"""The live panel: drafter and policy, acceptance, speed against plain decoding, memory and pressure."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from mlx_spec.memory import MemoryReport
from mlx_spec.stats import Stats

MIB = 2**20


class StatsPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static("drafter: -", id="drafter", markup=False)
        yield Static("", id="acceptance", markup=False)
        yield Sparkline([], id="history")
        yield Static("", id="speed", markup=False)
        yield Static("", id="memory", markup=False)
        yield Static("", id="pressure", markup=False)

    def show(self, stats: Stats, history: list[float], plain_tps: float | None, memory: MemoryReport) -> None:
        self.query_one("#drafter", Static).update(f"drafter: {stats.drafter}\n{stats.policy}")
        positions = " ".join(f"{a:.0%}" for a in stats.per_position_acceptance)
        self.query_one("#acceptance", Static).update(
            f"acceptance {stats.acceptance_rate:.1%} ({stats.accepted}/{stats.drafted})\n"
            f"{stats.mean_acceptance_length:.2f} tokens/step\nper position [{positions}]")
        self.query_one("#history", Sparkline).data = history[-60:]
        speedup = (f", {stats.decode_tps / plain_tps:.2f}x plain" if plain_tps
                   else " (one turn with F2 off measures plain decoding)")
        cached = f", {stats.reused_prompt_tokens} of {stats.prompt_tokens} prompt tokens cached" \
            if stats.reused_prompt_tokens else ""
        self.query_one("#speed", Static).update(f"{stats.decode_tps:.1f} tok/s decode{speedup}{cached}")
        self.query_one("#memory", Static).update(
            f"weights: model {memory.weights / MIB:.0f} MiB, drafter {memory.drafter_weights / MIB:.1f} MiB\n"
            f"KV cache {memory.kv_cache / MIB:.1f} MiB\n"
            f"MLX active {memory.mlx_active / MIB:.0f}, peak {memory.mlx_peak / MIB:.0f}, "
            f"cache {memory.mlx_cache / MIB:.0f} MiB\n"
            f"system {memory.system_available / 2**30:.1f} of {memory.system_total / 2**30:.1f} GiB free")
        pressure = self.query_one("#pressure", Static)
        pressure.update(f"memory pressure: {memory.pressure} ({memory.pressure_detail})"
                        + ("\nhigh pressure: speculation's extra memory may cost more than it gains"
                           if memory.high else ""))
        pressure.set_class(memory.high, "warning")
