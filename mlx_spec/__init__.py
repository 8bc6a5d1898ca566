"""mlx-spec: lossless speculative decoding on MLX.

    import mlx_spec
    engine = mlx_spec.load("qwen3-8b")                  # or a directory / hub id; None = built-in demo
    result = mlx_spec.generate(engine, "def fib(n):", max_tokens=64, temperature=0.7)
    print(result.text, result.stats.summary())
    for event in mlx_spec.stream(engine, "Hello"):      # Token / Text / Round / Done events
        ...

Importing mlx_spec is cheap: the engine loads on first use. On Linux it first points MLX at the system OpenBLAS
(see `linux_blas`), so import it before `mlx`.
"""

from __future__ import annotations

import importlib

from .seams import linux_blas

linux_blas.use_openblas()

__all__ = ["load", "generate", "stream", "render_prompt", "batch", "Engine", "EngineStatus", "SamplingParams",
           "SpecError", "Result", "Token", "Text", "Round", "Done", "Grammar", "Job"]
__version__ = "0.1.0"

_HOMES = {"load": "loading", "render_prompt": "core.prompts", "Engine": "decode.engine",
          "EngineStatus": "decode.engine", "Result": "core.events", "Token": "core.events", "Text": "core.events",
          "Round": "core.events", "Done": "core.events", "SamplingParams": "core.sampling",
          "SpecError": "seams.errors", "Grammar": "core.grammar", "Job": "decode.rounds"}


def __getattr__(name: str):
    if name == "batch":
        return importlib.import_module(".commands.batch", __name__)
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module 'mlx_spec' has no attribute {name!r}")


def _split(kwargs: dict):
    from .core.sampling import SamplingParams

    fields = SamplingParams.__dataclass_fields__
    params = SamplingParams(**{k: kwargs.pop(k) for k in list(kwargs) if k in fields})
    return params, kwargs


def generate(engine, prompt: str | list[int], **kwargs):
    """Generate a whole completion -> Result. kwargs: SamplingParams fields, max_tokens, stop, seed, tools (what a
    chat may call), grammar (a `Grammar` the output must match)."""
    params, rest = _split(dict(kwargs))
    return engine.generate(prompt, params, **rest)


def stream(engine, prompt: str | list[int], **kwargs):
    """Yield Token / Text / Round / Done events as they are produced. kwargs as for `generate`."""
    params, rest = _split(dict(kwargs))
    return engine.stream(prompt, params, **rest)
