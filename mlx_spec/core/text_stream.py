"""Generated tokens -> printable text, held back while it could still become a stop string."""

from __future__ import annotations


class TextStream:
    """Incremental detokenization that holds back text which could still become a stop string."""

    def __init__(self, tokenizer, stop: list[str]):
        self.detokenizer = tokenizer.detokenizer
        self.stop = [s for s in stop if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.shown = 0
        self.stopped_at: int | None = None

    def add(self, token: int) -> str:
        self.detokenizer.add_token(token)
        text = self.detokenizer.text  # read once: some detokenizers decode on every read
        for s in self.stop:
            i = text.find(s, max(0, self.shown - len(s)))
            if i >= 0 and (self.stopped_at is None or i < self.stopped_at):
                self.stopped_at = i
        return self._emit(text, self.stopped_at if self.stopped_at is not None else len(text) - self.holdback)

    def finish(self) -> str:
        self.detokenizer.finalize()
        text = self.detokenizer.text
        return self._emit(text, self.stopped_at if self.stopped_at is not None else len(text))

    def _emit(self, text: str, end: int) -> str:
        piece = text[self.shown:end] if end > self.shown else ""
        self.shown = max(self.shown, end)
        return piece

    @property
    def text(self) -> str:
        return self.detokenizer.text[: self.shown]
