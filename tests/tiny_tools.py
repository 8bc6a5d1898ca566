"""A tiny chat model that calls tools: Qwen2.5's own chat template (tests/chat_templates/qwen2.5.jinja, read from
Qwen2.5-Coder-1.5B-Instruct's GGUF), `<tool_call>` and `</tool_call>` added to the tiny tokenizer as Qwen2.5's
tokenizer has them (added, not special), `<|im_end|>` an end of turn, and a Qwen3-layout model trained (seconds)
to answer a few conversations by heart: one tool call, two, a plain answer, and the answer to a tool's result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten
from tiny import build_checkpoint

TEMPLATE = Path(__file__).resolve().parent / "chat_templates" / "qwen2.5.jinja"
ADDED = ["<tool_call>", "</tool_call>"]


def function(name: str, description: str, argument: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]}}}


TOOLS = [function("get_weather", "The weather in a city now", "city"),
         function("get_time", "The time now in a time zone", "timezone")]


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
TIMES = [{"role": "user", "content": "What time is it in Tokyo and in Lima?"}]
TIME_CALLS = [{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}},
              {"name": "get_time", "arguments": {"timezone": "America/Lima"}}]
HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER_RESULT = [*WEATHER, {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": WEATHER_CALL}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
ANSWERS = [  # (messages, what the model answers with TOOLS offered)
    (WEATHER, call(**WEATHER_CALL)),
    (TIMES, "\n".join(call(**c) for c in TIME_CALLS)),
    (HELLO, "Hello! How can I help?"),
    (WEATHER_RESULT, "It is 18 C and sunny in Paris."),
]


def build_tool_tokenizer(out: str | Path, tokenizer_dir: str | Path) -> Path:
    """The tiny tokenizer with Qwen2.5's tool-call tokens and chat template."""
    out, tokenizer_dir = Path(out), Path(tokenizer_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    size = len(spec["model"]["vocab"])
    spec["added_tokens"] += [{"id": size + i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": False} for i, text in enumerate(ADDED)]
    (out / "tokenizer.json").write_text(json.dumps(spec, indent=2))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE.read_text()},
                                                          indent=2))
    (out / "special_tokens_map.json").write_bytes((tokenizer_dir / "special_tokens_map.json").read_bytes())
    return out


def build_tool_base(out: str | Path, tokenizer_dir: Path) -> Path:
    """A random two-layer Qwen3-layout checkpoint over that tokenizer, `<|im_end|>` ending a turn."""
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    end_of_turn = next(t["id"] for t in spec["added_tokens"] if t["content"] == "<|im_end|>")
    return build_checkpoint(out, "qwen3", tokenizer_dir, layers=2, seed=11,
                            overrides={"vocab_size": len(spec["model"]["vocab"]) + len(ADDED),
                                       "eos_token_id": [end_of_turn, 0]})


def train_tool_model(out: str | Path, base_dir: Path, steps: int = 400, check: bool = True) -> Path:
    """The base trained until greedy decoding gives every one of ANSWERS (checked unless `check` is false),
    written as a checkpoint."""
    from mlx_lm import generate
    from mlx_lm.utils import load

    out = Path(out)
    shutil.copytree(base_dir, out)
    model, tokenizer = load(str(out))
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
               for messages, _ in ANSWERS]
    rows = [(p, tokenizer.encode(a, add_special_tokens=False) + [end_of_turn]) for p, (_, a) in zip(prompts, ANSWERS)]
    width = max(len(p) + len(a) for p, a in rows)
    ids = mx.array([(p + a + [0] * width)[:width] for p, a in rows])
    weights = mx.array([([0] * (len(p) - 1) + [1] * len(a) + [0] * width)[:width - 1] for p, a in rows],
                       dtype=mx.float32)

    def loss(model):
        logits = model(ids[:, :-1])
        return (nn.losses.cross_entropy(logits, ids[:, 1:]) * weights).sum() / weights.sum()

    optimizer, step = optim.Adam(learning_rate=3e-3), nn.value_and_grad(model, loss)
    for _ in range(steps):
        value, grads = step(model)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state)
    if check:
        for prompt, (_, answer) in zip(prompts, ANSWERS):
            said = generate(model, tokenizer, prompt, max_tokens=128)
            if said != answer:
                raise RuntimeError(f"the tool model did not learn {answer!r} in {steps} steps (says {said!r})")
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "pt"})
    return out
