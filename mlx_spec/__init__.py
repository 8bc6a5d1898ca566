"""mlx-spec: lossless speculative decoding on MLX.

    import mlx_spec
    engine = mlx_spec.load("qwen3-8b")                  # or a directory / hub id; None = built-in demo
    result = mlx_spec.generate(engine, "def fib(n):", max_tokens=64, temperature=0.7)
    print(result.text, result.stats.summary())
    for event in mlx_spec.stream(engine, "Hello"):      # Token / Round / Done events
        ...
"""

from __future__ import annotations

from . import batch
from .engine import Done, Engine, Result, Round, Token
from .errors import SpecError
from .loading import load
from .sampling import SamplingParams

__all__ = ["load", "generate", "stream", "batch", "Engine", "SamplingParams", "SpecError", "Result", "Token", "Round",
           "Done"]
__version__ = "0.1.0"


def _split(kwargs: dict) -> tuple[SamplingParams, dict]:
    fields = SamplingParams.__dataclass_fields__
    params = SamplingParams(**{k: kwargs.pop(k) for k in list(kwargs) if k in fields})
    return params, kwargs


def generate(engine: Engine, prompt: str | list[int], **kwargs) -> Result:
    """Generate a whole completion. kwargs: SamplingParams fields, max_tokens, stop, seed."""
    params, rest = _split(dict(kwargs))
    return engine.generate(prompt, params, **rest)


def stream(engine: Engine, prompt: str | list[int], **kwargs):
    """Yield Token / Round / Done events as they are produced. kwargs as for `generate`."""
    params, rest = _split(dict(kwargs))
    return engine.stream(prompt, params, **rest)
