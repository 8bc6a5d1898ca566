"""The one place a prompt becomes what the model reads: a text or a chat (a list of {"role", "content"}),
through the model's chat template unless `raw` or the model has none."""

from __future__ import annotations

from .errors import SpecError


def check_messages(messages) -> list[dict]:
    """The messages, each content given as a list of OpenAI text parts ({"type": "text", "text"}) joined into
    one text; a SpecError for anything else."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise SpecError("messages must be a non-empty list of {\"role\", \"content\": text} objects")
    return [{**m, "content": content_text(m.get("content"))} for m in messages]


def content_text(content) -> str:
    """A message's content as text: a text, or the texts of a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        if other := [part.get("type") for part in content if part.get("type") != "text"]:
            raise SpecError(f"content parts of type {other[0]!r} are not supported: this model reads text only; "
                            "send text parts")
        if all(isinstance(part.get("text"), str) for part in content):
            return "".join(part["text"] for part in content)
    raise SpecError("a message's content must be text or a list of {\"type\": \"text\", \"text\"} parts")


def prompt_text(tokenizer, prompt: str | list[dict], raw: bool = False) -> tuple[str, bool]:
    """(the text the model reads, whether the chat template made it). Without a template (or with `raw`) a
    text is used as it is and a chat's contents are joined by newlines."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
        if raw or not getattr(tokenizer, "has_chat_template", False) or not prompt.strip():
            return prompt, False
    else:
        messages = check_messages(prompt)
        if raw or not getattr(tokenizer, "has_chat_template", False):
            return "\n".join(m["content"] for m in messages), False
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), True
    except Exception as e:  # jinja templates raise their own errors for conversations they do not accept
        raise SpecError(f"the model's chat template rejects this conversation ({e}): fix the messages or pass "
                        "the prompt raw") from None


def render_prompt(tokenizer, prompt: str | list[dict], raw: bool = False) -> list[int]:
    """The token ids the model reads for `prompt`: a templated text carries its own special tokens, a raw one
    gets the tokenizer's usual ones (e.g. a BOS)."""
    if not isinstance(prompt, (str, list)):
        raise SpecError(f"a prompt must be text or a list of messages, not {type(prompt).__name__}")
    if prompt == "":
        raise SpecError("the prompt is empty: give some text to continue")
    text, templated = prompt_text(tokenizer, prompt, raw)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: undecodable bytes in an argument, or "\ud800" in JSON
        raise SpecError("the prompt is not valid Unicode (undecodable bytes or a lone surrogate): give UTF-8 "
                        "text") from None
    ids = tokenizer.encode(text, add_special_tokens=not templated)
    if not ids:
        raise SpecError("the prompt is empty: give some text to continue")
    return ids
