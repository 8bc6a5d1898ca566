"""`mlx-spec chat` driven by Textual's pilot on a tiny hybrid model with its MTP drafter."""

import asyncio

import pytest

import mlx_spec
from mlx_spec.policy import FixedDraftLength
from mlx_spec.sampling import SamplingParams
from tui.app import ChatApp
from tui.widgets.message import MessageView


async def ask(app, pilot, text):
    await pilot.click("#prompt")
    await pilot.press(*text, "enter")
    await pilot.pause()


async def wait_done(app, pilot, limit=60.0):
    for _ in range(int(limit / 0.05)):
        if not app.screen.generating:
            return
        await pilot.pause(0.05)
    raise AssertionError("generation did not finish")


def views(app, role):
    return [v for v in app.screen.query(MessageView) if v.role == role]


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
            assert str(app.screen.query_one("#acceptance").render()).startswith("acceptance")
            assert "tok/s decode" in str(app.screen.query_one("#speed").render())
            assert "memory pressure" in str(app.screen.query_one("#pressure").render())
            assert app.screen.history  # one entry per round
            first_prompt = app.screen.last_stats.prompt_tokens
            await ask(app, pilot, "and again")  # a second turn, with the first in the chat history
            await wait_done(app, pilot)
            assert len(views(app, "assistant")) == 2 and len(app.screen.messages) == 4
            # the first turn's prompt and answer were not prefilled again
            assert app.screen.last_stats.reused_prompt_tokens >= first_prompt + 24 - 1
            assert "prompt tokens cached" in str(app.screen.query_one("#speed").render())
            await pilot.press("ctrl+s")
            saved = list(tmp_path.glob("mlx-spec-chat-*.md"))
            assert saved and "**user:** hello" in saved[0].read_text()
    asyncio.run(run())


def test_stop_keeps_the_partial_answer(engine):
    async def run():
        app = ChatApp(engine, SamplingParams(), 20000, "tiny")
        async with app.run_test(size=(100, 30)) as pilot:
            await ask(app, pilot, "go on forever")
            for _ in range(200):
                await pilot.pause(0.05)
                if views(app, "assistant")[-1].text:
                    break
            await pilot.press("escape")
            await wait_done(app, pilot)
            answer = views(app, "assistant")[-1]
            assert answer.status == "stopped" and answer.text
            assert app.screen.messages[-1] == {"role": "assistant", "content": answer.text}
    asyncio.run(run())


def test_keys_change_speculation_temperature_and_chat(engine):
    async def run():
        app = ChatApp(engine, SamplingParams(), 16, "tiny")
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("f2")
            assert isinstance(engine.policy, FixedDraftLength) and engine.policy.draft_len == 0
            await ask(app, pilot, "hi")
            await wait_done(app, pilot)
            assert app.screen.plain_tps  # a turn without speculation measured plain decoding
            await pilot.press("f2", "f5")
            assert engine.policy.note.endswith("(pinned)") and engine.policy.draft_len >= 1
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
            assert "drafter 0.0 MiB" not in str(app.screen.query_one("#memory").render())  # the MTP layer
            names = []
            for _ in range(3):
                await pilot.press("f8")
                names.append(app.engine.drafter.name if app.engine.drafter else "off")
                assert app.engine.target.model is engine.target.model  # loaded once, shared
            assert names == ["ngram", "off", "mtp"]
            await pilot.press("f8")
            assert "drafter: ngram" in str(app.screen.query_one("#drafter").render())
            assert "drafter 0.0 MiB" in str(app.screen.query_one("#memory").render())
            await ask(app, pilot, "hi")
            await wait_done(app, pilot)
            assert views(app, "assistant")[-1].text and app.screen.last_stats.drafter == "ngram"
    asyncio.run(run())
