"""The chat screen: transcript, live statistics, prompt; generation runs in a thread worker that posts
messages, so the interface never waits on the model.

Threads: the worker thread is the only one that runs the engine (`stream`); the interface thread only calls what
the engine allows from any thread (`pin`, `stop`, `status`), and swaps engines (F8) only between answers. Each
turn carries the engine it runs on, so a swap can never reach a turn in progress."""

from __future__ import annotations

import dataclasses
import queue
import re
import threading
import time
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input

from mlx_spec.core.events import Done, Round, Text, Token
from mlx_spec.core.sampling import SamplingParams
from mlx_spec.core.stats import Stats
from mlx_spec.decode.engine import Engine
from mlx_spec.seams.errors import SpecError

from ..widgets.message import MessageView
from ..widgets.stats import StatsPanel

HELP = ("Enter sends. Esc stops the answer (keeping what came). F2 speculation on/off, F3 colour drafted tokens, "
        "F4/F5 draft length -/+ (pins it), F6/F7 temperature -/+, F8 next drafter (between answers), "
        "Ctrl+N new chat, Ctrl+S save transcript, Ctrl+Q quit. F2/F4/F5 act on the answer being written from "
        "its next round. /image PATH attaches an image to your next message (a vision-language model).")

DRAFT = Binding.Group("Draft", compact=True)


@dataclasses.dataclass
class Turn:
    """One answer to write, fixed when the user sends: the worker touches nothing else of the screen's."""

    engine: Engine
    messages: list[dict]
    params: SamplingParams
    max_tokens: int


class TokenArrived(Message):
    def __init__(self, text: str, from_draft: bool):
        super().__init__()
        self.text, self.from_draft = text, from_draft


class RoundDone(Message):
    def __init__(self, draft_len: int, accepted: int):
        super().__init__()
        self.draft_len, self.accepted = draft_len, accepted


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
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "app.quit", "Quit", priority=True),
        Binding("f2", "toggle_speculation", "Spec"),
        Binding("f3", "toggle_colour", "Colour", show=False),  # F1 lists every key; the footer fits 80 columns
        Binding("f4", "draft_length(-1)", "Draft -", group=DRAFT),
        Binding("f5", "draft_length(1)", "Draft +", group=DRAFT),
        Binding("f6", "temperature(-0.1)", "Temp -", show=False),
        Binding("f7", "temperature(0.1)", "Temp +", show=False),
        Binding("f8", "next_drafter", "Drafter"),
        Binding("ctrl+n", "new_chat", "New", priority=True),
        Binding("ctrl+s", "save", "Save", priority=True),
    ]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]  # a screen class, for app.tcss

    def __init__(self):
        super().__init__()
        self.messages: list[dict] = []
        self.images: list[str] = []  # attached with /image, sent with the next message
        self.history: list[float] = []  # tokens per target forward, per round
        self.generating = False
        self.stop_requested = False
        self.turn_engine: Engine | None = None  # the engine of the turn in progress
        self.plain_turn = False  # whether the turn in progress decodes without drafting
        self.plain_tps: float | None = None
        self.last_stats: Stats | None = None
        self.answer: MessageView | None = None
        self.requests: queue.Queue[Turn | None] = queue.Queue()  # turns to answer; None ends the worker
        self.worker = threading.Thread(target=self.serve, name="mlx-spec-generate")
        self.engines: dict[str, Engine] = {}  # drafter name -> engine, built on first switch
        self.draft_len: int | None = None  # what the user wants, kept across drafters: None adaptive, 0 off
        self.draft_len_on: int | None = None  # what F2 turns speculation back on to

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield VerticalScroll(id="transcript")
            yield StatsPanel()
        prompt = Input(placeholder="Ask something (F1: keys)", id="prompt")
        prompt.cursor_blink = not self.app.steady
        yield prompt
        yield Footer(show_command_palette=False, compact=True)

    def on_mount(self) -> None:
        status = self.engine.status()
        if status.drafter != "off":
            self.draft_len = status.draft_len
            self.draft_len_on = status.draft_len or None
        self.worker.start()
        self.query_one("#prompt", Input).focus()
        if self.app.notice:
            self.add_message(MessageView("note", self.app.notice))
        self.show_status()

    @property
    def engine(self) -> Engine:
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
        if text.startswith("/image"):
            self.attach(text.removeprefix("/image").strip())
            return
        parts = [{"type": "image", "image": path} for path in self.images]
        self.messages.append({"role": "user", "content": parts + [{"type": "text", "text": text}] if parts else text})
        self.add_message(MessageView("user", "".join(f"[image {Path(p).name}] " for p in self.images) + text))
        self.images = []
        self.answer = self.add_message(MessageView("assistant"))
        self.generating, self.stop_requested, self.turn_engine = True, False, self.engine
        self.plain_turn = self.engine.status().draft_len == 0
        self.show_status()  # this answer's drafter and policy; its figures come with it
        self.requests.put(Turn(self.engine, list(self.messages), self.app.params, self.app.max_tokens))

    def attach(self, path: str) -> None:
        """`/image PATH`: the image goes with the next message (the engine reads it then, or says why not)."""
        if not path or not Path(path).expanduser().is_file():
            self.add_message(MessageView("error", f"/image {path}: no such file: give an image file's path"))
            return
        self.images.append(str(Path(path).expanduser()))
        self.add_message(MessageView("note", f"image {Path(path).name} attached: it goes with your next message"))

    def serve(self) -> None:
        """Every turn runs on this one thread (not daemonic, joined on unmount): MLX arrays belong to the thread
        that made them, and the prompt cache carries arrays from one turn to the next."""
        while (turn := self.requests.get()) is not None:
            self.run_turn(turn)

    def on_unmount(self) -> None:
        self.action_stop()
        self.requests.put(None)
        self.worker.join()

    def run_turn(self, turn: Turn) -> None:
        """On the worker thread: stream one answer and post what happens."""
        engine = turn.engine
        try:
            for event in engine.stream(turn.messages, turn.params, turn.max_tokens):  # the engine reuses the
                # cache for the turns before, as it prefilled and generated them
                if self.stop_requested:
                    engine.stop()  # again: a stop that came before the stream began was reset by it
                if isinstance(event, (Token, Text)) and event.text:
                    self.post_message(TokenArrived(event.text, isinstance(event, Token) and event.from_draft))
                elif isinstance(event, Round):
                    self.post_message(RoundDone(event.draft_len, event.accepted))
                elif isinstance(event, Done):
                    self.post_message(TurnDone(event.stats, event.stop_reason, event.text))
        except SpecError as e:
            self.post_message(TurnFailed(str(e)))
        except Exception as e:  # shown in the interface, never as a traceback over it
            self.post_message(TurnFailed(f"{type(e).__name__}: {e}"))

    def on_token_arrived(self, message: TokenArrived) -> None:
        self.answer.append(message.text, message.from_draft)
        self.query_one("#transcript", VerticalScroll).scroll_end(animate=False)

    def on_round_done(self, message: RoundDone) -> None:
        self.history.append(1 + message.accepted)
        self.query_one(StatsPanel).show_history(self.history)

    def on_turn_done(self, message: TurnDone) -> None:
        self.generating, self.turn_engine = False, None
        self.messages.append({"role": "assistant", "content": self.answer.text})
        self.answer.status = message.reason
        self.answer.refresh_text()
        self.last_stats = message.stats  # a stopped turn's too: the engine measured what it ran
        if self.plain_turn and message.stats.drafted == 0 and message.stats.generated_tokens:
            self.plain_tps = message.stats.decode_tps
        self.notify_stats(message.stats)

    def on_turn_failed(self, message: TurnFailed) -> None:
        self.generating, self.turn_engine = False, None
        if self.answer is not None and not self.answer.text:
            self.answer.remove()
        self.add_message(MessageView("error", message.error))
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()

    def show_status(self) -> None:
        """The panel before any turn with this engine: its drafter and policy."""
        status = self.engine.status()
        self.notify_stats(Stats(drafter=status.drafter, policy=status.policy, policy_reasons=status.reasons[1:]))

    def notify_stats(self, stats: Stats) -> None:
        self.query_one(StatsPanel).show(stats, self.history, self.plain_tps, self.app.memory_report(self.engine))

    def action_stop(self) -> None:
        if self.generating:
            self.stop_requested = True
            self.turn_engine.stop()  # thread-safe: the turn ends after its current round

    def set_draft_len(self, draft_len: int | None) -> None:
        """Pin (or free, with None) the draft length; a turn in progress uses it from its next round."""
        self.engine.pin(draft_len)
        self.draft_len = draft_len
        if draft_len != 0:
            self.draft_len_on = draft_len

    def has_drafter(self) -> bool:
        if self.engine.status().drafter == "off":
            self.notify("no drafter: F8 chooses one")
            return False
        return True

    def action_toggle_speculation(self) -> None:
        if self.has_drafter():
            self.set_draft_len(self.draft_len_on if self.draft_len == 0 else 0)
            self.notify(f"speculation {'off' if self.draft_len == 0 else 'on: ' + self.engine.status().policy}")

    def action_draft_length(self, change: int) -> None:
        if not self.has_drafter():
            return
        status = self.engine.status()
        current = self.draft_len  # adaptive: from what it drafts now (0 when it has turned drafting off)
        if current is None:
            current = status.max_draft_len if status.next_draft_len is None else status.next_draft_len
        try:
            self.set_draft_len(max(0, min(status.max_draft_len * 2, current + change)))
        except SpecError as e:
            self.notify(str(e), severity="warning")
            return
        self.notify(self.engine.status().policy)

    def action_toggle_colour(self) -> None:
        for view in self.query(MessageView):
            view.colour_drafts = not view.colour_drafts
            view.refresh_text()

    def action_next_drafter(self) -> None:
        """Switch to the next drafter this model can use (then off); the weights stay loaded, once."""
        status = self.engine.status()
        if len(status.drafters) < 2:
            self.notify("no other drafter for this model")
            return
        if self.generating:
            self.notify("the drafter changes between answers (Esc stops this one)")
            return
        choices = status.drafters
        current = "draft-model" if status.drafter == "assistant" else status.drafter
        choice = choices[(choices.index(current) + 1) % len(choices)] if current in choices else choices[0]
        try:
            self.app.engine = self.engines.get(choice) or self.engine.with_drafter(choice)
        except SpecError as e:
            self.add_message(MessageView("error", str(e)))
            return
        self.engines[choice] = self.app.engine
        if choice != "off":
            self.engine.pin(self.draft_len)
        self.history.clear()
        self.notify(f"drafter: {choice}")
        self.show_status()

    def action_temperature(self, change: float) -> None:
        temperature = round(max(0.0, self.app.params.temperature + change), 2)
        self.app.params = dataclasses.replace(self.app.params, temperature=temperature)
        self.notify(f"temperature {temperature}" + (" from the next answer" if self.generating else ""))

    def action_new_chat(self) -> None:
        if self.generating:
            self.notify("a new chat starts between answers (Esc stops this one)")
            return
        self.messages.clear()
        self.images = []
        self.history.clear()
        self.last_stats = None
        self.query_one("#transcript", VerticalScroll).remove_children()
        self.show_status()  # not the last chat's figures

    def action_save(self) -> None:
        path = Path(self.app.transcript_dir) / f"mlx-spec-chat-{time.strftime('%Y%m%d-%H%M%S')}.md"
        lines = [f"# mlx-spec chat: {self.app.model_name}", ""]
        for view in self.query(MessageView):
            if view.role in ("user", "assistant"):
                lines += [transcript_entry(view.role, view.text, view.status), ""]
        if self.last_stats:
            lines += ["---", "", self.last_stats.summary()]
        path.write_text("\n".join(lines) + "\n")
        self.notify(f"saved {path}")

    def action_help(self) -> None:
        self.notify(HELP, timeout=10)


def transcript_entry(role: str, text: str, status: str = "") -> str:
    """One message of a saved transcript: a one-line question inline, anything else in a code fence (longer
    than any run of backticks in it), so that Markdown viewers keep code as it was written."""
    head = f"**{'model' if role == 'assistant' else role}:**" + (f" [{status}]" if status else "")
    if role == "user" and "\n" not in text and "`" not in text:
        return f"{head} {text}"
    fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
    return f"{head}\n{fence}\n{text}\n{fence}"
