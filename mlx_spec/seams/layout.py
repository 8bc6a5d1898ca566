"""Where mlx-lm's models keep their parts: the mlx-lm module that runs a checkpoint, and a language model's final
norm, decoder layers, token embedding and output head, under the names mlx-lm's families give them (inside a
multimodal wrapper's `language_model` when there is one). A model that keeps them elsewhere fails loudly
(`broken`)."""

from __future__ import annotations

from .errors import broken


def model_module(config: dict) -> str:
    """The name of the mlx-lm module that runs a checkpoint of `config` (its `model_type`, or what mlx-lm maps it to
    by type or by architecture: Ling 3.0 declares `bailing_hybrid` and runs as `bailing_moe_v3`)."""
    from mlx_lm.utils import _get_classes

    try:
        return _get_classes(config)[0].__module__.rsplit(".", 1)[-1]
    except ValueError:
        return str(config.get("model_type"))
    except Exception as e:
        raise broken(f"mlx_lm.utils._get_classes(config) ({type(e).__name__}: {e})") from None


NAMES = {"final norm": ("norm", "norm_f"), "decoder layers": ("layers",),  # a part -> its names, the usual first
         "token embedding": ("embed_tokens", "word_embeddings", "embeddings")}


def _part(model, part: str):
    """A language model's final norm, decoder layers or token embedding (`model.model.norm` ...; Nemotron-H:
    `backbone.norm_f`, `backbone.embeddings`; Ling: `model.word_embeddings`)."""
    language = getattr(model, "language_model", model)
    inner = getattr(language, "model", None) or getattr(language, "backbone", None)
    for name in NAMES[part]:
        if (found := getattr(inner, name, None)) is not None:
            return found
    raise broken(f"where {type(model).__module__} keeps its {part} (model.model.{NAMES[part][0]})")


def final_norm(model):
    """The final norm of a language model."""
    return _part(model, "final norm")


def decoder_layers(model) -> list:
    """A language model's decoder layers, in order."""
    return _part(model, "decoder layers")


def input_embedding(model):
    """A language model's token embedding."""
    return _part(model, "token embedding")


def input_scale(model) -> float:
    """What a language model multiplies the input embeddings it is given by (Gemma 4's `embed_scale`, the square
    root of its width), 1.0 for one that takes them as they are."""
    return float(getattr(getattr(model, "language_model", model).model, "embed_scale", 1.0))


def output_head(model):
    """A language model's output projection (its final norm's output -> logits): its `lm_head`, or the tied
    embedding's `as_linear`."""
    language = getattr(model, "language_model", model)
    if (head := getattr(language, "lm_head", None)) is not None:
        return head
    return input_embedding(model).as_linear
