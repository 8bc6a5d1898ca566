"""The one place mlx-spec relies on mlx-vlm (the optional `vision` extra): a checkpoint's vision tower and its
processor. `check()` runs each reliance point on a tiny tower first, so an mlx-vlm release that changes them
fails loudly, naming what changed."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from .errors import SpecError

INSTALL = 'pip install "mlx-spec[vision]"'
TOWER_PREFIXES = ("model.visual.", "vision_tower.", "visual.")  # Hugging Face's, mlx-vlm's, older Qwen-VL's


def tested_mlx_vlm() -> str:
    """The mlx-vlm version the `vision` extra pins (what this seam was checked against)."""
    return "0.7.10"


def modules(model_type: str):
    """mlx-vlm's package for `model_type` (its Model, VisionModel, ModelConfig), or a SpecError."""
    try:
        return importlib.import_module(f"mlx_vlm.models.{model_type}")
    except ModuleNotFoundError as e:
        if e.name in ("mlx_vlm", "PIL"):
            raise SpecError(f"images need the vision extra, which is not installed: {INSTALL}") from None
        raise SpecError(f"mlx-vlm {importlib.metadata.version('mlx-vlm')} has no {model_type!r} vision model: "
                        f"install the tested one ({INSTALL})") from None


def tower_weights(path: Path) -> dict[str, mx.array]:
    """The checkpoint's vision-tower tensors, named as mlx-vlm's VisionModel holds them (lazy: only these load)."""
    found = {}
    for shard in sorted(path.glob("*.safetensors")):
        for name, value in mx.load(str(shard)).items():
            prefix = next((p for p in TOWER_PREFIXES if name.startswith(p)), None)
            if prefix:
                found[name[len(prefix):]] = value
    return found


def load_tower(path: Path, config: dict):
    """The vision tower of the checkpoint at `path` (`config`: its config.json), as mlx-vlm builds it; None when
    the checkpoint holds no vision weights."""
    package = modules(config["model_type"])
    weights = tower_weights(path)
    if not weights:
        return None
    tower = package.VisionModel(package.ModelConfig.from_dict(config).vision_config)
    weights = tower.sanitize(weights)
    if quantized := {name[:-len(".scales")] for name in weights if name.endswith(".scales")}:
        q = config.get("quantization") or config.get("quantization_config") or {}
        nn.quantize(tower, q.get("group_size", 64), q.get("bits", 4), class_predicate=lambda p, _: p in quantized)
    tower.load_weights(list(weights.items()))
    mx.eval(tower.parameters())
    return tower


def load_processor(path: Path):
    """The checkpoint's own processor (it expands each image placeholder to the image's tokens), from its folder
    alone: a file the folder lacks is not looked for on the hub."""
    from huggingface_hub import constants
    from mlx_vlm.utils import load_processor as load

    offline, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        return load(str(path.resolve()), add_detokenizer=False)
    finally:
        constants.HF_HUB_OFFLINE = offline


def process(processor, text: str, images: list) -> tuple[list[int], mx.array, mx.array]:
    """(token ids with each image's placeholder expanded, pixel values, each image's (t, h, w) patch grid) for a
    prompt `text` and its `images` (PIL images, in order)."""
    from mlx_vlm.utils import prepare_inputs

    inputs = prepare_inputs(processor, images=images, prompts=[text], padding=False)
    return inputs["input_ids"][0].tolist(), inputs["pixel_values"], inputs["image_grid_thw"]


def open_image(source):
    """A PIL image (RGB) from a path, bytes or a PIL image; ValueError when it cannot be read."""
    import io

    from mlx_vlm.utils import load_image

    return load_image(io.BytesIO(source) if isinstance(source, bytes) else source)


@functools.cache
def check() -> None:
    """Run each reliance point above on a tiny Qwen 3.5 tower; raise SpecError naming what changed."""
    package = modules("qwen3_5")
    config = {"model_type": "qwen3_5", "text_config": {}, "vision_config": {
        "depth": 1, "hidden_size": 8, "intermediate_size": 8, "num_heads": 1, "patch_size": 2,
        "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 4, "num_position_embeddings": 4,
        "deepstack_visual_indexes": []}}
    try:
        tower = package.VisionModel(package.ModelConfig.from_dict(config).vision_config)
        out = tower(mx.zeros((4, 3 * 2 * 2 * 2)), mx.array([[1, 2, 2]]))
        out = out[0] if isinstance(out, tuple) else out
    except Exception as e:
        raise SpecError(f"mlx-vlm {importlib.metadata.version('mlx-vlm')} changed its Qwen 3.5 VisionModel "
                        f"({type(e).__name__}: {e}); mlx-spec was tested with {tested_mlx_vlm()}: {INSTALL}") from None
    if out.shape != (1, 4):
        raise SpecError(f"mlx-vlm's Qwen 3.5 VisionModel now returns {out.shape} for one merged patch, not (1, 4); "
                        f"mlx-spec was tested with mlx-vlm {tested_mlx_vlm()}: {INSTALL}")
