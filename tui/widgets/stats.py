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
        yield Static("drafter: -", id="drafter")
        yield Static("", id="acceptance")
        yield Sparkline([], id="history")
        yield Static("", id="speed")
        yield Static("", id="memory")
        yield Static("", id="pressure")

    def show(self, stats: Stats, history: list[float], plain_tps: float | None, memory: MemoryReport) -> None:
        self.query_one("#drafter", Static).update(f"drafter: {stats.drafter}\n{stats.policy}")
        positions = " ".join(f"{a:.0%}" for a in stats.per_position_acceptance)
        self.query_one("#acceptance", Static).update(
            f"acceptance {stats.acceptance_rate:.1%} ({stats.accepted}/{stats.drafted})\n"
            f"{stats.mean_acceptance_length:.2f} tokens/step\nper position [{positions}]")
        self.query_one("#history", Sparkline).data = history[-60:] or [0.0]
        speedup = (f", {stats.decode_tps / plain_tps:.2f}x plain" if plain_tps
                   else " (one turn with F2 off measures plain decoding)")
        self.query_one("#speed", Static).update(f"{stats.decode_tps:.1f} tok/s decode{speedup}")
        self.query_one("#memory", Static).update(
            f"weights {memory.weights / MIB:.0f} MiB, KV {memory.kv_cache / MIB:.1f} MiB\n"
            f"MLX active {memory.mlx_active / MIB:.0f}, peak {memory.mlx_peak / MIB:.0f}, "
            f"cache {memory.mlx_cache / MIB:.0f} MiB\n"
            f"system {memory.system_available / 2**30:.1f} of {memory.system_total / 2**30:.1f} GiB free")
        pressure = self.query_one("#pressure", Static)
        pressure.update(f"memory pressure: {memory.pressure} ({memory.pressure_detail})"
                        + ("\nhigh pressure: speculation's extra memory may cost more than it gains"
                           if memory.high else ""))
        pressure.set_class(memory.high, "warning")
