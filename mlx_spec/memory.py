"""Memory the user should know about: what MLX holds, and how hard the whole system is pressed."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import psutil
from mlx.utils import tree_flatten


@dataclass
class MemoryReport:
    weights: int  # bytes of the target's parameters
    drafter_weights: int  # bytes of the drafter's own parameters (an MTP layer, a draft model, an assistant)
    kv_cache: int  # the target's and the drafter's caches
    mlx_active: int
    mlx_peak: int
    mlx_cache: int
    system_available: int
    system_total: int
    pressure: str  # "normal", "warn" or "critical"
    pressure_detail: str

    @property
    def high(self) -> bool:
        return self.pressure != "normal"


def parameter_bytes(module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(module.parameters())) if module is not None else 0


def cache_bytes(caches) -> int:
    total = 0
    for cache in caches or []:
        total += sum(x.nbytes for _, x in tree_flatten(cache.state) if isinstance(x, mx.array))
    return total


def pressure() -> tuple[str, str]:
    """The system's memory pressure: macOS's own level, Linux's PSI, else available memory."""
    vm = psutil.virtual_memory()
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "kern.memorystatus_vm_pressure_level"], capture_output=True,
                                 text=True, timeout=2).stdout.strip()
            level = {"1": "normal", "2": "warn", "4": "critical"}.get(out)
            if level:
                return level, f"macOS pressure level {out}"
        except (OSError, subprocess.SubprocessError):
            pass
    psi = Path("/proc/pressure/memory")
    if psi.exists():
        some = dict(kv.split("=") for kv in psi.read_text().splitlines()[0].split()[1:])
        stalled = float(some["avg10"])
        level = "critical" if stalled > 20 else "warn" if stalled > 5 else "normal"
        if vm.percent > 95:
            level = "critical"
        return level, f"PSI {stalled:.1f}% stalled (10 s), {100 - vm.percent:.0f}% available"
    level = "critical" if vm.percent > 95 else "warn" if vm.percent > 85 else "normal"
    return level, f"{100 - vm.percent:.0f}% available"


def report(engine) -> MemoryReport:
    """A snapshot for an Engine: its weights and caches, MLX's allocator, and the system."""
    drafter = engine.drafter
    kv = cache_bytes(engine.target.cache) + cache_bytes(getattr(drafter, "caches", None))
    vm = psutil.virtual_memory()
    level, detail = pressure()
    return MemoryReport(parameter_bytes(engine.target.model), parameter_bytes(getattr(drafter, "weights", None)), kv,
                        mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory(),
                        vm.available, vm.total, level, detail)
