"""One chat message. Assistant text streams in, either with the tokens the drafter got right in green or,
with colouring off, rendered as Markdown."""

from __future__ import annotations

import re

from rich.console import Group
from rich.markdown import Markdown
from rich.text import Text
from textual.widgets import Static


class MessageView(Static):
    def __init__(self, role: str, text: str = "", classes: str = ""):
        super().__init__(classes=f"{role} {classes}".strip())
        self.role = role
        self.segments: list[tuple[str, bool]] = [(text, False)] if text else []
        self.colour_drafts = True
        self.status = ""

    @property
    def text(self) -> str:
        return "".join(s for s, _ in self.segments)

    def append(self, text: str, from_draft: bool) -> None:
        self.segments.append((text, from_draft))
        self.refresh_text()

    def refresh_text(self) -> None:
        label = {"user": "you", "assistant": "model", "error": "error", "note": "note"}[self.role]
        rendered = Text(f"{label}: ", style="bold")
        status = Text(f"[{self.status}]", style="italic dim") if self.status else Text()
        if self.role == "assistant" and not self.colour_drafts:
            self.update(Group(rendered, Markdown(markdown_source(self.text)), status))
            return
        for segment, from_draft in self.segments:
            rendered.append(segment, style="green" if from_draft and self.colour_drafts else "")
        self.update(rendered.append("  ").append_text(status))

    def on_mount(self) -> None:
        self.refresh_text()


def markdown_source(text: str) -> str:
    """`text` as Markdown that keeps what a model writes outside code fences as it was written: its line breaks
    and indentation, and underscores inside names (`self.__name__`, not "self.name" in bold); fenced blocks and
    inline code as they are."""
    parts = re.split(r"(^```.*?^```[^\n]*$)", text, flags=re.M | re.S)
    for i in range(0, len(parts), 2):  # the parts outside fences
        spans = re.split(r"(`[^`\n]+`)", parts[i])  # inline code stays as it is
        lines = "".join(span if j % 2 else re.sub(r"(?<=\w)_|_(?=\w)", r"\\_", span)
                        for j, span in enumerate(spans)).split("\n")
        lines = [re.sub(r"^ +", lambda m: "\u00a0" * len(m.group()), line) for line in lines]
        parts[i] = "\n".join(line + "  " if line.strip() and j < len(lines) - 1 else line
                              for j, line in enumerate(lines))
    return "".join(parts)
