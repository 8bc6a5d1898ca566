"""Every use of mlx-lm internals, in one place, with a self-check at first use.

mlx-spec relies on things mlx-lm does not promise to keep between releases:
- `RotatingKVCache._idx`, its ring-buffer write index (rollback of sliding-window caches, `visible_kv`), and the
  temporal order a multi-token update leaves its keys in (a tree's kept path, `caches.keep`);
- the order in which a Gated DeltaNet layer writes its `ArraysCache` on a single-token step (conv window
  first, recurrent state last: `RecurrentCache` records a position when the state is written), and the
  attributes and the bias-free depthwise conv of mlx-lm's GDN layers that the capturing layers in
  `models/qwen3_5.py` reimplement;
- swapping the class of a model's final norm and GDN layers (`swap_class`), found at `model.model.norm`;
- any other recurrent layer (`models/recurrence.py`): the innermost module handed an `ArraysCache`, its call taking
  the input first, then `cache` (and `mask`, None outside mlx-lm's own left-padded batches), and leaving in the
  cache all it needs to go on (the tests roll back Nemotron-H's Mamba 2 layers against mlx-lm step by step);
- the Gemma 4 `DecoderLayer` call `(x, mask, cache, per_layer_input, shared_kv=, offset=) -> (h, kv, offset)`;
- a model calling its decoder layers in order, each returning its output (`added_to_layers`, Qwen3-VL's deepstack);
- Gemma 4 given `input_embeddings` beside its ids: it multiplies them by its `embed_scale` (`input_scale`) and reads
  its per-layer embeddings at the ids (an image's features go in divided by the scale, its ids as padding);
- `rope_utils.initialize_rope(dims, base, traditional, scaling_config, max_position_embeddings)`, the rotary
  embedding of a block drafter;
- Llama's and Qwen3's `ModelArgs`, `Attention` (q/k/v projections applied to its input, whatever its width:
  EAGLE-3 widens them to 2 H), `MLP` and `TransformerBlock` `(x, mask, cache)`, which EAGLE-3 heads are built
  from;
- for token trees: attention layers that rotate with `self.rope(x, offset=cache.offset)` through
  `mx.fast.rope` (which takes one offset per batch row), and masks that come from `cache.make_mask`;
- for batches (ragged.py): the same rotation and masks with one offset per batch row (`cache.offset` an array)
  and a (B, 1, n, m) mask, sliding-window layers asking `make_mask` with their `window_size`, attention that
  takes a cache with `bits` for a quantized one, `check_batches` comparing each row with the model run on it
  alone;
- for `--distributed`: `Model.shard(group)` (tensor parallelism) and the inner model's `pipeline(group)`
  (`split_model`), whose forward passes exchange activations so that every rank ends with the same logits, and
  the `sharding_group` a sharded Qwen3.5 GDN layer and head carry (`models/qwen3_5.py` sums and gathers as
  mlx-lm's do); no single process can check these: every round the ranks compare what they accepted
  (`distributed.Lockstep.agree`), and the tests compare two ranks with one process;
- for nextn MTP layers (models/nextn.py): a model's `sanitize` that reads only `self.args` and its layers and
  converts the Hugging Face tensors of every layer below `num_hidden_layers` (the nextn block goes through it as
  layer 0), and DeepSeek-V3's, which drops the nextn layer only at index 61 (`drop_nextn_layers` drops it at
  any depth);
- for the prompt cache across conversations: each cache's `state`, the arrays and numbers that place them
  (`cache_state`), which set on a fresh cache of the same type makes it hold the same positions;
- for tool calls: the tokenizer wrapper's `has_tool_calling`, `tool_call_start`, `tool_call_end` and `tool_parser`
  (`parse(text, tools)` -> {"name", "arguments"} or a list of them), which mlx-lm infers per model family from
  the chat template (`tool_call_format`).
`check()` runs each of these on tiny layers the first time a model is wrapped, and fails with a message naming
the installed mlx-lm version and the tested range, so an mlx-lm release that changes them breaks loudly. The
checks that run mlx-lm through mlx-spec's own caches live beside those caches (`caches.check_trees`,
`ragged.check_batches`) and report through `broken` (errors.py): this module imports nothing of mlx-spec's but
that and where mlx-lm's models keep their parts (layout.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.models import gemma4_text, llama, qwen3, qwen3_5, qwen3_next, rope_utils
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from .errors import SpecError, broken
from .layout import (
    decoder_layers,
    final_norm,
    input_embedding,
    input_scale,
    output_head,
)

GDN_ATTRIBUTES = ("conv_kernel_size", "conv_dim", "conv1d", "key_dim", "num_k_heads", "num_v_heads", "head_k_dim",
                  "head_v_dim", "A_log", "dt_bias", "out_proj", "norm", "in_proj_qkv", "in_proj_z", "in_proj_b",
                  "in_proj_a")


def write_index(cache: RotatingKVCache) -> int:
    """The ring buffer's next write slot (the newest key sits just before it)."""
    return cache._idx


def set_write_index(cache: RotatingKVCache, index: int) -> None:
    cache._idx = index


def cache_state(cache) -> tuple:
    """What a cache holds, as mlx-lm's `state` (arrays and the numbers that place them), every array a handle of
    its own: what the cache writes afterwards leaves it as it is (MLX copies a buffer something else still reads
    before writing into it)."""
    return tree_map(lambda x: x[...] if isinstance(x, mx.array) else x, cache.state)


def set_cache_state(cache, state: tuple) -> None:
    """Make a fresh cache of the type `state` came from hold what it held (`state` stays as it is)."""
    cache.state = tree_map(lambda x: x[...] if isinstance(x, mx.array) else x, state)


def check_cache_state() -> None:
    for cache, fresh in ((KVCache(), KVCache()), (RotatingKVCache(max_size=4), RotatingKVCache(max_size=4))):
        for t in range(6):
            step = mx.full((1, 1, 1, 1), float(t))
            cache.update_and_fetch(step, step)
        held = cache_state(cache)
        cache.update_and_fetch(mx.full((1, 1, 1, 1), 9.0), mx.full((1, 1, 1, 1), 9.0))
        set_cache_state(fresh, held)
        fresh.update_and_fetch(mx.full((1, 1, 1, 1), 6.0), mx.full((1, 1, 1, 1), 6.0))
        keys = fresh.update_and_fetch(mx.full((1, 1, 1, 1), 7.0), mx.full((1, 1, 1, 1), 7.0))[0]
        if fresh.offset != 8 or sorted(keys[0, 0, -3:, 0].tolist()) != [5.0, 6.0, 7.0]:
            raise broken(f"{type(cache).__name__}.state (no longer everything a fresh cache needs to continue)")


def swap_class(obj, cls) -> None:
    """Give an mlx-lm module a subclass of its own class (same weights, extended behaviour)."""
    obj.__class__ = cls


def convert_layer(sanitize, args, layer, tensors: dict, under: str = "model.layers.0.") -> dict:
    """One decoder layer's Hugging Face tensors (names relative to the layer) in the form mlx-lm's layers load:
    `sanitize` (a model class's, e.g. deepseek_v3.Model.sanitize) run on them as those of a model whose one layer,
    at index 0, is `layer` (`under`: where that model keeps it; Nemotron-H's MTP sublayers go under `backbone.`, as
    its layers `layers.{i}`)."""
    converted = sanitize(_OneLayer(args, layer), {f"{under}{k}": v for k, v in tensors.items()})
    if not all(k.startswith(under) for k in converted) or any(".experts.0." in k for k in converted):
        raise broken(f"{sanitize.__qualname__} (the conversion of a layer's expert and attention tensors)")
    return {k[len(under):]: v for k, v in converted.items()}


class _OneLayer:
    """What a model's `sanitize` reads of it: its arguments, and its layers (Kimi K3's converts by their kinds)."""

    def __init__(self, args, layer):
        self.args, self.layers = args, [layer]
        self.model = self


def drop_nextn_layers() -> None:
    """Make mlx-lm's DeepSeek-V3 loader drop the nextn layers stored past its last layer, whatever the depth
    (it drops `model.layers.61.*` only, so every other depth fails to load). Idempotent."""
    from mlx_lm.models import deepseek_v3

    sanitize = deepseek_v3.Model.sanitize
    if getattr(sanitize, "drops_nextn", False):
        return
    if list(inspect.signature(sanitize).parameters) != ["self", "weights"]:
        raise broken("deepseek_v3.Model.sanitize(self, weights)")

    @functools.wraps(sanitize)
    def without_nextn(self, weights):
        depth = self.args.num_hidden_layers
        return sanitize(self, {k: v for k, v in weights.items() if not _layer_at_or_past(k, depth)})
    without_nextn.drops_nextn = True
    deepseek_v3.Model.sanitize = without_nextn


def _layer_at_or_past(key: str, depth: int) -> bool:
    parts = key.split(".")
    return key.startswith("model.layers.") and parts[2].isdigit() and int(parts[2]) >= depth


def split_model(model, mode: str, group, name: str) -> None:
    """Shard a lazily loaded mlx-lm model across `group` before its weights are evaluated: "tensor" through its
    `Model.shard(group)`, "pipeline" through the `pipeline(group)` of its inner model (mlx-lm's PipelineMixin, at
    `model.model`, or `model.language_model.model` in a multimodal wrapper)."""
    import mlx_lm

    inner = getattr(getattr(model, "language_model", model), "model", None)
    splitters = {"tensor": getattr(model, "shard", None), "pipeline": getattr(inner, "pipeline", None)}
    splitter = splitters[mode]
    kind = getattr(model, "model_type", type(model).__module__.rsplit(".", 1)[-1])
    if splitter is None:
        other = next((m for m, split in splitters.items() if split is not None), None)
        raise SpecError(f"mlx-lm {mlx_lm.__version__} cannot split {name} ({kind}) by {mode} parallelism: "
                        + (f"try --distributed {other}" if other else "run it on one machine"))
    try:
        splitter(group)
    except (AssertionError, ValueError) as e:
        raise SpecError(f"{name} ({kind}) cannot be split {mode}-wise across {group.size()} ranks ({e}): use "
                        "another number of ranks or the other --distributed mode") from None


@functools.cache
def check_input_embeddings() -> None:
    """Gemma 4 given input embeddings scales them by `input_scale` and reads its per-layer embeddings at the token
    ids passed beside them."""
    args = gemma4_text.ModelArgs.from_dict(dict(
        model_type="gemma4_text", hidden_size=8, num_hidden_layers=1, intermediate_size=8, num_attention_heads=1,
        num_key_value_heads=1, head_dim=8, global_head_dim=8, vocab_size=6, vocab_size_per_layer_input=6,
        hidden_size_per_layer_input=4, num_kv_shared_layers=0, layer_types=["full_attention"], sliding_window=4))
    model = gemma4_text.Model(args)
    ids = mx.array([[1, 2, 3]])
    embeddings = input_embedding(model)(ids)
    given, scale = model(ids, input_embeddings=embeddings), input_scale(model)
    other_ids = model(mx.array([[4, 5, 0]]), input_embeddings=embeddings)
    model.model.embed_scale = 1.0
    scaled = model(ids, input_embeddings=embeddings * scale)
    if not mx.allclose(given, scaled, atol=1e-5) or mx.allclose(given, other_ids):
        raise broken("Gemma 4's input embeddings (scaled by embed_scale, per-layer embeddings read at the ids)")


def tool_call_format(tokenizer):
    """(start marker, end marker, parse, the format's name: its mlx-lm parser module, e.g. "json_tools") of the
    model family's tool calls, or None when its chat template has no tool calling."""
    if not hasattr(tokenizer, "has_tool_calling"):
        raise broken("the tokenizer wrapper's tool calling (no has_tool_calling)")
    if not tokenizer.has_tool_calling:
        return None
    parse = tokenizer.tool_parser
    return tokenizer.tool_call_start, tokenizer.tool_call_end, parse, parse.__module__.rsplit(".", 1)[-1]


def check_tool_parsers() -> None:
    from mlx_lm.tool_parsers import json_tools

    try:
        parsed = json_tools.parse_tool_call('\n{"name": "f", "arguments": {"a": 1}}\n', None)
    except Exception as e:
        parsed = f"{type(e).__name__}: {e}"
    if parsed != {"name": "f", "arguments": {"a": 1}} or json_tools.tool_call_start != "<tool_call>":
        raise broken(f"the tool-call parsers (json_tools gives {parsed!r})")


def plain_kv_caches(n: int) -> list:
    return [KVCache() for _ in range(n)]


def rope(dims: int, base: float, traditional: bool, scaling: dict | None, max_positions: int | None):
    """The rotary embedding mlx-lm builds for these settings (`scaling`: a Hugging Face `rope_scaling`)."""
    return rope_utils.initialize_rope(dims, base, traditional, scaling, max_positions)


DECODER_FAMILIES = {"llama": llama, "qwen3": qwen3}  # the decoder layers drafters are built from


def decoder_args(model_type: str, config: dict):
    """mlx-lm's ModelArgs of a Llama or Qwen3 decoder for `config` (its Hugging Face fields)."""
    return DECODER_FAMILIES[model_type].ModelArgs.from_dict({**config, "model_type": model_type})


def decoder_attention(args, input_dims: int):
    """The attention of `args`' family whose q/k/v projections read `input_dims` features."""
    attention = DECODER_FAMILIES[args.model_type].Attention(args)
    for name in ("q_proj", "k_proj", "v_proj"):
        out_dims = getattr(attention, name).weight.shape[0]
        setattr(attention, name, nn.Linear(input_dims, out_dims, bias=getattr(args, "attention_bias", False)))
    return attention


def decoder_mlp(args):
    if args.model_type == "llama":
        return llama.MLP(args)
    return DECODER_FAMILIES[args.model_type].MLP(args.hidden_size, args.intermediate_size)


def decoder_block(args):
    """A whole decoder layer of `args`' family: called (x, mask, cache)."""
    return DECODER_FAMILIES[args.model_type].TransformerBlock(args)


def gemma4_layer(layer, x: mx.array, mask, shared_kv: tuple, offset: int) -> mx.array:
    """A Gemma 4 decoder layer attending to another model's K/V."""
    return layer(x, mask, None, shared_kv=shared_kv, offset=offset)[0]


_positions: list = [None, None]  # the forward in progress's positions when not consecutive, and their sections


def _positioned_rope_call(self, x, offset=0):
    base = type(self).__bases__[0].__call__
    values, sections = _positions
    if values is None:
        return base(self, x, offset)
    # (batch, heads, n, dims) -> one row per token, of length 1: mx.fast.rope takes an offset per leading row
    batch, heads, n, dims = x.shape
    if values.ndim == 2 and sections is None:  # (batch, n): each batch row's own positions
        rows = x.transpose(0, 2, 1, 3).reshape(batch * n, heads, 1, dims)
        return base(self, rows, values.reshape(-1)).reshape(batch, n, heads, dims).transpose(0, 2, 1, 3)
    rows = x.transpose(2, 0, 1, 3).reshape(n, batch * heads, 1, dims)
    if sections is None:
        return base(self, rows, values).reshape(n, batch, heads, dims).transpose(1, 2, 0, 3)
    # multimodal positions (axes, n): each rotary frequency turns by the axis `sections` gives it; a frequency's
    # two dimensions (i and i + dims/2, mlx's non-traditional pairing) depend on that axis's position alone
    turned = [base(self, rows, values[axis]).reshape(n, batch, heads, dims).transpose(1, 2, 0, 3)
              for axis in range(values.shape[0])]
    half = self.dims // 2
    axis_of = mx.concatenate([sections, sections, mx.zeros(dims - 2 * half, dtype=sections.dtype)])
    out = turned[0]
    for axis in range(1, len(turned)):
        out = mx.where(axis_of == axis, turned[axis], out)
    return out


def positioned_ropes(model) -> int:
    """Let the attention layers' rotary embeddings take arbitrary positions (`positions`); returns how many
    attention layers rotate (0: the model cannot verify a tree)."""
    count = 0
    for module in model.modules():
        rope = getattr(module, "rope", None)
        if isinstance(rope, nn.Module):
            if not hasattr(type(rope), "positioned"):
                swap_class(rope, type(f"Positioned{type(rope).__name__}", (type(rope),),
                                      {"__call__": _positioned_rope_call, "positioned": True}))
            count += 1
    return count


@contextlib.contextmanager
def positions(values: mx.array, sections: mx.array | None = None):
    """Within: the rotary embeddings of `positioned_ropes` models put the new tokens at `values`: (n,) for every
    batch row, or (batch, n) each row's own; with `sections` (one axis index per rotary frequency), multimodal
    positions (axes, n) for every batch row, each frequency turned by its axis's (Qwen's M-RoPE)."""
    _positions[:] = values, sections
    try:
        yield
    finally:
        _positions[:] = None, None


_additions: dict = {}  # id(decoder layer) -> what the forward in progress adds to that layer's output


def _adding(base):
    def call(self, x, *args, **kwargs):
        out = base.__call__(self, x, *args, **kwargs)
        extra = _additions.get(id(self))
        return out if extra is None else out + extra.astype(out.dtype)
    return call


@contextlib.contextmanager
def added_to_layers(model, additions: list):
    """Within: decoder layer i's output gets additions[i] (n, H) added, for the first len(additions) layers
    (Qwen3-VL's deepstack: image features from the vision tower's middle, at the image's tokens)."""
    layers = decoder_layers(model)[:len(additions)]
    for layer, extra in zip(layers, additions):
        if not hasattr(type(layer), "adding"):
            swap_class(layer, type(f"Adding{type(layer).__name__}", (type(layer),),
                                   {"__call__": _adding(type(layer)), "adding": True}))
        _additions[id(layer)] = extra
    try:
        yield
    finally:
        _additions.clear()


@functools.cache
def check_additions() -> None:
    """`added_to_layers`: a Qwen3 model calls its decoder layers in order, each returning its output hidden state."""
    args = decoder_args("qwen3", dict(hidden_size=8, num_hidden_layers=2, intermediate_size=16, head_dim=4,
                                      num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, vocab_size=6,
                                      max_position_embeddings=64, tie_word_embeddings=True, rope_theta=1e4))
    model = qwen3.Model(args)
    ids, extra = mx.array([[1, 2, 3]]), mx.random.normal((3, 8), key=mx.random.key(0))
    with added_to_layers(model, [extra]):
        added = model(ids)
    layers, h = decoder_layers(model), input_embedding(model)(ids)
    h = layers[1](layers[0](h, "causal", None) + extra, "causal", None)
    if not mx.allclose(added, output_head(model)(final_norm(model)(h)), atol=1e-5):
        raise broken("the decoder layers' calls (each returns its output, called in order by the model)")


@functools.cache
def check_sections() -> None:
    """`positions` with sections: a frequency turns by its own axis's position (mx.fast.rope's offset per row)."""
    holder = nn.Module()
    holder.rope = nn.RoPE(8, base=10.0)
    positioned_ropes(holder)
    x = mx.random.normal((1, 1, 2, 8), key=mx.random.key(0))
    with positions(mx.array([[1, 2], [5, 2], [3, 7]]), mx.array([0, 1, 2, 0])):
        turned = holder.rope(x)
    axis_of = mx.array([0, 1, 2, 0] * 2)
    for axis, at in enumerate(([1, 2], [5, 2], [3, 7])):
        plain = mx.concatenate([holder.rope(x[:, :, i:i + 1], offset=p) for i, p in enumerate(at)], axis=2)
        if not mx.allclose(mx.where(axis_of == axis, turned, 0), mx.where(axis_of == axis, plain, 0), atol=1e-5):
            raise broken("rotary embeddings by sections (multimodal positions): mx.fast.rope's offsets per row")


@functools.cache
def check() -> None:
    """Run every reliance point above on tiny layers; raise SpecError naming what changed."""
    check_rotating_cache()
    check_cache_state()
    check_gdn()
    params = list(inspect.signature(gemma4_text.DecoderLayer.__call__).parameters)
    if params[:4] != ["self", "x", "mask", "cache"] or not {"shared_kv", "offset"} <= set(params):
        raise broken(f"the Gemma 4 DecoderLayer call signature (now {params})")
    if not hasattr(qwen3_next.Qwen3NextGatedDeltaNet, "fix_query_key_value_ordering"):
        raise broken("Qwen3-Next's GatedDeltaNet (no fix_query_key_value_ordering)")
    check_decoder_layers()
    check_tool_parsers()
    try:
        rope(8, 1e4, False, None, 64)(mx.ones((1, 1, 2, 8)), offset=3)
    except Exception as e:
        raise broken(f"rope_utils.initialize_rope ({type(e).__name__}: {e})") from None


def check_decoder_layers() -> None:
    for family in DECODER_FAMILIES:
        args = decoder_args(family, dict(hidden_size=8, num_hidden_layers=1, intermediate_size=16, head_dim=4,
                                         num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6,
                                         vocab_size=4, max_position_embeddings=64, tie_word_embeddings=False,
                                         rope_theta=1e4))
        try:
            out = decoder_attention(args, input_dims=16)(mx.zeros((1, 3, 16)), None, KVCache())
            out = decoder_block(args)(out + decoder_mlp(args)(out), None, KVCache())
        except Exception as e:
            raise broken(f"{family}'s Attention, MLP or TransformerBlock ({type(e).__name__}: {e})") from None
        if out.shape != (1, 3, 8):
            raise broken(f"{family}'s decoder layers (output {out.shape} for 3 positions of width 8)")


def check_rotating_cache() -> None:
    cache = RotatingKVCache(max_size=4)
    for t in range(6):
        step = mx.full((1, 1, 1, 1), float(t))
        cache.update_and_fetch(step, step)
    if not hasattr(cache, "_idx") or cache.keys[0, 0, write_index(cache) - 1, 0].item() != 5.0:
        raise broken("RotatingKVCache's ring buffer (_idx no longer points after the newest key)")


class _WriteOrder(ArraysCache):
    def __init__(self):
        super().__init__(2)
        self.writes = []

    def __setitem__(self, idx, value):
        super().__setitem__(idx, value)
        self.writes.append(idx)


def check_gdn() -> None:
    args = qwen3_5.TextModelArgs.from_dict(dict(
        model_type="qwen3_5_text", hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6, vocab_size=8, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
        full_attention_interval=2, rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.25}))
    layer = qwen3_5.GatedDeltaNet(args)
    if missing := [name for name in GDN_ATTRIBUTES if not hasattr(layer, name)]:
        raise broken(f"the Gated DeltaNet layer's attributes (missing {', '.join(missing)})")
    if "bias" in layer.conv1d or layer.conv1d.weight.shape[-1] != 1:
        raise broken("the Gated DeltaNet conv (a depthwise conv without bias expected)")
    cache = _WriteOrder()
    mx.eval(layer(mx.zeros((1, 1, 16)), cache=cache))
    if cache.writes[-1:] != [1] or 1 in cache.writes[:-1]:
        raise broken(f"the order of a Gated DeltaNet step's cache writes (now {cache.writes}, state last expected)")
