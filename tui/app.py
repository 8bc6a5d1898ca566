"""The chat application: one screen, one stylesheet, generation in a worker thread."""

from __future__ import annotations

from textual.app import App

from mlx_spec.core.sampling import SamplingParams
from mlx_spec.decode.engine import Engine
from mlx_spec.seams import memory

from .screens.chat import ChatScreen


class ChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "mlx-spec chat"

    def __init__(self, engine: Engine, params: SamplingParams, max_tokens: int = 512, model_name: str = "",
                 transcript_dir: str = ".", memory_report=memory.report, notice: str = "", steady: bool = False):
        """memory_report(engine) -> MemoryReport feeds the panel; notice: shown first in the transcript (which
        model this is, when the user did not choose one); steady: no blinking cursor, so that a screenshot
        does not depend on when it is taken (tests replace memory_report for the same reason)."""
        super().__init__()
        self.notice, self.steady = notice, steady
        self.engine, self.params, self.max_tokens = engine, params, max_tokens
        self.model_name, self.transcript_dir, self.memory_report = model_name, transcript_dir, memory_report

    def on_mount(self) -> None:
        self.sub_title = self.model_name
        self.push_screen(ChatScreen())
