"""An EAGLE-3 head's published forward, transcribed in NumPy (float64) from `speculators`' Eagle3DraftModel and
vLLM's llama_eagle3.py, independently of mlx-spec: fc over the target's features (after `norm_before_fc`'s
one norm or `fc_norm`'s per-layer norms), a first decoder layer over [norm(embedding); hidden_norm(x)], plain
Llama / Qwen3 decoder layers after it, causal attention (within `sliding_window` for sliding layers), RoPE as
Hugging Face computes it (default or llama3 scaling), and the state fed back: g, or norm(g) with norm_output."""

import numpy as np


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def inverse_frequencies(rope: dict, dims: int) -> np.ndarray:
    """transformers' `_compute_default_rope_parameters` / `_compute_llama3_parameters`."""
    inv = 1.0 / rope["rope_theta"] ** (np.arange(0, dims, 2) / dims)
    if rope.get("rope_type", "default") == "default":
        return inv
    assert rope["rope_type"] == "llama3"
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    wavelength = 2 * np.pi / inv
    scaled = np.where(wavelength > old / low, inv / factor, inv)
    smooth = (old / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < old / high) & ~(wavelength > old / low)
    return np.where(medium, smoothed, scaled)


def rotate(x, positions, inv):
    """x (n, heads, d) rotated at `positions`, halves rotated (transformers' rotate_half)."""
    angles = positions[:, None] * inv[None]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    half = x.shape[-1] // 2
    return np.concatenate([x[..., :half] * cos - x[..., half:] * sin, x[..., :half] * sin + x[..., half:] * cos], -1)


class NumpyEagle3:
    """`layer` (the decoder fields: hidden_size, heads, head_dim, rms_norm_eps, model_type, rope, layer_types,
    sliding_window) and `head` (norm_before_residual, norm_before_fc, fc_norm, norm_output, vocab_size) as
    the published config means them; `weights` named `layers.N.*` (or `midlayer.*`)."""

    def __init__(self, weights: dict, layer: dict, head: dict):
        self.w = {k.replace("midlayer.", "layers.0."): v.astype(np.float64) for k, v in weights.items()}
        self.layer, self.head = layer, head
        self.count = layer.get("num_hidden_layers", 1)
        self.keys = [[] for _ in range(self.count)]
        self.values = [[] for _ in range(self.count)]
        self.position = 0
        self.inv = inverse_frequencies(layer["rope"], layer["head_dim"])

    def project(self, features):
        w, eps, head = self.w, self.layer["rms_norm_eps"], self.head
        if head.get("norm_before_fc"):
            features = rms_norm(features, w["input_norm.weight"], eps)
        if head.get("fc_norm"):
            chunks = np.split(features, len(features[0]) // w["fc_norm.0.weight"].shape[0], axis=-1)
            features = np.concatenate([rms_norm(c, w[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(chunks)], -1)
        return features @ w["fc.weight"].T

    def attention(self, i, x, positions):
        w, c, p = self.w, self.layer, f"layers.{i}.self_attn."
        heads, kv_heads, d, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        n = x.shape[0]
        q = (x @ w[p + "q_proj.weight"].T).reshape(n, heads, d)
        k = (x @ w[p + "k_proj.weight"].T).reshape(n, kv_heads, d)
        if c["model_type"] == "qwen3":
            q, k = rms_norm(q, w[p + "q_norm.weight"], eps), rms_norm(k, w[p + "k_norm.weight"], eps)
        q = rotate(q, positions, self.inv)
        self.keys[i].append(rotate(k, positions, self.inv))
        self.values[i].append((x @ w[p + "v_proj.weight"].T).reshape(n, kv_heads, d))
        keys, values = np.concatenate(self.keys[i]), np.concatenate(self.values[i])
        visible = np.arange(len(keys))[None] <= positions[:, None]
        if (c.get("layer_types") or ["full_attention"] * self.count)[i] == "sliding_attention":
            visible &= np.arange(len(keys))[None] > positions[:, None] - c["sliding_window"]
        out = np.zeros((n, heads, d))
        for h in range(heads):
            scores = q[:, h] @ keys[:, h * kv_heads // heads].T / np.sqrt(d)
            scores[~visible] = -np.inf
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, h] = (weights / weights.sum(-1, keepdims=True)) @ values[:, h * kv_heads // heads]
        return out.reshape(n, -1) @ w[p + "o_proj.weight"].T

    def mlp(self, i, x):
        w, p = self.w, f"layers.{i}.mlp."
        gate, up = x @ w[p + "gate_proj.weight"].T, x @ w[p + "up_proj.weight"].T
        return (gate / (1 + np.exp(-gate)) * up) @ w[p + "down_proj.weight"].T

    def step(self, embeddings, x):
        """(what is fed back, logits over the target's vocabulary) for rows pairing `embeddings` with x (fc's
        output for verified rows, the fed-back state for draft rows)."""
        w, eps, n = self.w, self.layer["rms_norm_eps"], x.shape[0]
        positions = np.arange(self.position, self.position + n)
        self.position += n
        f = rms_norm(x, w["layers.0.hidden_norm.weight"], eps)
        both = np.concatenate([rms_norm(embeddings, w["layers.0.input_layernorm.weight"], eps), f], -1)
        a = (f if self.head.get("norm_before_residual") else x) + self.attention(0, both, positions)
        h = a + self.mlp(0, rms_norm(a, w["layers.0.post_attention_layernorm.weight"], eps))
        for i in range(1, self.count):
            h = h + self.attention(i, rms_norm(h, w[f"layers.{i}.input_layernorm.weight"], eps), positions)
            h = h + self.mlp(i, rms_norm(h, w[f"layers.{i}.post_attention_layernorm.weight"], eps))
        normed = rms_norm(h, w["norm.weight"], eps)
        logits = normed @ w["lm_head.weight"].T
        if "d2t" in w:  # a reduced vocabulary: target id = draft id + d2t[draft id], the rest -inf
            draft_scores, logits = logits, np.full((n, self.head["vocab_size"]), -np.inf)
            logits[:, np.arange(len(w["d2t"])) + w["d2t"].astype(int)] = draft_scores
        return (normed if self.head.get("norm_output") else h), logits
