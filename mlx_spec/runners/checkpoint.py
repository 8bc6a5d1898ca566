"""What a checkpoint directory holds and how it loads: its config, weights, tokenizer, context length and
vocabulary, the memory its weights need, and a loaded target (`LoadedTarget`) that engines share."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..models.common import materialize
from ..seams.distributed import Lockstep
from ..seams.errors import SpecError
from .vision import Vision

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "*.tiktoken")
VOCAB_PADDING_TOLERANCE = 128


def weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("model*.safetensors"))


def check_memory(target_path: Path, draft_path: Path | None, what: str = "target model", shards: int = 1) -> None:
    """Refuse before loading when the weights cannot fit: the draft competes with the target for memory. `shards`:
    the ranks the target is split across (each holds about its share)."""
    target, available = weight_bytes(target_path) // shards, psutil.virtual_memory().available
    gib = 2**30
    if target > available:
        raise SpecError(f"not enough memory for the {what} at {target_path}: its weights need "
                        f"{target / gib:.1f} GiB, {available / gib:.1f} GiB are available; "
                        "use a smaller or more quantized model")
    if draft_path and target + (draft := weight_bytes(draft_path)) > available:
        raise SpecError(f"not enough memory for the draft model at {draft_path}: target {target / gib:.1f} GiB "
                        f"+ draft {draft / gib:.1f} GiB > {available / gib:.1f} GiB available; use "
                        "--drafter ngram (no extra memory) or a smaller draft")


def read_config(path: Path) -> dict:
    if not (path / "config.json").exists():
        raise SpecError(f"{path} has no config.json: point --model at a Hugging Face or MLX checkpoint directory")
    try:
        return json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise SpecError(f"{path / 'config.json'} is not valid JSON ({e}): re-download the checkpoint") from None


def load_checkpoint(path: Path, what: str, split=None):
    """(model, tokenizer, config) from a checkpoint directory, with one-line errors for broken ones. `split(model)`
    shards the model before its weights are evaluated (each rank keeps its own slice)."""
    from mlx_lm.utils import load_model, load_tokenizer

    read_config(path)
    if not weight_bytes(path):
        raise SpecError(f"{path} holds no model*.safetensors weights: re-download or re-convert the checkpoint")
    try:
        model, config = load_model(path, lazy=split is not None)
        if split is not None:
            split(model)
        materialize(model)
    except SpecError:
        raise
    except Exception as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(f"cannot load the {what} weights in {path} ({reason}): the files are corrupt, incomplete "
                        "or of an unsupported architecture; re-download or re-convert them") from None
    if not any(next(path.glob(pattern), None) for pattern in TOKENIZER_FILES):  # else an empty tokenizer
        raise SpecError(f"{path} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): copy the tokenizer files of "
                        "the original checkpoint into it")
    try:
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:
        raise SpecError(f"cannot load the tokenizer in {path} ({type(e).__name__}: {e})") from None
    return model, tokenizer, config


def tensor_names(path: Path) -> list[str]:
    """The names of the tensors in a checkpoint directory's safetensors files (its index's, where it has one)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        return list(json.loads(index.read_text())["weight_map"])
    names = []
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "numpy") as tensors:
            names += list(tensors.keys())
    return names


UNREAD_MTP = {"num_mtp_modules": lambda text: text.get("num_mtp_modules"),  # MiniMax M2 / M3
              "mtp_config.num_nextn_predict_layers":  # Inkling
              lambda text: (text.get("mtp_config") or {}).get("num_nextn_predict_layers")}


def unread_mtp_claim(config: dict, path: Path) -> str | None:
    """What a config claims of MTP layers under a key no drafter here reads (`UNREAD_MTP`), and whether the
    checkpoint holds MTP tensors at all; None where it claims none."""
    text = config.get("text_config", config)
    key, count = next(((key, count) for key, read in UNREAD_MTP.items() if (count := read(text))), (None, None))
    if not count:
        return None
    held = any(part.startswith("mtp") for name in tensor_names(path) for part in name.split("."))
    return (f"{path.name} declares {count} MTP layer(s) ({key}) " +
            ("of a kind MTP drafting does not read yet" if held else "but holds no MTP tensors (none were published)"))


def kv_quantization_problem(config: dict, group_size: int) -> str | None:
    """Why this model's KV cache cannot be quantized in groups of `group_size` (None when it can)."""
    text = config.get("text_config", config)
    if text.get("model_type", config.get("model_type", "")).startswith("gemma4"):
        return "Gemma 4's KV-shared layers read float K/V from earlier layers; drop --kv-bits"
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    if head_dim % group_size:
        fits = [g for g in (128, 64, 32) if head_dim % g == 0]
        return (f"--kv-group-size {group_size} does not divide its head size {head_dim}; "
                + (f"use --kv-group-size {fits[0]}" if fits else "drop --kv-bits"))
    return None


def context_length(config: dict) -> int | None:
    """The positions a checkpoint was trained for (its RoPE scaling's extended length, if larger), or None."""
    text = config.get("text_config", config)
    length = next((text[key] for key in ("max_position_embeddings", "n_positions", "max_sequence_length",
                                         "seq_length") if isinstance(text.get(key), int)), None)
    scaling = text.get("rope_scaling") or text.get("rope_parameters") or {}
    if length and isinstance(scaling.get("factor"), (int, float)) and scaling.get("original_max_position_embeddings"):
        length = max(length, int(scaling["factor"] * scaling["original_max_position_embeddings"]))
    return length


def vocab_size(config: dict) -> int:
    return config.get("vocab_size") or config.get("text_config", {})["vocab_size"]


def vocab_mismatch(target_tok, target_cfg: dict, draft_tok, draft_cfg: dict) -> str | None:
    """Why a draft model cannot serve this target (None when it can): llama.cpp's and vLLM's checks."""
    tv, dv = vocab_size(target_cfg), vocab_size(draft_cfg)
    if abs(tv - dv) > VOCAB_PADDING_TOLERANCE:
        return f"vocabulary sizes differ ({tv} vs {dv})"
    if set(target_tok.eos_token_ids) != set(draft_tok.eos_token_ids):
        return f"end-of-sequence ids differ ({sorted(target_tok.eos_token_ids)} vs {sorted(draft_tok.eos_token_ids)})"
    if target_tok.bos_token_id != draft_tok.bos_token_id:
        return f"begin-of-sequence ids differ ({target_tok.bos_token_id} vs {draft_tok.bos_token_id})"
    target_vocab = {i: s for s, i in target_tok.get_vocab().items()}
    for s, i in sorted(draft_tok.get_vocab().items(), key=lambda item: item[1]):
        if i in target_vocab and target_vocab[i] != s:
            return f"token {i} is {target_vocab[i]!r} in the target but {s!r} in the draft"
    return None


@dataclass
class LoadedTarget:
    """A target checkpoint in memory; engines with different drafters can share it."""

    path: Path
    model: object
    tokenizer: object
    config: dict
    entry: dict  # its models.toml entry, if any
    default_draft_model: str | None
    lockstep: Lockstep | None = None  # the ranks this target is sharded across (`distributed`)
    distributed: str | None = None  # how: "tensor" or "pipeline"
    vision: Vision | None = None  # its image side, for a vision-language checkpoint
