"""Memory the user should know about: what MLX holds, and how hard the whole system is pressed."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import psutil
from mlx.utils import tree_flatten

from .caches import held_bytes


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
    prompt_cache: int = 0  # the sequences the prompt cache keeps besides the live one (`Engine.cache_prompts`)
    prompt_cache_budget: int = 0  # what they may take

    @property
    def high(self) -> bool:
        return self.pressure != "normal"


def parameter_bytes(module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(module.parameters())) if module is not None else 0


def cache_bytes(caches) -> int:
    return held_bytes([cache.state for cache in caches or []])


# Thresholds: see classify_pressure's docstring for why these values.
CRITICAL_AVAILABLE = 0.05  # fraction of memory available (Linux MemAvailable, or psutil elsewhere)
WARN_AVAILABLE = 0.15
CRITICAL_FULL_10, CRITICAL_FULL_60 = 40.0, 20.0  # PSI "full": % of wall time all non-idle tasks stalled
WARN_FULL_10, WARN_FULL_60 = 10.0, 5.0
WARN_SOME_60 = 50.0  # PSI "some", sustained over a minute
MACOS_LEVELS = {1: "normal", 2: "warn", 4: "critical"}  # kern.memorystatus_vm_pressure_level


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """/proc/pressure/memory's lines, e.g. "some avg10=5.50 avg60=1.20 avg300=0.30 total=123456", as
    {"some": {"avg10": 5.5, ...}, "full": {...}}; a line that is missing or unreadable is left out."""
    lines = {}
    for line in text.splitlines():
        kind, *fields = line.split() or [""]
        try:
            lines[kind] = {k: float(v) for k, v in (f.split("=", 1) for f in fields)}
        except ValueError:
            continue
    return lines


def classify_pressure(available: float, psi: str | None = None, macos_level: int | None = None) -> tuple[str, str]:
    """("normal" | "warn" | "critical", a short explanation) from the readings alone, so it is testable.

    available: the fraction of memory available to new allocations without swapping (0..1); psi: the text of
    Linux's /proc/pressure/memory, or None; macos_level: `sysctl kern.memorystatus_vm_pressure_level`, or None.

    - macOS: the kernel's own level is the answer. 1 (normal) means no pressure; 2 (warn) means the system is
      compressing and swapping memory and asks applications to give some back; 4 (critical) means it is about
      to kill processes (jetsam). psutil's "available" on macOS leaves out much reclaimable memory, so it is
      shown but not judged there.
    - Linux PSI (Documentation/accounting/psi.rst): `some` is the share of wall time in which at least one task
      was stalled waiting for memory, `full` the share in which all non-idle tasks were stalled at once, i.e.
      no useful work was done. Short `some` bursts are normal on a healthy machine (reclaiming page cache, say
      while a model's weights are read), so `some` counts only when it lasts: 50% or more over 60 s warns.
      `full` is lost throughput: warn from 10% over 10 s or 5% over 60 s, critical from 40% over 10 s or 20%
      over 60 s (thrashing; systemd-oomd's default limit, when it starts killing, is 60% for 30 s).
    - Available memory, on every system but macOS: below 15% warns (the kernel is about to reclaim hard or
      swap, and speculation's extra KV cache and drafter weights compete for what is left), below 5% is
      critical. Linux's MemAvailable counts reclaimable page cache as available, so a full page cache is not
      pressure.

    The worst of the applicable signals wins. Example: 98% available with PSI some avg10 5.5% is "normal"."""
    detail = f"{available:.0%} available"
    if macos_level is not None and macos_level in MACOS_LEVELS:
        return MACOS_LEVELS[macos_level], f"macOS pressure level {macos_level}, {detail}"
    levels, reasons = ["normal"], []

    def flag(level: str, reason: str) -> None:
        levels.append(level)
        reasons.append(reason)

    if available < CRITICAL_AVAILABLE:
        flag("critical", f"under {CRITICAL_AVAILABLE:.0%} available")
    elif available < WARN_AVAILABLE:
        flag("warn", f"under {WARN_AVAILABLE:.0%} available")
    lines = parse_psi(psi) if psi else {}
    some, full = lines.get("some", {}), lines.get("full", {})
    if some or full:
        detail += f"; PSI 10 s: some {some.get('avg10', 0.0):.1f}%, full {full.get('avg10', 0.0):.1f}%"
    full10, full60, some60 = full.get("avg10", 0.0), full.get("avg60", 0.0), some.get("avg60", 0.0)
    if full10 >= CRITICAL_FULL_10 or full60 >= CRITICAL_FULL_60:
        flag("critical", f"all tasks stalled on memory {max(full10, full60):.0f}% of the time")
    elif full10 >= WARN_FULL_10 or full60 >= WARN_FULL_60:
        flag("warn", f"all tasks stalled on memory {max(full10, full60):.0f}% of the time")
    elif some60 >= WARN_SOME_60:
        flag("warn", f"tasks stalled on memory {some60:.0f}% of the last minute")
    level = max(levels, key=["normal", "warn", "critical"].index)
    return level, "; ".join([detail, *reasons])


def pressure() -> tuple[str, str]:
    """The system's memory pressure now: reads macOS's level, Linux's PSI and available memory, and lets
    `classify_pressure` judge them."""
    vm = psutil.virtual_memory()
    macos_level = psi = None
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "kern.memorystatus_vm_pressure_level"], capture_output=True,
                                 text=True, timeout=2).stdout.strip()
            macos_level = int(out) if out.isdigit() else None
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        psi = Path("/proc/pressure/memory").read_text()
    except OSError:  # not Linux, a kernel without PSI, or PSI turned off (psi=0): reading fails
        pass
    return classify_pressure(vm.available / vm.total if vm.total else 1.0, psi, macos_level)


def report(engine) -> MemoryReport:
    """A snapshot for an Engine: its weights (a vision tower's once an image loaded it) and caches, MLX's
    allocator, and the system."""
    drafter, vision = engine.drafter, engine.vision
    kv = cache_bytes(engine.target.cache) + cache_bytes(drafter and drafter.caches)
    vm = psutil.virtual_memory()
    level, detail = pressure()
    stored = engine.prompt_cache
    weights = parameter_bytes(engine.target.model) + parameter_bytes(vision and vision.tower)
    return MemoryReport(weights, parameter_bytes(drafter and drafter.weights), kv,
                        mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory(),
                        vm.available, vm.total, level, detail, stored.nbytes if stored else 0,
                        stored.budget if stored else 0)
