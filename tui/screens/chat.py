"""The chat screen: transcript, live statistics, prompt; generation runs in a thread worker that posts
messages, so the interface never waits on the model."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input

from mlx_spec.engine import Done, Round, Token
from mlx_spec.errors import SpecError
from mlx_spec.loading import available_drafters, with_drafter
from mlx_spec.stats import Stats

from ..widgets.message import MessageView
from ..widgets.stats import StatsPanel

HELP = ("Enter sends. Esc stops the answer (keeping what came). F2 speculation on/off, F3 colour drafted tokens, "
        "F4/F5 draft length -/+ (pins it), F6/F7 temperature -/+, F8 next drafter, Ctrl+N new chat, "
        "Ctrl+S save transcript, Ctrl+Q quit.")


class TokenArrived(Message):
    def __init__(self, text: str, from_draft: bool):
        super().__init__()
        self.text, self.from_draft = text, from_draft


class RoundDone(Message):
    def __init__(self, mean_length: float):
        super().__init__()
        self.mean_length = mean_length


class TurnDone(Message):
    def __init__(self, stats: Stats, reason: str, text: str):
        super().__init__()
        self.stats, self.reason, self.text = stats, reason, text


class TurnFailed(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("f2", "toggle_speculation", "Speculation"),
        Binding("f3", "toggle_colour", "Colour"),
        Binding("f4", "draft_length(-1)", "Draft -"),
        Binding("f5", "draft_length(1)", "Draft +"),
        Binding("f6", "temperature(-0.1)", "Temp -"),
        Binding("f7", "temperature(0.1)", "Temp +"),
        Binding("f8", "next_drafter", "Drafter"),
        Binding("ctrl+n", "new_chat", "New", priority=True),
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("f1", "help", "Help"),
    ]

    def __init__(self):
        super().__init__()
        self.messages: list[dict] = []
        self.history: list[float] = []  # tokens per target forward, per round
        self.generating = False
        self.stop_requested = False
        self.speculating = True
        self.plain_tps: float | None = None
        self.last_stats: Stats | None = None
        self.answer: MessageView | None = None
        self.requests: queue.Queue = queue.Queue()  # conversations to answer; None ends the worker
        self.worker = threading.Thread(target=self.serve, name="mlx-spec-generate")
        self.engines: dict = {}  # drafter name -> engine, built on first switch
        self.sequence_text, self.sequence_ids = "", []  # the conversation so far, as text and as tokens

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield VerticalScroll(id="transcript")
            yield StatsPanel()
        yield Input(placeholder="Ask something (F1: keys)", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.worker.start()
        self.query_one("#prompt", Input).focus()
        if self.app.notice:
            self.add_message(MessageView("note", self.app.notice))
        self.notify_stats(Stats(drafter=self.engine.drafter.name if self.engine.drafter else "off",
                                policy=self.engine.policy.note))

    @property
    def engine(self):
        return self.app.engine

    def add_message(self, view: MessageView) -> MessageView:
        transcript = self.query_one("#transcript", VerticalScroll)
        transcript.mount(view)
        transcript.scroll_end(animate=False)
        return view

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text or self.generating:
            return
        event.input.value = ""
        self.messages.append({"role": "user", "content": text})
        self.add_message(MessageView("user", text))
        self.answer = self.add_message(MessageView("assistant"))
        self.generating, self.stop_requested = True, False
        self.generate(list(self.messages))

    def generate(self, messages: list[dict]) -> None:
        self.requests.put(messages)

    def serve(self) -> None:
        """Every turn runs on this one thread (not daemonic, joined on unmount): MLX arrays belong to the thread
        that made them, and the prompt cache carries arrays from one turn to the next."""
        while (messages := self.requests.get()) is not None:
            self.run_turn(messages)

    def on_unmount(self) -> None:
        self.stop_requested = True
        self.requests.put(None)
        self.worker.join()

    def prompt_ids(self, messages: list[dict]) -> tuple[str, list[int]]:
        """The rendered conversation and its tokens: the tokens of the previous turns exactly as they were
        prefilled and generated, then the new text, so the engine reuses its cache for all of the former."""
        tokenizer = self.engine.tokenizer
        rendered = (tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                    if tokenizer.has_chat_template else "\n".join(m["content"] for m in messages))
        if self.sequence_ids and rendered.startswith(self.sequence_text):
            new_text = rendered[len(self.sequence_text):]
            return rendered, self.sequence_ids + tokenizer.encode(new_text, add_special_tokens=False)
        return rendered, tokenizer.encode(rendered, add_special_tokens=False)

    def run_turn(self, messages: list[dict]) -> None:
        try:
            rendered, prompt = self.prompt_ids(messages)
            answer_ids, answer_text = [], ""
            for event in self.engine.stream(prompt, self.app.params, self.app.max_tokens):
                if self.stop_requested:
                    self.post_message(TurnDone(self.engine_stats(), "stopped", self.answer.text))
                    break
                if isinstance(event, Token):
                    answer_ids += [event.id] if event.id >= 0 else []
                    answer_text += event.text
                    if event.text:
                        self.post_message(TokenArrived(event.text, event.from_draft))
                elif isinstance(event, Round):
                    self.post_message(RoundDone(1 + event.accepted))
                elif isinstance(event, Done):
                    self.post_message(TurnDone(event.stats, event.stop_reason, event.text))
            self.sequence_text, self.sequence_ids = rendered + answer_text, prompt + answer_ids
        except SpecError as e:
            self.post_message(TurnFailed(str(e)))
        except Exception as e:  # shown in the interface, never as a traceback over it
            self.post_message(TurnFailed(f"{type(e).__name__}: {e}"))

    def engine_stats(self) -> Stats:
        return dataclasses.replace(self.last_stats or Stats(), policy=self.engine.policy.note)

    def on_token_arrived(self, message: TokenArrived) -> None:
        self.answer.append(message.text, message.from_draft)
        self.query_one("#transcript", VerticalScroll).scroll_end(animate=False)

    def on_round_done(self, message: RoundDone) -> None:
        self.history.append(message.mean_length)

    def on_turn_done(self, message: TurnDone) -> None:
        self.generating = False
        self.messages.append({"role": "assistant", "content": self.answer.text})
        self.answer.status = message.reason
        self.answer.refresh_text()
        if message.reason != "stopped":
            self.last_stats = message.stats
            if message.stats.drafter == "off" or not self.speculating:
                self.plain_tps = message.stats.decode_tps
        self.notify_stats(self.last_stats or message.stats)

    def on_turn_failed(self, message: TurnFailed) -> None:
        self.generating = False
        if self.answer is not None and not self.answer.text:
            self.answer.remove()
        self.add_message(MessageView("error", message.error))
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()

    def notify_stats(self, stats: Stats) -> None:
        self.query_one(StatsPanel).show(stats, self.history, self.plain_tps, self.app.memory_report(self.engine))

    def action_stop(self) -> None:
        if self.generating:
            self.stop_requested = True

    def action_toggle_speculation(self) -> None:
        self.speculating = not self.speculating
        self.engine.pin(None if self.speculating else 0)
        self.notify(f"speculation {'on: ' + self.engine.policy.note if self.speculating else 'off'}")

    def action_toggle_colour(self) -> None:
        for view in self.query(MessageView):
            view.colour_drafts = not view.colour_drafts
            view.refresh_text()

    def action_next_drafter(self) -> None:
        """Switch to the next drafter this model can use (then off); the weights stay loaded, once."""
        if self.generating or not hasattr(self.engine, "loaded"):
            return
        choices = available_drafters(self.engine.loaded, self.engine.options["draft_model"]) + ["off"]
        current = self.engine.drafter.name if self.engine.drafter else "off"
        current = "draft-model" if current == "assistant" else current
        choice = choices[(choices.index(current) + 1) % len(choices)] if current in choices else choices[0]
        try:
            self.app.engine = self.engines.get(choice) or with_drafter(self.engine, choice)
        except SpecError as e:
            self.add_message(MessageView("error", str(e)))
            return
        self.engines[choice] = self.app.engine
        self.engine.pin(None if self.speculating else 0)
        self.history.clear()
        self.notify(f"drafter: {choice}")
        self.notify_stats(Stats(drafter=self.engine.drafter.name if self.engine.drafter else "off",
                                policy=self.engine.policy.note))

    def action_draft_length(self, change: int) -> None:
        current = getattr(self.engine.policy, "draft_len", 0) or 0
        self.engine.pin(max(0, min(self.engine.max_draft_len * 2, current + change)))
        self.speculating = self.engine.policy.draft_len > 0
        self.notify(self.engine.policy.note)

    def action_temperature(self, change: float) -> None:
        temperature = round(max(0.0, self.app.params.temperature + change), 2)
        self.app.params = dataclasses.replace(self.app.params, temperature=temperature)
        self.notify(f"temperature {temperature}")

    def action_new_chat(self) -> None:
        if self.generating:
            return
        self.messages.clear()
        self.history.clear()
        self.sequence_text, self.sequence_ids = "", []
        self.query_one("#transcript", VerticalScroll).remove_children()

    def action_save(self) -> None:
        path = Path(self.app.transcript_dir) / f"mlx-spec-chat-{time.strftime('%Y%m%d-%H%M%S')}.md"
        lines = [f"# mlx-spec chat: {self.app.model_name}", ""]
        for m in self.messages:
            lines += [f"**{m['role']}:** {m['content']}", ""]
        if self.last_stats:
            lines += ["---", "", self.last_stats.summary()]
        path.write_text("\n".join(lines) + "\n")
        self.notify(f"saved {path}")

    def action_help(self) -> None:
        self.notify(HELP, timeout=10)
