"""GGUF import: files written here the way llama.cpp's convert_hf_to_gguf.py writes them (its tensor names,
metadata and tokenizer keys, the Q/K row permutation of `llama`, Gemma's 1 + w norms) come back as MLX
checkpoints with the source model's logits and tokenizer."""

import io
import json
import shutil
import sysconfig
from pathlib import Path

import gguf
import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from helpers import PROMPT, plain_greedy
from safetensors.numpy import load_file, save_file

import mlx_spec
from mlx_spec.seams.errors import SpecError
from mlx_spec.commands.from_gguf import convert_gguf

ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
        "gemma3": gguf.MODEL_ARCH.GEMMA3}
# pre-tokenizers of the published tokenizer.json files that llama.cpp names by these tokenizer.ggml.pre values
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
PRE = {
    "gpt-2": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                "use_regex": True}},
    "smollm": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}},
    "qwen2": {"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": SPLIT % ""}, "behavior": "Isolated", "invert": False}, BYTE_LEVEL]}},
    "llama-bpe": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": SPLIT % "{1,3}"}, "behavior": "Isolated", "invert": False},
        BYTE_LEVEL]}},
}
TEXTS = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 12345 3.14\n",
         "naïve café — 東京 🚀 Ünïcödé cafe\u0301 n\u0303\t\ttabs   spaces\n\n\nlines",
         "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "I've 'RE 'll don't 1234567 a1b22c333"]
SPM_CONTROL, SPM_USER = ["<start_of_turn>", "<end_of_turn>"], ["\n", "\n\n", "<h1>"]
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                  "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}  # fp16 d (dmin)
MIXED = {"embed_tokens": Q.Q8_0, "q_proj": Q.Q4_0, "k_proj": Q.Q5_0, "v_proj": Q.Q4_1, "o_proj": Q.Q5_1,
         "gate_proj": Q.F16, "up_proj": Q.BF16, "down_proj": Q.Q8_0, "lm_head": Q.Q4_0}
K_MIXED = {"embed_tokens": Q.Q6_K, "q_proj": Q.Q4_K, "k_proj": Q.Q4_K, "v_proj": Q.Q2_K, "o_proj": Q.Q3_K,
           "gate_proj": Q.Q5_K, "up_proj": Q.Q5_K, "down_proj": Q.Q6_K, "lm_head": Q.Q6_K}


# --- the test's own model of llama.cpp's converter ---------------------------------------------------------

def permute(w, n_head):
    """LlamaModel.permute: each head's rows from rotate-half order to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def k_quant_blocks(shape, qtype, rng):
    """Random K-quant blocks (gguf cannot quantize to K-quants) scaled to weights of std 2/sqrt(columns)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (shape[0], shape[1] // block, size), dtype=np.uint8)
    for offset in K_SCALES[qtype]:
        blocks[..., offset:offset + 2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    blocks = blocks.reshape(shape[0], -1)
    scale = 2 / np.sqrt(shape[1]) / gguf.quants.dequantize(blocks, qtype).std()
    blocks = blocks.reshape(shape[0], shape[1] // block, size)
    for offset in K_SCALES[qtype]:
        blocks[..., offset:offset + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return blocks.reshape(shape[0], -1)


def encode(w, qtype, rng):
    """(GGUF payload, its float32 value), both in HF row order."""
    if qtype == Q.F32:
        return w, w
    if qtype == Q.F16:
        return w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    data = k_quant_blocks(w.shape, qtype, rng) if qtype in K_SCALES else gguf.quants.quantize(w, qtype)
    return data, gguf.quants.dequantize(data, qtype).reshape(w.shape)


def gpt2_vocab(tokenizer_dir):
    """get_vocab_base: tokens by id, added special tokens CONTROL and other added tokens USER_DEFINED."""
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    tokens = {i: t for t, i in spec["model"]["vocab"].items()}
    types = {i: gguf.TokenType.NORMAL for i in tokens}
    for added in spec["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return [tokens[i] for i in range(len(tokens))], [types[i] for i in range(len(tokens))], merges


def write_gguf(path, src, arch, qtypes=None, pre="gpt-2", spm=None, pattern=None, extra=None, seed=0):
    """Write `src` (an HF checkpoint) as llama.cpp would; `qtypes` maps HF name fragments to tensor types
    (default F32), `extra` adds tensors by GGUF name. Returns the float32 HF weights that the file holds (its
    dequantized content)."""
    config = json.loads((src / "config.json").read_text())
    tok_config = json.loads((src / "tokenizer_config.json").read_text())
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[ARCH[arch]])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
    if arch == "llama":
        w.add_vocab_size(config["vocab_size"])
        w.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") in ("linear", "yarn"):  # llama3 scaling is written as the rope_freqs tensor
        w.add_rope_scaling_type(gguf.RopeScalingType(scaling["rope_type"]))
        w.add_rope_scaling_factor(scaling["factor"])
        if "original_max_position_embeddings" in scaling:
            w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    if arch == "gemma3" and config["sliding_window_pattern"] != 1:
        w.add_rope_freq_base_swa(config["rope_local_base_freq"])
        w.add_sliding_window(config["sliding_window"])
        if pattern:
            w.add_sliding_window_pattern(pattern)
    if spm is None:
        tokens, types, merges = gpt2_vocab(src)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_eos_token_id(tokens.index(tok_config["eos_token"]))
        w.add_pad_token_id(tokens.index(tok_config["pad_token"]))
        w.add_add_bos_token(tok_config["add_bos_token"])
        w.add_chat_template(tok_config["chat_template"])
    else:  # _create_vocab_sentencepiece, then the added tokens of tokenizer_config.json
        pieces = [spm.id_to_piece(i) for i in range(spm.get_piece_size())]
        types = [gguf.TokenType.UNKNOWN if spm.is_unknown(i) else gguf.TokenType.CONTROL if spm.is_control(i)
                 else gguf.TokenType.BYTE if spm.is_byte(i) else gguf.TokenType.NORMAL for i in range(len(pieces))]
        for i, piece in enumerate(pieces):
            if piece in SPM_USER:
                pieces[i], types[i] = piece.replace("▁", " "), gguf.TokenType.USER_DEFINED
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(pieces)
        w.add_token_scores([spm.get_score(i) for i in range(len(pieces))])
        w.add_token_types(types)
        w.add_bos_token_id(spm.bos_id())
        w.add_eos_token_id(spm.eos_id())
        w.add_unk_token_id(spm.unk_id())
        w.add_pad_token_id(spm.pad_id())
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(False)
        w.add_chat_template(GEMMA_TEMPLATE)
    names = gguf.get_tensor_name_map(ARCH[arch], config["num_hidden_layers"])
    held = {}
    for name, value in load_file(str(src / "model.safetensors")).items():
        qtype = next((t for part, t in (qtypes or {}).items() if part in name), Q.F32) if value.ndim == 2 else Q.F32
        data, held[name] = encode(value, qtype, rng)
        if arch == "gemma3" and name.endswith("norm.weight"):
            data = data + 1  # Gemma3RMSNorm multiplies by 1 + w
        if arch == "llama" and ("q_proj" in name or "k_proj" in name):
            data = permute(data, config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"])
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        w.add_tensor(gguf_name, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    for name, data in (extra or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def reference(dst, src, weights, pre="gpt-2", **config_updates):
    """A float32 HF checkpoint of what a GGUF holds, with the tokenizer that its `pre` names."""
    dst.mkdir()
    for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    spec = json.loads((src / "tokenizer.json").read_text())
    spec.update(PRE[pre])
    spec["model"]["ignore_merges"] = pre == "llama-bpe"
    (dst / "tokenizer.json").write_text(json.dumps(spec))
    config = {**json.loads((src / "config.json").read_text()), **config_updates}
    (dst / "config.json").write_text(json.dumps(config))
    save_file(weights, str(dst / "model.safetensors"))
    return dst


def random_checkpoint(dst, tokenizer_src, config, seed):
    """A random float32 checkpoint of `config` (llama or qwen2 layout) with the tiny tokenizer."""
    rng = np.random.default_rng(seed)
    h, inter, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    nq, nkv, v = config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (nq * hd, h), p + "self_attn.k_proj.weight": (nkv * hd, h),
                       p + "self_attn.v_proj.weight": (nkv * hd, h), p + "self_attn.o_proj.weight": (h, nq * hd),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
        if config["model_type"] == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": (nq * hd,), p + "self_attn.k_proj.bias": (nkv * hd,),
                           p + "self_attn.v_proj.bias": (nkv * hd,)})
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("bias"):
            w = 0.5 * rng.standard_normal(shape)
        elif len(shape) == 1:
            w = 1 + 0.1 * rng.standard_normal(shape)
        else:
            w = (0.5 if "embed" in name or "lm_head" in name else 2 / np.sqrt(shape[1])) * rng.standard_normal(shape)
        weights[name] = w.astype(np.float32)
    return reference(dst, tokenizer_src, weights, **config)


@pytest.fixture(scope="module")
def spm():
    """A SentencePiece BPE model of Gemma's kind (no dummy prefix, byte fallback, identity normalization)."""
    import sentencepiece as spm

    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for line in text.splitlines() if line.strip()]), model_writer=proto,
        vocab_size=512, model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        add_dummy_prefix=False, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, pad_id=0,
        eos_id=1, bos_id=2, unk_id=3, control_symbols=SPM_CONTROL, user_defined_symbols=SPM_USER, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=proto.getvalue())


# --- checks ------------------------------------------------------------------------------------------------

def logits(path, tokens):
    model, _ = mlx_lm.load(str(path))
    return np.array(model(mx.array([tokens]))[0].astype(mx.float32))


def assert_same_logits(out, ref, vocab):
    """Bit for bit, but for Gemma's norms (w + 1 - 1 in float32 rounds)."""
    tokens = np.random.default_rng(1).integers(0, vocab, 40).tolist()  # longer than Gemma's window of 16
    got, want = logits(out, tokens), logits(ref, tokens)
    gemma = json.loads((out / "config.json").read_text())["model_type"] == "gemma3_text"
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max() if gemma else 0)


def assert_same_tokenizer(out, ref):
    _, got = mlx_lm.load(str(out))
    _, want = mlx_lm.load(str(ref))
    for text in TEXTS:
        ids = want.encode(text)
        assert got.encode(text) == ids, text
        assert got.decode(ids) == want.decode(ids)
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! 東京"}]
    assert got.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        want.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def assert_generates(out, ref):
    engine = mlx_spec.load(str(out), drafter="off")
    ids = engine.encode(PROMPT)
    result = mlx_spec.generate(engine, ids, max_tokens=12)
    assert result.tokens == plain_greedy(ref, ids, 12)


def imported(tmp_path, src, arch, **kwargs):
    """(the import of `src` written as a GGUF, the float32 checkpoint of what the GGUF holds)."""
    held = write_gguf(tmp_path / "model.gguf", src, arch, **kwargs)
    out = convert_gguf(tmp_path / "model.gguf", tmp_path / "mlx", dtype="float32")
    return out, held


@pytest.fixture(scope="module")
def qwen2(tiny, tmp_path_factory):
    """A qwen2 checkpoint (q/k/v biases, no q/k norms, head_dim = hidden / heads) with the tiny tokenizer."""
    source = json.loads((tiny["qwen3"] / "config.json").read_text())
    config = {**source, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "head_dim": 16,
              "num_hidden_layers": 2, "rope_theta": 1000000.0}
    return random_checkpoint(tmp_path_factory.mktemp("qwen2") / "hf", tiny["qwen3"], config, seed=5)


@pytest.mark.parametrize("arch,pre", [("llama", "smollm"), ("qwen2", "qwen2"), ("qwen3", "qwen2")])
def test_float32_import_is_exact(tiny, qwen2, tmp_path, arch, pre):
    src = qwen2 if arch == "qwen2" else tiny[arch]
    out, held = imported(tmp_path, reference(tmp_path / "src", src, load_file(str(src / "model.safetensors")),
                                             pre), arch, pre=pre)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == arch and config["tie_word_embeddings"] == ("lm_head.weight" not in held)
    assert_same_logits(out, tmp_path / "src", config["vocab_size"])
    assert_same_tokenizer(out, tmp_path / "src")
    assert_generates(out, tmp_path / "src")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("scheme", ["F16", "Q8_0", "Q4_0", "mixed"])
def test_quantized_import_matches_the_dequantized_weights(tiny, qwen2, spm, tmp_path, arch, scheme):
    src = qwen2 if arch == "qwen2" else tiny[arch]
    qtypes = MIXED if scheme == "mixed" else {"": Q[scheme]}
    out, held = imported(tmp_path, src, arch, qtypes=qtypes, spm=spm if arch == "gemma3" else None)
    updates = {"sliding_window_pattern": 6} if arch == "gemma3" else {}
    assert_same_logits(out, reference(tmp_path / "ref", src, held, **updates), 512)


def test_k_quants(tiny, tmp_path):
    """Q2_K..Q6_K (random blocks, rows of 256) through the llama Q/K un-permutation."""
    source = json.loads((tiny["llama"] / "config.json").read_text())
    config = {**source, "hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "num_hidden_layers": 2}
    src = random_checkpoint(tmp_path / "hf", tiny["llama"], config, seed=6)
    out, held = imported(tmp_path, src, "llama", qtypes=K_MIXED)
    assert_same_logits(out, reference(tmp_path / "ref", src, held), 512)


def test_gemma3_spm_tokenizer_and_layer_pattern(tiny, spm, tmp_path):
    """Gemma 3 as llama.cpp writes it: SentencePiece vocabulary with scores, 1 + w norms, no layer pattern key
    (llama.cpp's fixed every-6th-layer-global applies)."""
    sp = spm
    out, held = imported(tmp_path, tiny["gemma3"], "gemma3", spm=sp)
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["sliding_window"], config["sliding_window_pattern"]) == ("gemma3_text", 16, 6)
    ref = reference(tmp_path / "ref", tiny["gemma3"], held, sliding_window_pattern=6)
    assert_same_logits(out, ref, 512)
    assert_generates(out, ref)
    _, tok = mlx_lm.load(str(out))
    for text in [*TEXTS, "<start_of_turn>user\nhi<end_of_turn>\n<h1>x\n\n\n"]:
        want = [sp.bos_id()]
        for i, part in enumerate(text.split("<start_of_turn>")):  # control tokens are matched as text
            want += [sp.piece_to_id("<start_of_turn>")] * (i > 0)
            for j, piece in enumerate(part.split("<end_of_turn>")):
                want += [sp.piece_to_id("<end_of_turn>")] * (j > 0) + sp.encode(piece)
        assert tok.encode(text) == want, text
        assert tok.decode(want, skip_special_tokens=True) == sp.decode(want)
    assert tok.bos_token == "<s>" and 1 in tok.eos_token_ids
    assert tok.chat_template == GEMMA_TEMPLATE


@pytest.mark.parametrize("pattern", [3, 1])
def test_gemma3_layer_pattern_key(tiny, spm, tmp_path, pattern):
    """A file that states its per-layer sliding pattern keeps it (the tiny Gemma's every third layer), one without
    a window (sliding_window_pattern 1) is all global; a vision tower in the file (as in Ollama's Gemma 3) is left
    out."""
    src = reference(tmp_path / "src", tiny["gemma3"], load_file(str(tiny["gemma3"] / "model.safetensors")),
                    sliding_window_pattern=pattern)
    flags = [(i + 1) % pattern != 0 for i in range(json.loads((src / "config.json").read_text())["num_hidden_layers"])]
    vision = {"v.patch_embd.weight": np.ones((8, 4), np.float32), "mm.input_projection.weight": np.ones(4, np.float32)}
    out, _ = imported(tmp_path, src, "gemma3", spm=spm, pattern=flags, extra=vision)
    assert json.loads((out / "config.json").read_text())["sliding_window_pattern"] == pattern
    assert_same_logits(out, src, 512)


def test_llama3_bpe_tokenizer_and_rope_freqs(tiny, tmp_path):
    """Llama 3 style: llama-bpe pre-tokenizer and the rope_freqs tensor llama.cpp writes for llama3 RoPE
    scaling, read back as HF's rope_scaling."""
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    src = reference(tmp_path / "src", tiny["llama"], load_file(str(tiny["llama"] / "model.safetensors")),
                    "llama-bpe", rope_theta=500000.0, rope_scaling=scaling, head_dim=64, num_attention_heads=2,
                    num_key_value_heads=1)
    dim, base = 64, 500000.0  # LlamaModel.generate_extra_tensors
    wavelen = 2 * np.pi * base ** (np.arange(0, dim, 2) / dim)
    factors = [1.0 if w < 8192 / 4 else 32.0 if w > 8192 else
               1 / ((1 - (8192 / w - 1) / 3) / 32 + (8192 / w - 1) / 3) for w in wavelen]
    write_gguf(tmp_path / "model.gguf", src, "llama", pre="llama-bpe",
               extra={"rope_freqs.weight": np.array(factors, np.float32)})
    out = convert_gguf(tmp_path / "model.gguf", tmp_path / "mlx", dtype="float32")
    assert json.loads((out / "config.json").read_text())["rope_scaling"] == scaling
    assert_same_logits(out, src, 512)
    assert_same_tokenizer(out, src)


@pytest.mark.parametrize("arch,scaling", [
    ("gemma3", {"rope_type": "linear", "factor": 8.0}),  # Gemma 3 4B and up: global layers only
    ("qwen3", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})])
def test_rope_scaling_keys(tiny, spm, tmp_path, arch, scaling):
    gemma = {"sliding_window_pattern": 6, "rope_local_base_freq": 20000.0}
    updates = {"rope_scaling": scaling, **(gemma if arch == "gemma3" else {})}
    src = reference(tmp_path / "src", tiny[arch], load_file(str(tiny[arch] / "model.safetensors")), **updates)
    out, _ = imported(tmp_path, src, arch, spm=spm if arch == "gemma3" else None)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"] == scaling
    assert config.get("rope_local_base_freq") == updates.get("rope_local_base_freq")
    assert_same_logits(out, src, 512)


@pytest.mark.parametrize("case", ["arch", "tensor-type", "not-gguf", "missing"])
def test_refusals_leave_nothing(tmp_path, case):
    path, parent = tmp_path / "in.gguf", tmp_path / "out"
    parent.mkdir()
    if case == "not-gguf":
        path.write_text("hello")
    elif case != "missing":
        w = gguf.GGUFWriter(str(path), "phi3" if case == "arch" else "llama")
        block, size = gguf.GGML_QUANT_SIZES[Q.IQ4_NL]
        w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 64 // block * size), np.uint8), raw_dtype=Q.IQ4_NL)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    with pytest.raises(SpecError) as error:
        convert_gguf(path, parent / "mlx", dtype="float32")
    message = str(error.value)
    assert "\n" not in message
    expected = {"arch": ["'phi3'", "llama, qwen2, qwen3, gemma3"], "tensor-type": ["IQ4_NL", "Q4_K"],
                "not-gguf": ["not a GGUF file"], "missing": ["does not exist"]}[case]
    assert all(fragment in message for fragment in expected), message
    assert list(parent.iterdir()) == []


def test_quantize_on_import(tiny, tmp_path):
    write_gguf(tmp_path / "model.gguf", tiny["qwen3"], "qwen3", qtypes={"": Q.Q4_0})
    out = convert_gguf(tmp_path / "model.gguf", tmp_path / "mlx", quantize=True, q_bits=8, q_group_size=32)
    quantization = json.loads((out / "config.json").read_text())["quantization"]
    assert (quantization["bits"], quantization["group_size"]) == (8, 32)
    engine = mlx_spec.load(str(out), drafter="off")
    assert mlx_spec.generate(engine, PROMPT, max_tokens=8).tokens


def test_existing_output_is_refused(tiny, tmp_path):
    write_gguf(tmp_path / "model.gguf", tiny["qwen3"], "qwen3")
    (tmp_path / "mlx").mkdir()
    with pytest.raises(SpecError, match="already exists"):
        convert_gguf(tmp_path / "model.gguf", tmp_path / "mlx")


def test_the_cli_converts_a_gguf_and_runs_it(tiny, tmp_path):
    from helpers import assert_one_line_error, run_cli

    write_gguf(tmp_path / "model.gguf", tiny["llama"], "llama", qtypes={"": Q.Q8_0}, pre="smollm")
    proc = run_cli("convert", "--hf-path", str(tmp_path / "model.gguf"), "--mlx-path", str(tmp_path / "mlx"),
                   "--dtype", "float32")
    assert proc.returncode == 0 and f"Wrote {tmp_path / 'mlx'}" in proc.stdout, proc.stderr
    proc = run_cli("generate", "--model", str(tmp_path / "mlx"), "--drafter", "ngram", "--prompt", PROMPT, "--raw",
                   "--max-tokens", "8", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["stats"]["generated_tokens"] == 8, proc.stderr
    proc = run_cli("convert", "--add-mtp", "--hf-path", str(tmp_path / "model.gguf"), "--mlx-path", str(tmp_path))
    assert_one_line_error(proc, "no MTP layer")
