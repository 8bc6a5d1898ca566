"""GGUF files (llama.cpp, LM Studio, Ollama) to MLX checkpoints.

The GGUF is read with the ggml project's `gguf` package and staged, tensor by tensor, as a float32 Hugging
Face-layout checkpoint in a hidden folder beside the output: HF tensor names and config.json, llama.cpp's
conversion undone (the Q/K row permutation of `llama`, the +1 on Gemma RMSNorm weights) and a `tokenizer.json`
rebuilt from the GGUF vocabulary. `convert.convert` then writes the MLX checkpoint (dtype, quantization)
atomically; the staging folder is removed whatever happens.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from ..seams.errors import SpecError

ARCHS = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
         "qwen3": ("qwen3", "Qwen3ForCausalLM"), "gemma3": ("gemma3_text", "Gemma3ForCausalLM")}
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
         "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "ffn_norm": "post_attention_layernorm"}
GEMMA_LAYER = {**LAYER, "ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"}
VISION = ("v.", "mm.")  # the vision tower some files (Ollama's Gemma 3) carry beside the text model
SHARD_BYTES = 1 << 30
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>")
# tokenizer.ggml.pre -> the Hugging Face pre-tokenizer of that family (regexes as in the published tokenizer.json)
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
LLAMA3_REGEX = QWEN2_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
PRE = {"gpt-2": "gpt2", "default": "gpt2", "smollm": "digits", "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2",
       "llama-bpe": "llama3", "smaug-bpe": "llama3"}


def read(path: Path) -> tuple[dict, dict]:
    """The metadata and tensors (memory-mapped) of a GGUF file; anything that is not one is a SpecError."""
    from gguf import GGUFReader

    if not path.is_file():
        raise SpecError(f"{path} does not exist or is not a file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise SpecError(f"{path} is not a GGUF file (no GGUF magic number)")
    try:
        reader = GGUFReader(path)
        meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        return meta, {t.name: t for t in reader.tensors}
    except Exception as e:  # unknown tensor type ids, truncated files, ...
        raise SpecError(f"could not read GGUF file {path} ({type(e).__name__}: {e})") from None


def f32(x: float) -> float:
    """A float32 metadata value as the short decimal it was written from (9.99999997e-07 -> 1e-06)."""
    return float(str(np.float32(x)))


def check(path: Path, meta: dict, tensors: dict) -> str:
    """The architecture, once the file is known to be importable; otherwise a SpecError naming the problem."""
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise SpecError(f"GGUF architecture {arch!r} of {path.name} is not supported: supported are "
                        f"{', '.join(ARCHS)}")
    if meta.get("split.count", 1) > 1:
        raise SpecError(f"{path.name} is one part of a split GGUF: merge the parts first "
                        "(llama-gguf-split --merge FIRST-PART OUT.gguf)")
    bad = sorted({t.tensor_type.name for t in tensors.values()} - set(TYPES))
    if bad:
        raise SpecError(f"{path.name} holds tensors of type {', '.join(bad)}, which cannot be imported: supported "
                        f"types are {', '.join(TYPES)}")
    unknown = [name for name in tensors if name != "rope_freqs.weight" and hf_name(arch, name) is None]
    if unknown:
        raise SpecError(f"{path.name} holds tensors with no Hugging Face {arch} counterpart ({', '.join(unknown[:3])}"
                        f"{', ...' if len(unknown) > 3 else ''}): mixture-of-experts and multimodal files are not "
                        "supported")
    if meta.get("tokenizer.ggml.model") not in ("gpt2", "llama"):
        raise SpecError(f"tokenizer model {meta.get('tokenizer.ggml.model')!r} of {path.name} is not supported: "
                        "supported are gpt2 (byte-level BPE) and llama (SentencePiece)")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if meta["tokenizer.ggml.model"] == "gpt2" and pre not in PRE:
        raise SpecError(f"pre-tokenizer {pre!r} of {path.name} is not supported: supported are {', '.join(PRE)}")
    return arch


def hf_name(arch: str, name: str) -> str | None:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight (None for a tensor with no counterpart)."""
    stem, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    if stem in TOP_LEVEL:
        return f"{TOP_LEVEL[stem]}.{kind}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    layer = (GEMMA_LAYER if arch == "gemma3" else LAYER).get(m.group(2)) if m else None
    return f"model.layers.{m.group(1)}.{layer}.{kind}" if layer else None


def rope_scaling(meta: dict, arch: str, freqs: np.ndarray | None, theta: float, head_dim: int) -> dict | None:
    """HF rope_scaling from the GGUF keys, or Llama 3's from the per-dimension `rope_freqs` factors."""
    kind, factor = meta.get(f"{arch}.rope.scaling.type", "none"), meta.get(f"{arch}.rope.scaling.factor", 1.0)
    if freqs is not None:
        # llama.cpp writes the factors of HF's llama3 scaling; published Llama 3.x use these three values
        low, high, original = 1.0, 4.0, meta.get(f"{arch}.rope.scaling.original_context_length", 8192)
        factor = float(freqs.max())
        wavelen = 2 * np.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
        smooth = np.clip((original / wavelen - low) / (high - low), 0, 1)
        if not np.allclose(freqs, 1 / ((1 - smooth) / factor + smooth), rtol=1e-4):
            raise SpecError("the rope_freqs tensor of this GGUF is not a Llama 3 RoPE scaling: cannot import it")
        return {"rope_type": "llama3", "factor": f32(factor), "low_freq_factor": low, "high_freq_factor": high,
                "original_max_position_embeddings": original}
    if kind == "linear" and factor != 1.0:
        return {"rope_type": "linear", "factor": f32(factor)}
    if kind == "yarn":
        return {"rope_type": "yarn", "factor": f32(factor),
                "original_max_position_embeddings": meta[f"{arch}.rope.scaling.original_context_length"]}
    if kind not in ("none", "linear"):
        raise SpecError(f"RoPE scaling {kind!r} is not supported: supported are linear, yarn and Llama 3's")
    return None


def sliding_pattern(meta: dict, layers: int) -> int:
    """Gemma 3's every-n-th-layer-global pattern as llama.cpp reads it: 1 (all global) without a window, else
    the pattern key when there is one, else 6."""
    if not meta.get("gemma3.attention.sliding_window"):
        return 1
    value = meta.get("gemma3.attention.sliding_window_pattern", 6)
    if isinstance(value, int):
        return value
    for n in range(1, layers + 1):  # per-layer flags (True = sliding)
        if list(value) == [(i + 1) % n != 0 for i in range(layers)]:
            return n
    raise SpecError("this Gemma 3 GGUF has an irregular sliding-window layer pattern: cannot import it")


def hf_config(meta: dict, arch: str, tensors: dict, eos: list[int]) -> dict:
    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    hidden, heads, layers = get("embedding_length"), get("attention.head_count"), get("block_count")
    head_dim = get("attention.key_length", hidden // heads)
    theta = f32(get("rope.freq_base", 10000.0))
    model_type, architecture = ARCHS[arch]
    config = {
        "architectures": [architecture], "model_type": model_type, "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"), "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim, "vocab_size": int(tensors["token_embd.weight"].shape[1]),
        "max_position_embeddings": get("context_length", 4096),
        "rms_norm_eps": f32(get("attention.layer_norm_rms_epsilon", 1e-6)), "rope_theta": theta,
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"), "eos_token_id": eos[0] if len(eos) == 1 else eos,
    }
    if arch == "gemma3":
        pattern = sliding_pattern(meta, layers)
        config.update(
            hidden_activation="gelu_pytorch_tanh", sliding_window=get("attention.sliding_window", 4096),
            sliding_window_pattern=pattern, rope_local_base_freq=f32(get("rope.freq_base_swa", 10000.0)),
            layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)],
            # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B (62 layers): hidden / heads
            query_pre_attn_scalar=hidden // heads if layers == 62 else head_dim,
            final_logit_softcapping=get("final_logit_softcapping"), attn_logit_softcapping=None)
    else:
        config["hidden_act"] = "silu"
    if arch == "llama":
        config.update(attention_bias="blk.0.attn_q.bias" in tensors, mlp_bias="blk.0.ffn_gate.bias" in tensors)
    freqs = tensors.get("rope_freqs.weight")
    scaling = rope_scaling(meta, arch, None if freqs is None else np.asarray(freqs.data, np.float32), theta, head_dim)
    if scaling:
        config["rope_scaling"] = scaling
    return config


def weight(tensor, arch: str, config: dict) -> np.ndarray:
    """One tensor, dequantized to float32 in HF layout."""
    from gguf import quants

    shape = [int(d) for d in reversed(tensor.shape)]
    w = quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
    name = tensor.name
    if arch == "llama" and re.search(r"\.attn_[qk]\.", name):
        # llama.cpp permutes each head's rows from HF's rotate-half layout to interleaved pairs: undo it
        heads = config["num_attention_heads" if ".attn_q." in name else "num_key_value_heads"]
        w = w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    if arch == "gemma3" and name.endswith("norm.weight"):
        w = w - 1.0  # GGUF stores Gemma's effective RMSNorm scale 1 + w
    return np.ascontiguousarray(w, dtype=np.float32)


def write_weights(tensors: dict, arch: str, config: dict, out: Path) -> None:
    """Float32 safetensors shards of at most SHARD_BYTES (one tensor larger than that gets its own)."""
    from safetensors.numpy import save_file

    shard, size, count = {}, 0, 0
    for name, tensor in tensors.items():
        if name == "rope_freqs.weight":
            continue
        w = weight(tensor, arch, config)
        if shard and size + w.nbytes > SHARD_BYTES:
            count += 1
            save_file(shard, str(out / f"model-{count:05d}.safetensors"), metadata={"format": "pt"})
            shard, size = {}, 0
        shard[hf_name(arch, name)] = w
        size += w.nbytes
    save_file(shard, str(out / f"model-{count + 1:05d}.safetensors"), metadata={"format": "pt"})


def spm_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece vocabulary: every split of a normal piece into two normal pieces, ranked
    by the merged piece's score (SentencePiece merges the highest-scoring pair first)."""
    normal = {t: i for i, t in enumerate(tokens) if types[i] == NORMAL}
    merges = []
    for piece, i in normal.items():
        for cut in range(1, len(piece)):
            if piece[:cut] in normal and piece[cut:] in normal:
                merges.append((-scores[i], i, normal[piece[:cut]], piece[:cut], piece[cut:]))
    return [(left, right) for *_, left, right in sorted(merges)]


def build_tokenizer(meta: dict, tokens: list[str], types: list[int]):
    """A `tokenizers.Tokenizer` equivalent to llama.cpp's for this vocabulary."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    vocab = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    if meta["tokenizer.ggml.model"] == "gpt2":
        pre = PRE[meta.get("tokenizer.ggml.pre", "default")]
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=pre == "llama3"))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre in ("gpt2", "digits"))
        if pre in ("qwen2", "llama3"):
            split = pre_tokenizers.Split(Regex(QWEN2_REGEX if pre == "qwen2" else LLAMA3_REGEX), "isolated")
            tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
        elif pre == "digits":
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            tok.pre_tokenizer = byte_level
        if pre == "qwen2":
            tok.normalizer = normalizers.NFC()
        tok.decoder = decoders.ByteLevel()
    else:  # SentencePiece pieces with scores: BPE over "▁"-escaped text with byte fallback
        merges = spm_merges(tokens, types, meta["tokenizer.ggml.scores"])
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=None if unk is None else tokens[unk], fuse_unk=True,
                                   byte_fallback=True))
        prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁")] * prefix + [normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                        + [decoders.Strip(" ", 1, 0)] * prefix)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if add_bos(meta) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A",
                                                           pair=f"{tokens[bos]} $A {tokens[bos]} $B",
                                                           special_tokens=[(tokens[bos], bos)])
    return tok


def add_bos(meta: dict) -> bool:
    """llama.cpp's default: SentencePiece and Llama 3 vocabularies start with BOS unless the file says not."""
    default = meta["tokenizer.ggml.model"] == "llama" or PRE.get(meta.get("tokenizer.ggml.pre")) == "llama3"
    return bool(meta.get("tokenizer.ggml.add_bos_token", default))


def end_ids(meta: dict, tokens: list[str], types: list[int]) -> list[int]:
    """The end-of-generation ids llama.cpp stops on: eos / eot / eom and the known end-of-turn control tokens."""
    ids = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    ids += [i for i, t in enumerate(tokens) if types[i] == CONTROL and t in END_OF_TURN]
    return list(dict.fromkeys(i for i in ids if i is not None))


def write_tokenizer(meta: dict, tokens: list[str], types: list[int], eos: list[int], context: int,
                    out: Path) -> None:
    """tokenizer.json, tokenizer_config.json (special tokens, chat template), generation_config.json."""
    build_tokenizer(meta, tokens, types).save(str(out / "tokenizer.json"))
    special = {f"{k}_token": tokens[i] for k in ("bos", "eos", "unk", "pad")
               if (i := meta.get(f"tokenizer.ggml.{'padding' if k == 'pad' else k}_token_id")) is not None}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, **special,
              "add_bos_token": add_bos(meta), "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token")),
              "clean_up_tokenization_spaces": False, "model_max_length": context}
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False))
    generation = {"bos_token_id": meta.get("tokenizer.ggml.bos_token_id"), "eos_token_id": eos,
                  "pad_token_id": meta.get("tokenizer.ggml.padding_token_id")}
    (out / "generation_config.json").write_text(json.dumps({k: v for k, v in generation.items() if v is not None}))


def stage(meta: dict, tensors: dict, dtype: str, out: Path) -> None:
    """Write the HF-layout checkpoint of a checked GGUF file into the empty folder `out`: float32 weights,
    `dtype` declared."""
    arch, tokens = meta["general.architecture"], meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    eos = end_ids(meta, tokens, types)
    config = hf_config(meta, arch, tensors, eos)
    write_tokenizer(meta, tokens, types, eos, config["max_position_embeddings"], out)
    write_weights(tensors, arch, config, out)
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}, indent=2))


def default_dtype(arch: str) -> str:
    """float32 off macOS (the fastest on CPUs); on a Mac float16, bfloat16 for Gemma (whose activations
    overflow float16)."""
    if sys.platform != "darwin":
        return "float32"
    return "bfloat16" if arch == "gemma3" else "float16"


def convert_gguf(gguf_path: str | Path, mlx_path: str | Path, quantize: bool = False, q_bits: int = 4,
                 q_group_size: int = 64, dtype: str | None = None) -> Path:
    """Convert a GGUF file (architectures llama, qwen2, qwen3, gemma3) to an MLX checkpoint directory."""
    from ..seams.files import staging
    from .convert import convert

    path, out = Path(gguf_path).expanduser(), Path(mlx_path).expanduser()
    if out.exists():
        raise SpecError(f"{out} already exists: choose a new --mlx-path or delete it")
    meta, tensors = read(path)
    vision = [name for name in tensors if name.startswith(VISION)]
    if vision:
        print(f"[INFO] Leaving out {len(vision)} vision-tower tensors: the import is the text model")
        tensors = {name: t for name, t in tensors.items() if name not in vision}
    arch = check(path, meta, tensors)
    dtype = dtype or default_dtype(arch)
    with staging(out, f"import of {path}") as work:
        stage(meta, tensors, dtype, work)
        print(f"[INFO] Staged {path.name} as a Hugging Face checkpoint")
        return convert(str(work), str(out), quantize=quantize, q_bits=q_bits, q_group_size=q_group_size,
                       dtype=dtype)
