"""Hugging Face checkpoints to MLX, keeping the MTP layer that mlx_lm.convert drops.

The main model goes through mlx_lm.convert unchanged; the MTP layer (Qwen's `mtp.*` tensors, norm-shifted once,
or the nextn layer of another family, e.g. DeepSeek / GLM's `model.layers.{num_hidden_layers}.*`, its block
converted as mlx-lm converts a layer),
optionally quantized, goes to `mtp.safetensors` beside it, a name mlx-lm's loader never reads, so the output still loads
with plain `mlx_lm.load` whatever that architecture's sanitize does with `mtp.` keys. Output is written to a
hidden sibling folder and renamed into place at the end, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..loading import read_config, resolve
from ..models.common import load_weights, read_safetensors
from ..models.dflash import block_kind, load_block_drafter
from ..models.dflash import quantize as quantize_block_drafter
from ..models.eagle3 import is_eagle3, load_eagle3
from ..models.gemma4_assistant import is_assistant, load_assistant
from ..models.gemma4_assistant import quantize as quantize_assistant
from ..models.nextn import (
    STORED,
    build_nextn,
    check_supported,
    is_nextn,
    layer_name,
    read_nextn_tensors,
)
from ..models.qwen3_5 import (
    build_mtp,
    checkpoint_files,
    declared_mtp_layers,
    read_mtp_tensors,
)
from ..seams.errors import SpecError
from ..seams.files import staging

MTP_FILE = "mtp.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def mtp_shards(source: str) -> list[str]:
    """The safetensors files of a checkpoint that hold its MTP layer, from its index when it has one."""
    index_dir = resolve(source, [INDEX_FILE, "config.json"])
    index = index_dir / INDEX_FILE
    if index.exists():
        config = read_config(index_dir)
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted({shard for name, shard in weight_map.items()
                       if (layer_name(config, name) is not None if is_nextn(config) else name.startswith("mtp."))})
    return sorted(p.name for p in index_dir.glob("model*.safetensors")) or ["model.safetensors"]


def holds_mtp(config: dict, files) -> bool:
    return bool((read_nextn_tensors(files, config) if is_nextn(config) else read_mtp_tensors(files))[0])


def mtp_layer(config: dict, files, where) -> tuple[nn.Module, str] | None:
    """(the MTP layer in `files`, built for `config`, and the prefix its tensors are stored under), or None
    when `config` declares none; a SpecError when it declares one that `files` do not hold."""
    if is_nextn(config):
        check_supported(config, where)
        tensors, original = read_nextn_tensors(files, config)
        found = tensors and (build_nextn(config, tensors, original), STORED)
    elif declared_mtp_layers(config):
        tensors, zero_centred = read_mtp_tensors(files)
        found = tensors and (build_mtp(config, tensors, zero_centred), "mtp.")
    else:
        return None
    if not found:
        raise SpecError(f"{where} declares an MTP layer but holds none of its tensors: point --hf-path at the "
                        "original Hugging Face checkpoint")
    return found


def checkpoint_dtype(config: dict) -> str | None:
    """The floating dtype a checkpoint declares (where mlx_lm.convert looks for it)."""
    dtype = config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
    return dtype if dtype in ("float16", "bfloat16", "float32") else None


def copy_mtp(source: Path, mlx_dir: Path) -> None:
    """Copy the MTP layer of the mlx-spec conversion in `source` to the conversion in `mlx_dir`: its file, its
    index entries, its quantization."""
    config = json.loads((mlx_dir / "config.json").read_text())
    if quantization := json.loads((source / "config.json").read_text()).get("mtp_quantization"):
        config["mtp_quantization"] = quantization
    shutil.copyfile(source / MTP_FILE, mlx_dir / MTP_FILE)
    index_path = mlx_dir / INDEX_FILE
    if index_path.exists():
        index = json.loads(index_path.read_text())
        index["weight_map"].update({k: MTP_FILE for k in load_weights(mlx_dir / MTP_FILE)})
        index_path.write_text(json.dumps(index, indent=4))
    (mlx_dir / "config.json").write_text(json.dumps(config, indent=4))


def write_mtp(mlx_dir: Path, layer: tuple[nn.Module, str], bits: int | None, group_size: int,
              dtype: str | None) -> None:
    """Add the MTP layer (`mtp_layer`'s answer) to an MLX checkpoint directory: its file, its index entries,
    its quantization."""
    config = json.loads((mlx_dir / "config.json").read_text())
    mtp, stored = layer
    if dtype:
        mtp.set_dtype(getattr(mx, dtype))
    if bits:
        nn.quantize(mtp, group_size=group_size, bits=bits)
        config["mtp_quantization"] = {"group_size": group_size, "bits": bits}
    weights = {f"{stored}{k}": v for k, v in tree_flatten(mtp.parameters())}
    partial = mlx_dir / ".partial-mtp.safetensors"  # never loaded if left behind
    mx.save_safetensors(str(partial), weights, metadata={"format": "mlx"})
    index_path = mlx_dir / INDEX_FILE
    if index_path.exists():
        index = json.loads(index_path.read_text())
        index["weight_map"].update({k: MTP_FILE for k in weights})
        index_path.write_text(json.dumps(index, indent=4))
    (mlx_dir / "config.json").write_text(json.dumps(config, indent=4))
    os.replace(partial, mlx_dir / MTP_FILE)


def convert(hf_path: str, mlx_path: str, quantize: bool = False, q_bits: int = 4, q_group_size: int = 64,
            mtp_bits: int | None = None, dtype: str | None = None) -> Path:
    """Convert a checkpoint; `mtp_bits` (default: 8 when quantizing) quantizes the MTP layer, 16 keeps it float."""
    from mlx_lm.convert import convert as mlx_lm_convert

    out = Path(mlx_path).expanduser()
    if out.exists():
        raise SpecError(f"{out} already exists: choose a new --mlx-path or delete it")
    source = resolve(hf_path)
    config_path = source / "config.json"
    if not config_path.exists():
        raise SpecError(f"{source} has no config.json: --hf-path must be a Hugging Face checkpoint")
    quantized = read_config(source).get("quantization")
    if quantized and (quantize or dtype or mtp_bits is not None):
        flags = "-q" if quantize else "--dtype" if dtype else "--mtp-bits"
        raise SpecError(f"{hf_path} is already quantized ({quantized.get('bits')}-bit), which {flags} cannot "
                        "undo: point --hf-path at its original float checkpoint")
    with staging(out, f"conversion of {hf_path}") as work:
        staged = work / "model"
        if is_assistant(json.loads(config_path.read_text())):
            convert_assistant(source, staged, quantize, q_bits, q_group_size, dtype)
        elif is_eagle3(json.loads(config_path.read_text())):
            convert_eagle3(source, staged, quantize, q_bits, q_group_size, dtype)
        elif block_kind(json.loads(config_path.read_text())):
            convert_block_drafter(source, staged, quantize, q_bits, q_group_size, dtype)
        else:
            mlx_lm_convert(str(source), str(staged), quantize=quantize, q_group_size=q_group_size, q_bits=q_bits,
                           dtype=dtype)
        config = json.loads((staged / "config.json").read_text())
        if (source / MTP_FILE).exists():  # an mlx-spec conversion: its MTP layer goes as it is
            copy_mtp(source, staged)
            print(f"[INFO] Kept the MTP layer in {MTP_FILE}")
        elif layer := mtp_layer(config, sorted(source.glob("model*.safetensors")), source):
            bits = mtp_bits if mtp_bits is not None else (8 if quantize else None)
            write_mtp(staged, layer, None if bits == 16 else bits, q_group_size,
                      dtype or checkpoint_dtype(json.loads(config_path.read_text())))
            print(f"[INFO] Kept the MTP layer in {MTP_FILE}")
        staged.rename(out)
    return out


def write_converted(module, config: dict, out: Path, dtype: str | None, quantize, q_bits: int, q_group_size: int,
                    extra: dict = {}) -> None:
    """A drafter mlx-lm cannot load, written in MLX form: floats cast to `dtype` (default: what its config
    declares), `quantize(module, group_size, bits)` applied when given (the config records it), its tensors and
    `extra` ones in model.safetensors beside its config.json."""
    if dtype := dtype or checkpoint_dtype(config) or checkpoint_dtype(config.get("transformer_layer_config", {})):
        module.set_dtype(getattr(mx, dtype))  # floating parameters only
    if quantize:
        quantize(module, q_group_size, q_bits)
        config["quantization"] = {"group_size": q_group_size, "bits": q_bits}
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), {**dict(tree_flatten(module.parameters())), **extra},
                        metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=4))


def convert_assistant(source: Path, out: Path, quantize: bool, q_bits: int, q_group_size: int,
                      dtype: str | None) -> None:
    """A Gemma 4 assistant: everything but the centroids quantized; the token ordering stays integer."""
    write_converted(load_assistant(source), json.loads((source / "config.json").read_text()), out, dtype,
                    quantize and quantize_assistant, q_bits, q_group_size)
    for extra in [*source.glob("*.json"), *source.glob("tokenizer.model"), *source.glob("*.jinja")]:
        if extra.name not in ("config.json", INDEX_FILE):
            shutil.copy(extra, out / extra.name)
    print(f"[INFO] Converted the Gemma 4 assistant{f' ({q_bits}-bit, centroids kept float)' if quantize else ''}")


def convert_eagle3(source: Path, out: Path, quantize: bool, q_bits: int, q_group_size: int,
                   dtype: str | None) -> None:
    """An EAGLE-3 head: layers quantized; the d2t / t2d maps kept as they are; its config keeps its own form (EAGLE
    or speculators) with the quantization added."""
    config = json.loads((source / "config.json").read_text())
    maps = {k: v for k, v in read_safetensors(source, "an EAGLE-3 head").items() if k in ("d2t", "t2d")}
    write_converted(load_eagle3(source, config), config, out, dtype,
                    quantize and (lambda head, group, bits: nn.quantize(head, group_size=group, bits=bits)), q_bits,
                    q_group_size, maps)
    print(f"[INFO] Converted the EAGLE-3 head{f' ({q_bits}-bit)' if quantize else ''}")


def convert_block_drafter(source: Path, out: Path, quantize: bool, q_bits: int, q_group_size: int,
                          dtype: str | None) -> None:
    """A block drafter: linear maps quantized where the group size divides them; speculators' d2t / t2d maps kept
    as they are; its config keeps the publisher's form with the quantization added."""
    config = json.loads((source / "config.json").read_text())
    drafter = load_block_drafter(source, config)
    maps = {k: v for k, v in read_safetensors(source, "a block drafter").items() if k in ("d2t", "t2d")}
    write_converted(drafter, config, out, dtype, quantize and quantize_block_drafter, q_bits, q_group_size, maps)
    print(f"[INFO] Converted the {drafter.config['kind']} drafter{f' ({q_bits}-bit)' if quantize else ''}")


def add_mtp(hf_path: str, mlx_path: str, mtp_bits: int | None = None, group_size: int = 64) -> Path:
    """Graft the MTP layer of the original checkpoint onto an MLX conversion that lost it, fetching only the
    shards that hold `mtp.*`."""
    target = Path(mlx_path).expanduser()
    config_path = target / "config.json"
    if not config_path.exists():
        raise SpecError(f"{target} is not an MLX checkpoint directory (no config.json)")
    config = read_config(target)
    if not declared_mtp_layers(config) and not is_nextn(config):
        raise SpecError(f"{target} declares no MTP layer (mtp_num_hidden_layers, num_nextn_predict_layers): "
                        "nothing to add")
    if is_nextn(config):
        check_supported(config, target)
    if holds_mtp(config, checkpoint_files(target)):
        raise SpecError(f"{target} already holds its MTP layer")
    shards = mtp_shards(hf_path)
    source = resolve(hf_path, shards)
    layer = mtp_layer(config, [source / s for s in shards if (source / s).exists()], hf_path)
    bits = mtp_bits if mtp_bits is not None else (8 if config.get("quantization") else None)
    write_mtp(target, layer, None if bits == 16 else bits, group_size, checkpoint_dtype(config))
    print(f"[INFO] Added the MTP layer (from {', '.join(shards)}) to {target}")
    return target
