"""SVG snapshots of the chat screen (pytest-textual-snapshot): start-up at the terminal sizes users run it in
(80x24 included: the narrow layout), and a finished turn with accepted drafts coloured.

The pictures must not depend on when they are taken or how busy the machine is: the app runs `steady` (no
blinking cursor), memory figures and timings are fixed, the turn is greedy and waited for until it is over.
`pytest --snapshot-update` rewrites them after a deliberate change; look at them before committing."""

import dataclasses

import pytest

import mlx_spec
from mlx_spec.seams.memory import MemoryReport
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.tui.app import ChatApp

MIB = 2**20
SIZES = {"80x24": (80, 24), "100x30": (100, 30), "200x50": (200, 50)}


@pytest.fixture(autouse=True)
def report_outside_the_repository(request, tmp_path_factory):
    """The plugin writes its HTML report of mismatches to ./snapshot_report.html unless told otherwise: put it
    in pytest's temporary directory (the summary prints where) unless --snapshot-report chose a place."""
    if request.config.option.snapshot_report == "snapshot_report.html":
        request.config.option.snapshot_report = str(tmp_path_factory.getbasetemp() / "snapshot_report.html")


def fixed_memory(engine) -> MemoryReport:
    return MemoryReport(weights=3 * MIB, drafter_weights=MIB // 2, kv_cache=MIB // 4, mlx_active=4 * MIB,
                        mlx_peak=6 * MIB, mlx_cache=MIB, system_available=12 * 2**30, system_total=24 * 2**30,
                        pressure="normal", pressure_detail="50% available; PSI 10 s: some 0.0%, full 0.0%")


@pytest.fixture
def app(tiny):
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny["qwen3-draft"]), draft_len=3)  # pinned
    engine.tokenizer.eos_token_ids = []  # a random model may end at once; keep the picture full
    return ChatApp(engine, SamplingParams(), 40, "tiny qwen3 + layer-skip draft", memory_report=fixed_memory,
                   steady=True)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_start_up(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size)


async def finish_a_turn(pilot):
    app = pilot.app
    await pilot.click("#prompt")
    await pilot.press(*"def add(a, b):", "enter")
    for _ in range(6000):
        await pilot.pause(0.05)
        if not app.screen.generating:
            break
    else:
        raise AssertionError("the turn did not finish in 300 s")
    screen = app.screen
    timed = dataclasses.replace(screen.last_stats, prefill_seconds=0.01, decode_seconds=0.5)
    screen.notify_stats(timed)
    await pilot.pause()


@pytest.mark.parametrize("size", [SIZES["80x24"], SIZES["100x30"]], ids=["80x24", "100x30"])
def test_finished_turn(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size, run_before=finish_a_turn)
