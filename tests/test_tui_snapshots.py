"""SVG snapshots of the chat screen (pytest-textual-snapshot): start-up at the two terminal sizes users run
it in, and a finished turn with accepted drafts coloured. Machine-dependent figures (memory, timings) are
fixed so that the pictures compare exactly; `pytest --snapshot-update` rewrites them after a deliberate change."""

import dataclasses

import pytest

import mlx_spec
from mlx_spec.memory import MemoryReport
from mlx_spec.sampling import SamplingParams
from tui.app import ChatApp

MIB = 2**20


def fixed_memory(engine) -> MemoryReport:
    return MemoryReport(weights=3 * MIB, drafter_weights=MIB // 2, kv_cache=MIB // 4, mlx_active=4 * MIB,
                        mlx_peak=6 * MIB, mlx_cache=MIB, system_available=12 * 2**30, system_total=24 * 2**30,
                        pressure="normal", pressure_detail="PSI 0.0% stalled (10 s), 50% available")


@pytest.fixture
def app(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), draft_len=3)  # pinned
    engine.tokenizer.eos_token_ids = []  # a random model may end at once; keep the picture full
    return ChatApp(engine, SamplingParams(), 40, "tiny qwen3 + layer-skip draft", memory_report=fixed_memory)


@pytest.mark.parametrize("size", [(100, 30), (200, 50)])
def test_start_up(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size)


def test_finished_turn(app, snap_compare):
    async def ask(pilot):
        await pilot.click("#prompt")
        await pilot.press(*"def add(a, b):", "enter")
        for _ in range(1200):
            await pilot.pause(0.05)
            if not app.screen.generating:
                break
        screen = app.screen
        timed = dataclasses.replace(screen.last_stats, prefill_seconds=0.01, decode_seconds=0.5)
        screen.notify_stats(timed)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 30), run_before=ask)
