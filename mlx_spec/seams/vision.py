"""The one place mlx-spec relies on mlx-vlm (the optional `vision` extra): a checkpoint's image encoder (its
vision tower, and Gemma 4's projection into the embeddings), its tensors' conversion, and its processor.
`check(model_type)` runs each reliance point on a tiny encoder first, so an mlx-vlm release that changes them
fails loudly, naming what changed."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import warnings
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .errors import SpecError

INSTALL = 'pip install "mlx-spec[vision]"'
# model type -> where its checkpoint keeps its image encoder's tensors: (name prefix, the `Encoder` module it
# names), Hugging Face's names first, then mlx-vlm's own conversions'
QWEN_TOWER = (("model.visual.", "vision_tower."), ("vision_tower.", "vision_tower."), ("visual.", "vision_tower."))
ENCODERS = {
    "qwen3_5": QWEN_TOWER,
    "qwen3_5_moe": QWEN_TOWER,
    "qwen3_vl": QWEN_TOWER,
    "qwen3_vl_moe": QWEN_TOWER,
    "qwen2_5_vl": QWEN_TOWER,
    "gemma4": (("model.vision_tower.", "vision_tower."), ("vision_tower.", "vision_tower."),
               ("model.embed_vision.", "embed_vision."), ("embed_vision.", "embed_vision.")),
}


def tested_mlx_vlm() -> str:
    """The mlx-vlm version the `vision` extra pins (what this seam was checked against)."""
    return "0.7.10"


def modules(model_type: str):
    """mlx-vlm's package for `model_type` (its Model, VisionModel, VisionConfig), or a SpecError."""
    try:
        return importlib.import_module(f"mlx_vlm.models.{model_type}")
    except ModuleNotFoundError as e:
        if e.name in ("mlx_vlm", "PIL"):
            raise SpecError(f"images need the vision extra, which is not installed: {INSTALL}") from None
        raise SpecError(f"mlx-vlm {importlib.metadata.version('mlx-vlm')} has no {model_type!r} vision model: "
                        f"install the tested one ({INSTALL})") from None


class Encoder(nn.Module):
    """A checkpoint's image encoder as mlx-vlm builds it: its `vision_tower`, and for Gemma 4 the projection into
    the language model's embeddings (`embed_vision`). Called on the processor's inputs, it returns the features
    of the prompt's image tokens, (image tokens, hidden), in order, and Qwen3-VL's deepstack features (the same
    shape, one array for each of the first decoder layers, added to their outputs; none for other families)."""

    def __init__(self, config: dict):
        super().__init__()
        self.model_type = config["model_type"]
        package = modules(self.model_type)
        vision = package.VisionConfig.from_dict(config["vision_config"])
        self.vision_tower = package.VisionModel(vision)
        if self.model_type == "gemma4":
            from mlx_vlm.models.gemma4.gemma4 import MultimodalEmbedder

            text = config.get("text_config", {})
            self.embed_vision = MultimodalEmbedder(vision.hidden_size, text.get("hidden_size", config.get(
                "hidden_size")), vision.rms_norm_eps)

    def __call__(self, inputs: dict) -> tuple[mx.array, list[mx.array]]:
        pixels = inputs["pixel_values"]
        if self.model_type == "gemma4":
            return self.embed_vision(self.vision_tower(pixels))[0], []
        out = self.vision_tower(pixels.astype(self.vision_tower.patch_embed.proj.weight.dtype),
                                inputs["image_grid_thw"])
        return (out[0], list(out[1] or [])) if isinstance(out, tuple) else (out, [])

    def sanitize(self, weights: dict) -> dict:
        """The checkpoint's tensors in the form the encoder loads (mlx-vlm's own conversion)."""
        if self.model_type == "gemma4":  # its Model's, which reads of the model only these
            model = SimpleNamespace(config=SimpleNamespace(vision_config=self.vision_tower.config), audio_tower=None)
            return modules("gemma4").Model.sanitize(model, weights)
        tower = self.vision_tower.sanitize({k[len("vision_tower."):]: v for k, v in weights.items()})
        return {f"vision_tower.{k}": v for k, v in tower.items()}


def tower_weights(path: Path, model_type: str) -> dict[str, mx.array]:
    """The checkpoint's image-encoder tensors, named as the `Encoder` holds them (lazy: only these load)."""
    found = {}
    for shard in sorted(path.glob("*.safetensors")):
        for name, value in mx.load(str(shard)).items():
            prefix, module = next(((p, m) for p, m in ENCODERS[model_type] if name.startswith(p)), (None, None))
            if prefix is not None:
                found[module + name[len(prefix):]] = value
    return found


def load_tower(path: Path, config: dict) -> Encoder | None:
    """The image encoder of the checkpoint at `path` (`config`: its config.json), as mlx-vlm builds it; None
    when the checkpoint holds no vision weights."""
    weights = tower_weights(path, config["model_type"])
    if not weights:
        return None
    encoder = Encoder(config)
    weights = encoder.sanitize(weights)
    if quantized := {name[:-len(".scales")] for name in weights if name.endswith(".scales")}:
        q = config.get("quantization") or config.get("quantization_config") or {}
        nn.quantize(encoder, q.get("group_size", 64), q.get("bits", 4), class_predicate=lambda p, _: p in quantized)
    encoder.load_weights(list(weights.items()))
    mx.eval(encoder.parameters())
    return encoder


def load_processor(path: Path):
    """The checkpoint's own processor (it expands each image placeholder to the image's tokens), from its folder
    alone: a file the folder lacks is not looked for on the hub."""
    from huggingface_hub import constants
    from mlx_vlm.utils import load_processor as load

    offline, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        with warnings.catch_warnings():  # Gemma 4's also builds an audio feature extractor, which warns of its filters
            warnings.filterwarnings("ignore", category=UserWarning, module="transformers.audio_utils")
            return load(str(path.resolve()), add_detokenizer=False)
    finally:
        constants.HF_HUB_OFFLINE = offline


def process(processor, text: str, images: list) -> tuple[list[int], dict]:
    """(token ids with each image's placeholder expanded, what the encoder reads: pixel values, and for Qwen
    each image's (t, h, w) patch grid as `image_grid_thw`) for a prompt `text` and its `images` (PIL images, in
    order)."""
    from mlx_vlm.utils import prepare_inputs

    inputs = prepare_inputs(processor, images=images, prompts=[text], padding=False)
    return inputs["input_ids"][0].tolist(), inputs


def open_image(source):
    """A PIL image (RGB) from a path, bytes or a PIL image; ValueError when it cannot be read."""
    import io

    from mlx_vlm.utils import load_image

    return load_image(io.BytesIO(source) if isinstance(source, bytes) else source)


# per model type: a tiny vision config, and processor inputs that make it one image token of width 4
TINY = {
    "qwen3_5": ({"depth": 1, "hidden_size": 8, "intermediate_size": 8, "num_heads": 1, "patch_size": 2,
                 "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 4,
                 "num_position_embeddings": 4, "deepstack_visual_indexes": []},
                lambda: {"pixel_values": mx.zeros((4, 3 * 2 * 2 * 2)), "image_grid_thw": mx.array([[1, 2, 2]])}),
    "gemma4": ({"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
                "num_key_value_heads": 1, "head_dim": 8, "global_head_dim": 8, "patch_size": 2,
                "position_embedding_size": 4, "pooling_kernel_size": 2, "default_output_length": 1},
               lambda: {"pixel_values": mx.zeros((1, 3, 4, 4))}),
}
TINY["qwen3_5_moe"] = TINY["qwen3_5"]
TINY["qwen3_vl"] = ({**TINY["qwen3_5"][0], "deepstack_visual_indexes": [0]}, TINY["qwen3_5"][1])
TINY["qwen3_vl_moe"] = TINY["qwen3_vl"]
TINY["qwen2_5_vl"] = ({**TINY["qwen3_5"][0], "window_size": 4, "fullatt_block_indexes": [0]}, TINY["qwen3_5"][1])


@functools.cache
def check(model_type: str) -> None:
    """Run each reliance point above on a tiny encoder of `model_type`; raise SpecError naming what changed."""
    vision, inputs = TINY[model_type]
    try:
        encoder = Encoder({"model_type": model_type, "text_config": {"hidden_size": 4}, "vision_config": vision})
        out, deep = encoder(inputs())
        names = set(encoder.sanitize(dict(tree_flatten(encoder.parameters()))))
    except Exception as e:
        raise SpecError(f"mlx-vlm {importlib.metadata.version('mlx-vlm')} changed its {model_type} vision model "
                        f"({type(e).__name__}: {e}); mlx-spec was tested with {tested_mlx_vlm()}: {INSTALL}") from None
    deepstack = len(vision.get("deepstack_visual_indexes", []))
    if out.shape != (1, 4) or [d.shape for d in deep] != [(1, 4)] * deepstack \
            or names != {name for name, _ in tree_flatten(encoder.parameters())}:
        raise SpecError(f"mlx-vlm's {model_type} vision model now returns {out.shape} (and {len(deep)} deepstack "
                        f"features) for one image token of width 4, or renames its tensors; mlx-spec was tested "
                        f"with mlx-vlm {tested_mlx_vlm()}: {INSTALL}")
