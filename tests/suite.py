"""Every tiny checkpoint the tests use. Random-weight checkpoints are drawn at the start of a run (seconds);
trained ones (draft heads, nextn layers, a distilled assistant) and the tokenizers they were trained with are
shipped in tests/fixtures/, because training them takes minutes. `fixtures/manifest.json` records each shipped
file's hash and the hash of every checkpoint it was trained on, so a fixture never meets other base weights.

    python tests/suite.py               # retrain the fixtures into tests/fixtures/ and rewrite the manifest
    python tests/suite.py NAME ...      # retrain these (a new recipe's) only, the others kept as shipped
    python -m pytest -m fixtures        # retrain them in a temporary folder and check they come out the same

The manifest also records what each recipe makes in its first FIRST_STEPS steps, which every test run retrains
(tests/test_fixtures.py): a recipe that drifts from what it shipped fails the suite, not only `-m fixtures`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Callable, NamedTuple

os.environ.setdefault("MLX_SPEC_BLAS", "bundled")  # as the tests run (conftest.py): trained on MLX's own BLAS
import mlx_spec  # noqa: E402, F401  before anything imports mlx
from tiny import HEAD_TEXTS, PROMPT, QWEN3_5_FAMILIES, build_checkpoint, build_layer_skip_draft, build_tokenizer, \
    with_context
from tiny_block import train_block_drafter
from tiny_gemma4 import build_gemma4_assistant, build_gemma4_target, distill_gemma4_assistant
from tiny_heads import build_eagle3, build_medusa, build_mtp_head
from tiny_mtp import with_fitted_mtp
from tiny_nextn import NEXTN_FAMILIES, build_nextn_checkpoint, train_nextn, with_trained_nextn
from tiny_tools import build_tool_base, build_tool_tokenizer, train_tool_model
from tiny_vision import QWEN_VL, build_gemma4_vision, build_gemma4_vision_tokenizer, build_qwen3_5_vision, \
    build_qwen_vl, build_vision_tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MANIFEST = FIXTURES / "manifest.json"
REBUILD = "python tests/suite.py"
FITTED_MTP = {PROMPT: 100, HEAD_TEXTS[1]: 16}  # what the hybrids' fitted MTP layers draft: text -> tokens
FIRST_STEPS = 3  # not 1: Adam's first step moves each weight by its learning rate, whatever the gradient's size
PACKAGES = ("mlx", "mlx-lm", "numpy", "tokenizers")  # what the fixtures' bytes depend on beyond this repository


class Tokenizer(NamedTuple):
    """A shipped tokenizer: `build(out_dir)` writes it."""

    name: str
    build: Callable[[Path], object]


class Fixture(NamedTuple):
    """A trained folder: `train(out_dir, paths, steps)` writes it from the checkpoints named in `bases`, trained
    for `steps` optimizer steps (the recipe's `steps`, or its first FIRST_STEPS)."""

    name: str
    bases: tuple[str, ...]
    steps: int
    train: Callable[[Path, dict, int], object]


TOKENIZERS = [
    Tokenizer("tokenizer", lambda out: build_tokenizer(out)),
    Tokenizer("tokenizer-other",
              lambda out: build_tokenizer(out, vocab_size=480, special_tokens=["</s>", "<s>", "<unk>"])),
]
TRAINED = [
    Fixture("gemma4-assistant-trained", ("gemma4-assistant-dense", "gemma4"), 150,
            lambda out, paths, steps: distill_gemma4_assistant(out, paths["gemma4-assistant-dense"], paths["gemma4"],
                                                               steps=steps)),
    Fixture("qwen3-medusa", ("qwen3",), 80,
            lambda out, paths, steps: build_medusa(out, paths["qwen3"], HEAD_TEXTS, steps=steps)),
    Fixture("qwen3-eagle3", ("qwen3",), 120, lambda out, paths, steps: build_eagle3(
        out, paths["qwen3"], HEAD_TEXTS, feature_layers=[0, 2, 3], steps=steps)),
    Fixture("llama-eagle3", ("llama",), 120,
            lambda out, paths, steps: build_eagle3(out, paths["llama"], HEAD_TEXTS, steps=steps)),
    Fixture("qwen3-mtp-head", ("qwen3",), 80,
            lambda out, paths, steps: build_mtp_head(out, paths["qwen3"], HEAD_TEXTS, steps=steps)),
    Fixture("qwen3-dflash", ("qwen3",), 150, lambda out, paths, steps: train_block_drafter(
        out, paths["qwen3"], HEAD_TEXTS, steps=steps, layer_types=["sliding_attention", "full_attention"],
        sliding_window=9)),
    Fixture("qwen3_5-dspark", ("qwen3_5",), 150, lambda out, paths, steps: train_block_drafter(
        out, paths["qwen3_5"], HEAD_TEXTS, steps=steps, kind="dspark")),
    # its answers are checked once it has trained its course, not after its first steps
    Fixture("qwen3-tools", ("qwen3-tools-base",), 400, lambda out, paths, steps: train_tool_model(
        out, paths["qwen3-tools-base"], steps=steps, check=steps > FIRST_STEPS)),
    *[Fixture(f"{family}-nextn", (family,), 150, lambda out, paths, steps, family=family: train_nextn(
        out, paths[family], HEAD_TEXTS, steps=steps)) for family in NEXTN_FAMILIES],
]


def digest(folder: Path) -> str:
    """sha256 over a folder's files (names and bytes)."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def build_bases(root: Path, tokenizers: dict[str, Path], progress: Callable[[str], None]) -> dict[str, Path]:
    """The random-weight checkpoints, drawn from fixed seeds."""
    tok, other = tokenizers["tokenizer"], tokenizers["tokenizer-other"]
    builders = {
        "qwen3": lambda out: build_checkpoint(out, "qwen3", tok, layers=4, seed=0),
        "llama": lambda out: build_checkpoint(out, "llama", tok, layers=3, seed=2),
        "gemma3": lambda out: build_checkpoint(out, "gemma3", tok, layers=6, sliding_window=16, seed=3),
        "other-vocab": lambda out: build_checkpoint(out, "qwen3", other, layers=1, seed=4),
        "qwen3_5": lambda out: build_checkpoint(out, "qwen3_5", tok, layers=8, seed=7),
        "qwen3_5_moe": lambda out: build_checkpoint(out, "qwen3_5_moe", tok, layers=4, seed=6),
        "qwen3_next": lambda out: build_checkpoint(out, "qwen3_next", tok, layers=4, seed=7),
        # the same hybrids, their MTP layer fitted to draft their continuations of two texts right part of the time
        **{f"{family}-fitted-mtp": lambda out, family=family: with_fitted_mtp(out, paths[family], FITTED_MTP)
           for family in QWEN3_5_FAMILIES},
        "gemma4": lambda out: build_gemma4_target(out, tok, sliding_window=16),
        "gemma4-assistant": lambda out: build_gemma4_assistant(out, paths["gemma4"]),
        "gemma4-assistant-dense": lambda out: build_gemma4_assistant(out, paths["gemma4"], ordered=False),
        "qwen3-draft": lambda out: build_layer_skip_draft(out, paths["qwen3"], keep_layers=2),
        "qwen3-long": lambda out: with_context(out, paths["qwen3"], 131072),  # the server's: hours of tokens fit
        "llama-draft": lambda out: build_layer_skip_draft(out, paths["llama"], keep_layers=1),
        "gemma3-draft": lambda out: build_layer_skip_draft(out, paths["gemma3"], keep_layers=3),
        "qwen3_5-draft": lambda out: build_layer_skip_draft(out, paths["qwen3_5"], keep_layers=4),
        # Mamba 2 layers beside attention, MLP and expert layers; its draft all of them, perturbed a little (a
        # layer-skip draft of a random Mamba model agrees with it too seldom)
        # all layers, perturbed: close to the target but not equal, for sampled-distribution tests
        "qwen3-noisy": lambda out: build_layer_skip_draft(out, paths["qwen3"], keep_layers=4, noise=0.2),
        **{family: lambda out, family=family: build_nextn_checkpoint(out, family, tok) for family in NEXTN_FAMILIES},
        # Nemotron-H's (Mamba 2, attention, MLP and expert layers): a draft of all its layers perturbed a little (a
        # layer-skip draft of a random Mamba model agrees with it too seldom)
        "nemotron_h-draft": lambda out: build_layer_skip_draft(out, paths["nemotron_h"], keep_layers=6, noise=0.01),
        # Qwen 3.5 with its vision tower, its tokenizer's vision tokens and its processor's files
        "tokenizer-vision": lambda out: build_vision_tokenizer(out),
        "qwen3_5-vision": lambda out: build_qwen3_5_vision(out, paths["tokenizer-vision"]),
        "qwen3_5-vision-draft": lambda out: build_layer_skip_draft(out, paths["qwen3_5-vision"], keep_layers=4),
        "qwen3_5_moe-vision": lambda out: build_qwen3_5_vision(out, paths["tokenizer-vision"], layers=4,
                                                               family="qwen3_5_moe"),
        # Qwen3-VL (deepstack) and Qwen2.5-VL (M-RoPE sections in a row), each with a layer-skip draft
        **{family: lambda out, family=family: build_qwen_vl(out, paths["tokenizer-vision"], family) for family in QWEN_VL},
        **{f"{family}-draft": lambda out, family=family: build_layer_skip_draft(out, paths[family], keep_layers=2)
           for family in QWEN_VL},
        # Gemma 4 with its vision tower, reading each image whole; its assistant and a layer-skip draft
        "tokenizer-gemma4-vision": lambda out: build_gemma4_vision_tokenizer(out),
        "gemma4-vision": lambda out: build_gemma4_vision(out, paths["tokenizer-gemma4-vision"]),
        "gemma4-vision-assistant": lambda out: build_gemma4_assistant(out, paths["gemma4-vision"]),
        "gemma4-vision-draft": lambda out: build_layer_skip_draft(out, paths["gemma4-vision"], keep_layers=4),
        "tokenizer-tools": lambda out: build_tool_tokenizer(out, tok),  # Qwen2.5's tool tokens and template
        "qwen3-tools-base": lambda out: build_tool_base(out, paths["tokenizer-tools"]),
    }
    progress(f"drawing {len(builders)} random-weight checkpoints")
    paths = {}
    for name, build in builders.items():
        paths[name] = Path(build(root / name))
    return paths


def build_suite(root: str | Path, progress: Callable[[str], None] = lambda line: None) -> dict[str, Path]:
    """Every checkpoint the tests use, under `root`: the shipped tokenizers and trained fixtures (checked against
    the manifest), and the random-weight checkpoints drawn from them. The nextn families' checkpoints carry their
    trained nextn layers."""
    root = Path(root)
    manifest = json.loads(MANIFEST.read_text())["fixtures"]
    shipped = {}
    for fixture in TOKENIZERS + TRAINED:
        source = FIXTURES / fixture.name
        if not source.is_dir() or digest(source) != manifest[fixture.name]["digest"]:
            raise RuntimeError(f"tests/fixtures/{fixture.name} is missing or differs from its manifest entry: "
                               f"rebuild the fixtures with `{REBUILD}`")
        shipped[fixture.name] = shutil.copytree(source, root / fixture.name)
    paths = {name: shipped[name] for name in ("tokenizer", "tokenizer-other")}
    paths.update(build_bases(root, paths, progress))
    for fixture in TRAINED:
        for base in fixture.bases:
            if digest(paths[base]) != manifest[fixture.name]["bases"][base]:
                raise RuntimeError(f"the {base} checkpoint drawn here differs from the one tests/fixtures/"
                                   f"{fixture.name} was trained on (a change to tests/tiny*.py or numpy's random "
                                   f"streams): rebuild the fixtures with `{REBUILD}`")
        paths[fixture.name] = shipped[fixture.name]
    for family in NEXTN_FAMILIES:
        with_trained_nextn(paths[family], shipped[f"{family}-nextn"])
    progress(f"{len(TRAINED)} trained fixtures from tests/fixtures, checked against its manifest")
    return paths


def train_fixtures(out: Path, progress: Callable[[str], None] = print, first_steps: bool = False,
                   only: set[str] | None = None) -> dict:
    """Train every fixture (or those named in `only`, the shipped tokenizers used) into `out` (one folder each),
    in full or for its FIRST_STEPS only (the tokenizers in full either way); returns their manifest entries, the
    digest of a first-steps folder as `first_steps`."""
    entries, tokenizers = {}, {tokenizer.name: FIXTURES / tokenizer.name for tokenizer in TOKENIZERS}
    for tokenizer in TOKENIZERS if only is None else ():
        tokenizer.build(out / tokenizer.name)
        entries[tokenizer.name] = {"bases": {}, "digest": digest(out / tokenizer.name)}
        tokenizers[tokenizer.name] = out / tokenizer.name
    scratch = out / ".bases"
    paths = build_bases(scratch, tokenizers, progress)
    for fixture in TRAINED if only is None else [f for f in TRAINED if f.name in only]:
        start = time.perf_counter()
        fixture.train(out / fixture.name, paths, FIRST_STEPS if first_steps else fixture.steps)
        entries[fixture.name] = {"bases": {base: digest(paths[base]) for base in fixture.bases},
                                 "steps": fixture.steps,
                                 "first_steps" if first_steps else "digest": digest(out / fixture.name)}
        progress(f"trained {fixture.name} in {time.perf_counter() - start:.0f} s")
    shutil.rmtree(scratch)
    return entries


def differing(rebuilt: dict, shipped: dict) -> list[str]:
    """The fixtures on one side only, or whose rebuilt manifest entry disagrees with the shipped one on a field."""
    def agrees(name: str) -> bool:
        return name in rebuilt and name in shipped and all(shipped[name].get(key) == value
                                                           for key, value in rebuilt[name].items())
    return sorted(name for name in shipped.keys() | rebuilt.keys() if not agrees(name))


def packages_since(built: dict) -> str:
    """The packages installed in other versions than the fixtures were built with, said as `name a -> b`."""
    return ", ".join(f"{package} {built.get(package)} -> {version(package)}" for package in PACKAGES
                     if built.get(package) != version(package))


def main(names: list[str]) -> None:
    if unknown := sorted(set(names) - {f.name for f in TRAINED}):
        raise SystemExit(f"no fixture {unknown[0]!r}: choose among {', '.join(f.name for f in TRAINED)}")
    only = set(names) or None
    staging = FIXTURES.with_name("fixtures.new")
    shutil.rmtree(staging, ignore_errors=True)
    if only:  # the others as shipped
        shutil.copytree(FIXTURES, staging, ignore=lambda folder, files: [f for f in files if f in only])
    else:
        staging.mkdir()
    with tempfile.TemporaryDirectory() as scratch:
        first_steps = train_fixtures(Path(scratch), first_steps=True, only=only)
    entries = train_fixtures(staging, only=only)
    for name, entry in first_steps.items():
        entries[name].update(entry)
    if only:
        entries = {**json.loads(MANIFEST.read_text())["fixtures"], **entries}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=FIXTURES.parent).stdout.strip()
    built = {"command": REBUILD, "commit": commit, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
             "python": platform.python_version(), "machine": platform.machine(),
             **{package: version(package) for package in PACKAGES}}
    (staging / "manifest.json").write_text(json.dumps({"built": built, "fixtures": entries}, indent=2) + "\n")
    shutil.rmtree(FIXTURES, ignore_errors=True)
    staging.rename(FIXTURES)
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    print(f"wrote {FIXTURES} ({total / 1e6:.1f} MB)")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
