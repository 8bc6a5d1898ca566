"""`mlx-spec chat` driven by Textual's pilot on a tiny hybrid model with its MTP drafter and, with `--server`, on
a real `mlx-spec serve` in a subprocess; and the memory-pressure classification the panel shows."""

import asyncio
import os
import re
import signal
import subprocess
import sys

import pytest
from helpers import KEY, assert_one_line_error, free_port, run_cli, start_server
from tiny_block import random_block_drafter

import mlx_spec
from mlx_spec.serve.client import RemoteEngine
from mlx_spec.core.events import Round
from mlx_spec.seams.memory import classify_pressure, parse_psi
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.tui.app import ChatApp
from mlx_spec.tui.widgets.message import MessageView


async def ask(app, pilot, text):
    await pilot.click("#prompt")
    await pilot.press(*text, "enter")
    await pilot.pause()


async def wait_for(pilot, condition, what, limit=60.0):
    for _ in range(int(limit / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"{what} did not happen within {limit} s")


async def wait_done(app, pilot, limit=60.0):
    await wait_for(pilot, lambda: not app.screen.generating, "the end of the answer", limit)


def views(app, role):
    return [v for v in app.screen.query(MessageView) if v.role == role]


def panel(app, part):
    return str(app.screen.query_one(f"#{part}").render())


def record_rounds(engine) -> list[int]:
    """The draft length of every round `engine` runs from now on (the chat's worker thread calls `stream`)."""
    rounds, stream = [], engine.stream

    def recording(*args, **kwargs):
        for event in stream(*args, **kwargs):
            if isinstance(event, Round):
                rounds.append(event.draft_len)
            yield event
    engine.stream = recording
    return rounds


LONG_ANSWER = 2000  # tokens: an answer stopped long before its end (the tiny models' context is 4096)


@pytest.fixture
def engine(tiny):
    engine = mlx_spec.load(str(tiny["qwen3_5"]))
    engine.tokenizer.eos_token_ids = []  # a random model may end any answer at once; keep them going
    return engine


def test_a_turn_streams_and_updates_the_statistics(engine, tmp_path):
    async def run():
        app = ChatApp(engine, SamplingParams(), 24, "tiny", transcript_dir=str(tmp_path))
        async with app.run_test(size=(100, 30)) as pilot:
            await ask(app, pilot, "hello")
            await wait_done(app, pilot)
            answer = views(app, "assistant")[-1]
            assert answer.text and answer.status == "max_tokens"
            assert panel(app, "acceptance").startswith("acceptance")
            assert "tok/s decode" in panel(app, "speed")
            assert "memory pressure" in panel(app, "pressure")
            # why the adaptive policy drafts what it drafts: each length's expected speed, acceptance, round costs
            assert "\nchains: k=1 " in panel(app, "drafter") and "a round costs k=1 " in panel(app, "drafter")
            assert app.screen.history  # one entry per round
            first_prompt = app.screen.last_stats.prompt_tokens
            await ask(app, pilot, "and again")  # a second turn, with the first in the chat history
            await wait_done(app, pilot)
            assert len(views(app, "assistant")) == 2 and len(app.screen.messages) == 4
            # the first turn's prompt and answer were not prefilled again
            assert app.screen.last_stats.reused_prompt_tokens >= first_prompt + 24 - 1
            assert "prompt tokens cached" in panel(app, "speed")
            await pilot.press("ctrl+s")
            saved = list(tmp_path.glob("mlx-spec-chat-*.md"))
            answer = views(app, "assistant")[-1]
            assert saved and "**user:** hello" in saved[0].read_text()
            fence = "`" * max(3, 1 + max(map(len, re.findall("`+", answer.text)), default=0))
            assert f"**model:** [max_tokens]\n{fence}\n{answer.text}\n{fence}\n" in saved[0].read_text()
            await pilot.press("ctrl+n")  # a new chat: not the last one's figures
            assert not views(app, "assistant") and "cached" not in panel(app, "speed")
            assert panel(app, "acceptance") == "acceptance: after an answer"
            engine.next_policy.draft_len = 0  # as when the adaptive policy has measured that drafting does not pay
            await pilot.press("f5")  # one more than the adaptive policy drafts now: 1, not past its maximum
            assert engine.status().draft_len == 1
    asyncio.run(run())


def test_a_stopped_turn_shows_its_own_statistics(engine):
    """Esc ends the answer after the current round (engine.stop) and the panel shows that turn's drafter and
    speed, also after F8 switched the drafter (once it showed `drafter: off, 0.0 tok/s`, or the last turn's)."""
    async def stop_a_long_turn(app, pilot, prompt):
        await ask(app, pilot, prompt)
        await wait_for(pilot, lambda: views(app, "assistant")[-1].text, "the first text")
        await pilot.press("escape")
        await wait_done(app, pilot)
        answer = views(app, "assistant")[-1]
        assert answer.status == "stopped" and answer.text
        assert app.screen.messages[-1] == {"role": "assistant", "content": answer.text}
        stats = app.screen.last_stats
        assert 0 < stats.generated_tokens < LONG_ANSWER and stats.decode_tps > 0 and stats.rounds > 0
        assert panel(app, "speed").startswith(f"{stats.decode_tps:.1f} tok/s decode")
        assert not panel(app, "speed").startswith("0.0 tok/s")
        assert panel(app, "drafter").startswith(f"drafter: {stats.drafter}\n")
        return stats

    engine.pin(2)  # drafting from the first round: the adaptive policy starts with a plain step, and Esc may
    # come after one round

    async def run():
        app = ChatApp(engine, SamplingParams(), LONG_ANSWER, "tiny")
        async with app.run_test(size=(100, 30)) as pilot:
            first = await stop_a_long_turn(app, pilot, "go on forever")
            assert first.drafter == "mtp" and first.drafted > 0
            await pilot.press("f8")
            assert app.engine.status().drafter == "ngram"
            second = await stop_a_long_turn(app, pilot, "and on")
            assert second is not first and second.drafter == "ngram"
            assert second.prompt_tokens > first.prompt_tokens + first.generated_tokens - 1  # this turn's own
            # Esc pressed with Enter, possibly before the worker even began the stream: not lost
            await pilot.click("#prompt")
            await pilot.press(*"stop at once", "enter", "escape")
            await wait_done(app, pilot)
            assert views(app, "assistant")[-1].status == "stopped"
            assert app.screen.last_stats.generated_tokens < LONG_ANSWER
    asyncio.run(run())


def test_keys_during_generation_act_from_the_next_round(engine):
    """F2/F4/F5 only `pin` the running engine (thread-safe): the turn's later rounds use the new length; F8 and
    Ctrl+N wait for the answer to end, so no key swaps the engine under the generation thread."""
    rounds = record_rounds(engine)
    top = engine.status().max_draft_len

    async def press_then_check(pilot, key, draft_len):
        await pilot.press(key)
        assert app.engine.status().draft_len == draft_len  # at once, for the next round
        pressed = len(rounds)  # rounds[pressed] may have begun before the key: it keeps the old length
        await wait_for(pilot, lambda: len(rounds) >= pressed + 4, "four more rounds")
        assert set(rounds[pressed + 1:]) == {draft_len}, (key, rounds[pressed:])

    app = ChatApp(engine, SamplingParams(), LONG_ANSWER, "tiny")

    async def run():
        async with app.run_test(size=(100, 30)) as pilot:
            app.screen.set_draft_len(top)  # pinned (from the adaptive policy F5 adds one to what it drafts now,
            # which changes round by round: test_a_turn_streams_and_updates_the_statistics)
            await ask(app, pilot, "a long answer")
            await wait_for(pilot, lambda: len(rounds) >= 3, "three rounds")
            await press_then_check(pilot, "f5", top + 1)
            await press_then_check(pilot, "f4", top)
            await press_then_check(pilot, "f2", 0)  # speculation off
            await press_then_check(pilot, "f2", top)  # back on, to the length it had
            await pilot.press("f8", "ctrl+n")
            assert app.engine is engine and app.screen.messages and app.screen.generating
            await pilot.press("escape")
            await wait_done(app, pilot)
            stats = app.screen.last_stats
            assert stats.drafter == "mtp" and len(stats.position_drafted) == top + 1  # the pinned F5 length ran
            assert stats.rounds == len(rounds)
            await pilot.press("f8")  # between answers it switches
            assert app.engine is not engine and app.engine.status().drafter == "ngram"
    asyncio.run(run())


def test_keys_change_speculation_temperature_and_chat(engine):
    async def run():
        app = ChatApp(engine, SamplingParams(), 16, "tiny")
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("f2")
            assert engine.status().draft_len == 0
            await ask(app, pilot, "hi")
            await wait_done(app, pilot)
            assert app.screen.plain_tps  # a turn without speculation measured plain decoding
            await pilot.press("f2")
            assert engine.status().draft_len is None  # back to adaptive, as before F2
            await pilot.press("f5")
            status = engine.status()
            assert status.policy.endswith("(pinned)") and status.draft_len == status.max_draft_len + 1
            await pilot.press("f7", "f7")
            assert app.params.temperature == pytest.approx(0.2)
            await pilot.press("f3")
            assert not views(app, "assistant")[-1].colour_drafts
            assert type(views(app, "assistant")[-1].content).__name__ == "Group"  # rendered as Markdown
            await pilot.press("ctrl+n")
            await pilot.pause()
            assert not app.screen.messages and not list(app.screen.query(MessageView))
    asyncio.run(run())


def test_errors_appear_in_the_interface(engine):
    async def run():
        app = ChatApp(engine, SamplingParams(), 0, "tiny")  # max_tokens 0: the engine refuses
        async with app.run_test(size=(100, 30)) as pilot:
            await ask(app, pilot, "hello")
            await wait_done(app, pilot)
            errors = views(app, "error")
            assert errors and "max_tokens must be >= 1" in errors[0].text
            assert not app.screen.messages  # the failed turn is not kept
    asyncio.run(run())


def test_f8_switches_drafter_on_the_same_weights(engine):
    async def run():
        app = ChatApp(engine, SamplingParams(), 12, "tiny")
        async with app.run_test(size=(100, 30)) as pilot:
            assert "drafter 0.0 MiB" not in panel(app, "memory")  # the MTP layer
            names = []
            for _ in range(4):
                await pilot.press("f8")
                names.append(app.engine.status().drafter)
                assert app.engine.target.model is engine.target.model  # loaded once, shared
            assert names == ["ngram", "suffix", "off", "mtp"]
            await pilot.press("f8")
            assert "drafter: ngram" in panel(app, "drafter")
            assert "drafter 0.0 MiB" in panel(app, "memory")
            await ask(app, pilot, "hi")
            await wait_done(app, pilot)
            assert views(app, "assistant")[-1].text and app.screen.last_stats.drafter == "ngram"
    asyncio.run(run())


def test_the_layout_fits_80_columns(engine):
    """At 80x24 the panel is narrower than the transcript and the footer shows every key it lists, quit too."""
    async def run():
        app = ChatApp(engine, SamplingParams(), 12, "tiny")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            transcript, stats = app.screen.query_one("#transcript"), app.screen.query_one("StatsPanel")
            assert stats.size.width < transcript.size.width and stats.region.right <= 80
            keys = list(app.screen.query("FooterKey"))
            assert any(k.action == "app.quit" for k in keys)
            assert all(k.region.right <= 80 for k in keys)
    asyncio.run(run())


# Linux's /proc/pressure/memory as the kernel writes it
PSI_FLAT = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def psi(some10=0.0, some60=0.0, full10=0.0, full60=0.0) -> str:
    return (f"some avg10={some10:.2f} avg60={some60:.2f} avg300=0.51 total=48120712\n"
            f"full avg10={full10:.2f} avg60={full60:.2f} avg300=0.00 total=1303418\n")


@pytest.mark.parametrize("available, psi_text, macos, level", [
    (0.98, psi(some10=5.5, some60=1.2), None, "normal"),  # issue 11: a burst of `some`, memory to spare
    (0.98, psi(some10=85.0, some60=14.0), None, "normal"),  # a page-cache reclaim burst
    (0.60, psi(some10=60.0, some60=55.0), None, "warn"),  # tasks waiting on memory for a minute
    (0.90, psi(some10=12.0, full10=12.0), None, "warn"),  # everything stalled a tenth of the time
    (0.90, psi(full60=6.0), None, "warn"),
    (0.90, psi(some10=50.0, full10=45.0), None, "critical"),  # thrashing
    (0.90, psi(full60=25.0), None, "critical"),
    (0.10, PSI_FLAT, None, "warn"),
    (0.03, PSI_FLAT, None, "critical"),
    (0.50, "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", None, "normal"),  # no `full` line
    (0.50, None, None, "normal"),  # no PSI: available memory only
    (0.10, None, None, "warn"),
    (0.03, None, 1, "normal"),  # macOS: its own level decides
    (0.90, None, 2, "warn"),
    (0.90, None, 4, "critical"),
    (0.03, None, 0, "critical"),  # an unknown level: judged like any other system
])
def test_memory_pressure_classification(available, psi_text, macos, level):
    got, detail = classify_pressure(available, psi_text, macos)
    assert got == level, detail
    assert f"{available:.0%} available" in detail


def test_psi_parsing():
    assert parse_psi(psi(some10=5.5, full60=1.25)) == {
        "some": {"avg10": 5.5, "avg60": 0.0, "avg300": 0.51, "total": 48120712.0},
        "full": {"avg10": 0.0, "avg60": 1.25, "avg300": 0.0, "total": 1303418.0}}
    assert "PSI 10 s: some 5.5%, full 0.0%" in classify_pressure(0.98, psi(some10=5.5))[1]


@pytest.mark.parametrize("draft,drafter", [("qwen3", "draft-model"), ("qwen3-eagle3", "eagle3")])
def test_the_panel_counts_tree_nodes(tiny, tmp_path, draft, drafter):
    engine = mlx_spec.load(str(tiny["qwen3"]), draft_model=str(tiny[draft]), tree_width=2, draft_len=3)
    engine.tokenizer.eos_token_ids = []

    async def run():
        app = ChatApp(engine, SamplingParams(), 24, "tiny", transcript_dir=str(tmp_path))
        async with app.run_test(size=(100, 30)) as pilot:
            await ask(app, pilot, "hello")
            await wait_done(app, pilot)
            nodes = re.search(r"tree: ([\d.]+) nodes verified/round", panel(app, "acceptance"))
            assert nodes and float(nodes.group(1)) > 3  # more than the depth-3 chain: two per level
            assert panel(app, "drafter").startswith(f"drafter: {drafter}\n")
    asyncio.run(run())


@pytest.mark.parametrize("family,confidence", [("qwen3", False), ("qwen3_5", True)])
def test_the_panel_shows_a_block_drafters_blocks(tiny, tmp_path, family, confidence):
    """How many blocks, their length of the most the drafter drafts, and DSpark's estimated acceptance per
    position (its confidence head) beside the measured one."""
    draft = (random_block_drafter(tmp_path / "dspark", tiny[family], kind="dspark", confidence=True) if confidence
             else tiny[f"{family}-dflash"])
    engine = mlx_spec.load(str(tiny[family]), draft_model=str(draft), draft_len=3)
    engine.tokenizer.eos_token_ids = []

    async def run():
        app = ChatApp(engine, SamplingParams(), 24, "tiny", transcript_dir=str(tmp_path))
        async with app.run_test(size=(100, 40)) as pilot:
            await ask(app, pilot, "hello")
            await wait_done(app, pilot)
            text = " ".join(panel(app, "acceptance").split())
            blocks = re.search(r"(\d+) blocks of ([\d.]+) drafts \(at most 3\) from one drafter forward each", text)
            assert blocks and int(blocks.group(1)) > 1 and 2 < float(blocks.group(2)) <= 3
            assert bool(re.search(r"estimated acceptance per position \[\d+%( \d+%){2}\]", text)) == confidence
    asyncio.run(run())


@pytest.fixture(scope="module")
def server(tiny):
    proc, url = start_server(tiny)
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_the_chat_on_a_server(server, tiny):
    """`mlx-spec chat --server`: the turns, live rounds, keys and panel of a local chat, computed by the server:
    its answer equals local decoding, its cache keeps the conversation, a pin reaches the running answer."""
    engine = RemoteEngine(server, KEY)
    rounds = record_rounds(engine)
    local = mlx_spec.load(str(tiny["qwen3"]), str(tiny["qwen3-draft"]))

    async def run():
        app = ChatApp(engine, SamplingParams(), 24, "tiny", memory_report=RemoteEngine.memory)
        async with app.run_test(size=(100, 30)) as pilot:
            assert panel(app, "drafter").startswith("drafter: draft-model\nadaptive")
            assert engine.memory().weights > 0 and "memory pressure" in panel(app, "pressure")
            await pilot.press("f4")  # pinned one below the adaptive maximum: drafting every round
            top = engine.status().max_draft_len
            assert engine.status().draft_len == top - 1
            await ask(app, pilot, "hello")
            await wait_done(app, pilot)
            expected = local.generate([{"role": "user", "content": "hello"}], SamplingParams(), 24)
            assert views(app, "assistant")[-1].text == expected.text
            stats = app.screen.last_stats
            assert stats.drafter == "draft-model" and stats.rounds == len(rounds) and stats.drafted > 0
            assert f"{stats.decode_tps:.1f} tok/s" in panel(app, "speed")
            await ask(app, pilot, "and again")
            await wait_done(app, pilot)
            assert app.screen.last_stats.reused_prompt_tokens >= stats.prompt_tokens + 24 - 1  # on the server

            app.max_tokens = 20000
            rounds.clear()
            await ask(app, pilot, "a long answer")
            await wait_for(pilot, lambda: len(rounds) >= 3, "three rounds")
            for key, draft_len in (("f5", top), ("f2", 0)):
                await pilot.press(key)
                assert engine.status().draft_len == draft_len
                pressed = len(rounds)
                await wait_for(pilot, lambda: len(rounds) >= pressed + 4, "four more rounds")
                assert set(rounds[pressed + 1:]) == {draft_len}, (key, rounds[pressed:])  # one in flight at most
            await pilot.press("escape")
            await wait_done(app, pilot)
            answer = views(app, "assistant")[-1]
            assert answer.status == "stopped" and app.screen.last_stats.rounds == len(rounds)
            await pilot.press("f8")
            assert isinstance(app.engine, RemoteEngine) and app.engine.status().drafter == "ngram"
            app.max_tokens = 24  # bounded: how far the stopped answer got varies with timing, and so would this
            await ask(app, pilot, "hi")
            await wait_done(app, pilot)
            assert app.screen.last_stats.drafter == "ngram"
    asyncio.run(run())


def test_a_chat_whose_server_goes_away_says_so(tiny):
    proc, url = start_server(tiny)
    try:
        async def run():
            app = ChatApp(RemoteEngine(url, KEY), SamplingParams(), 100_000, "tiny", memory_report=RemoteEngine.memory)
            async with app.run_test(size=(100, 30)) as pilot:
                await ask(app, pilot, "a long answer")
                await wait_for(pilot, lambda: views(app, "assistant")[-1].text, "the first text")
                proc.kill()
                await wait_done(app, pilot)
                assert "lost the server" in views(app, "error")[-1].text
                await ask(app, pilot, "hello?")
                await wait_done(app, pilot)
                assert "cannot reach an mlx-spec server" in views(app, "error")[-1].text
        asyncio.run(run())
    finally:
        proc.kill()
        proc.wait()


def test_chat_server_refusals(server):
    assert_one_line_error(run_cli("chat", "--server", f"http://127.0.0.1:{free_port()}"),
                          "cannot reach an mlx-spec server")
    assert_one_line_error(run_cli("chat", "--server", server, "--api-key", "wrong"), "refused the API key")
    assert_one_line_error(run_cli("chat", "--server", server, "--drafter", "ngram"),
                          "--drafter chooses what the server loads")
    port = free_port()
    other = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            proc = run_cli("chat", "--server", f"http://127.0.0.1:{port}")
            if "cannot reach" not in proc.stderr:
                break
        assert_one_line_error(proc, "is not an mlx-spec server")
    finally:
        other.kill()
        other.wait()


def test_markdown_mode_keeps_code_as_the_model_wrote_it():
    """F3's Markdown rendering of an answer (rich's renderer, the one the view uses): code outside fences keeps its
    lines, indentation and dunder names; Markdown emphasis and inline code still render."""
    from rich.console import Console
    from rich.markdown import Markdown

    from tui.widgets.message import markdown_source

    text = "def f(self):\n    return self.__name__\n\nIt is **bold**, `a_b` and snake_case."
    console = Console(width=60, record=True, file=open(os.devnull, "w"))
    console.print(Markdown(markdown_source(text)))
    lines = [line.replace("\xa0", " ").rstrip() for line in console.export_text().splitlines()]  # as shown
    assert lines[:2] == ["def f(self):", "    return self.__name__"]
    assert "It is bold, a_b and snake_case." in lines
