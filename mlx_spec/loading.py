"""Resolve a model name, path or hub id; load target and drafter; check that they belong together."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

import psutil

from .decode.engine import Engine, check_draft_len
from .drafters.dflash import BlockDrafter
from .drafters.draft_model import DraftModelDrafter
from .drafters.eagle3 import Eagle3Drafter
from .drafters.gemma4_assistant import AssistantDrafter, shared_kv_sources
from .drafters.kinds import ASSISTANT_MAX_DRAFT_LEN, DRAFTERS, default_drafter
from .drafters.lookahead import LookaheadDrafter
from .drafters.medusa import MedusaDrafter
from .drafters.ngram import NgramDrafter
from .drafters.qwen_mtp import MTPDrafter
from .drafters.suffix import SuffixDrafter, shared_index
from .models.common import materialize
from .models.dflash import block_kind, load_block_drafter
from .models.dflash import read_config as block_config
from .models.eagle3 import feature_layers, is_eagle3, load_eagle3
from .models.eagle3 import read_config as eagle3_config
from .models.gemma4_assistant import is_assistant, load_assistant
from .models.medusa import is_medusa, load_medusa, medusa_shape
from .models.mtp_head import ARCHITECTURE as MTP_HEAD
from .models.mtp_head import is_mtp_head, load_head
from .models.nextn import check_supported, declared_nextn_layers, is_nextn, load_nextn
from .models.qwen3_5 import (
    checkpoint_files,
    declared_mtp_layers,
    lm_head,
    load_mtp,
    text_model,
)
from .policy.profiles import Profiles
from .runners.target import MAX_DRAFT_LEN, Target
from .seams import compat
from .seams.distributed import Lockstep, join
from .seams.errors import SpecError

REGISTRY = Path(__file__).with_name("models.toml")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "*.tiktoken")
HUB_PATTERNS = ["*.json", "model*.safetensors", "mtp.safetensors", "medusa_lm_head.safetensors", "tokenizer.model",
                "*.tiktoken", "*.txt", "*.jinja"]
VOCAB_PADDING_TOLERANCE = 128


def registry() -> dict:
    return tomllib.loads(REGISTRY.read_text())["models"]


DEMO = Path(__file__).with_name("demo")  # written by scripts/train_demo.py; see demo/report.md
DEMO_NAME = "demo"  # its models.toml entry, used when no model is given
DEMO_NOTICE = ("no --model given: using the built-in demo (Qwen3.5 layout with its MTP layer and a draft model; "
               "mlx_spec/demo/report.md), {note}. Run a real model with --model qwen3.6-27b, a hub id or a directory")


def model_entry(name: str | None) -> dict:
    """The models.toml entry of a model name (the demo's for None); {} for a path or hub id."""
    return registry().get(name or DEMO_NAME, {})


def resolve(name: str, files: list[str] = HUB_PATTERNS) -> Path:
    """A local directory, a models.toml alias or a Hugging Face repo id -> a local checkpoint directory;
    from the hub only `files` are fetched (resumably, with progress, into the hub cache)."""
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise SpecError(f"{name} is a file, not a model directory: pass the folder that holds config.json")
        return path
    entry = registry().get(name)
    if entry and "path" in entry:
        return Path(__file__).parent / entry["path"]
    repo = entry["repo"] if entry else name
    if repo.count("/") != 1 or repo.startswith((".", "/", "~")):
        raise SpecError(f"unknown model {name!r}: not a directory, not in models.toml "
                        f"({', '.join(sorted(registry()))}), not a hub id like org/name")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, allow_patterns=files))
    except Exception as e:  # the hub client raises many types; all mean the same to the user
        raise SpecError(f"could not fetch {repo!r} from the Hugging Face hub ({type(e).__name__}): "
                        "check the name and your network, or pass a local directory") from None


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


def load_target(model: str | None, draft_model: str | None = None, distributed: str | None = None) -> LoadedTarget:
    """Resolve and load a target; `draft_model` (when one will be used) is counted in the memory check.
    distributed: "tensor" or "pipeline" shards it across the ranks `mlx.launch` started (this process holds its
    slice; every engine made from it runs in lockstep with the other ranks')."""
    model = model or DEMO_NAME
    entry = registry().get(model, {})
    target_path, default_draft = resolve(model), entry.get("draft_model")
    group = join(distributed) if distributed else None
    check_memory(target_path, resolve(draft_model) if draft_model else None, shards=group.size() if group else 1)
    split = (lambda m: compat.split_model(m, distributed, group, target_path.name)) if group else None
    target_model, tokenizer, config = load_checkpoint(target_path, "target model", split)
    return LoadedTarget(target_path, target_model, tokenizer, config, entry, default_draft,
                        Lockstep(group) if group else None, distributed)


MAX_TREE_WIDTH = 8
TREE_DRAFTERS = ("draft-model", "ngram", "suffix", "off")  # those --tree-width applies to


def check_options(drafter: str | None, draft_len: int | None, mtp_hidden: str, tree_width: int) -> None:
    """Refuse the options that are wrong whatever the model (before it loads)."""
    if drafter is not None and drafter not in DRAFTERS:
        raise SpecError(f"unknown drafter {drafter!r}: choose one of {', '.join(DRAFTERS)}")
    check_draft_len(draft_len)
    if mtp_hidden not in ("post", "pre"):
        raise SpecError(f"mtp_hidden must be 'post' or 'pre', got {mtp_hidden!r}")
    if isinstance(tree_width, bool) or not isinstance(tree_width, int) or not 1 <= tree_width <= MAX_TREE_WIDTH:
        raise SpecError(f"tree width must be from 1 (a chain) to {MAX_TREE_WIDTH}, got {tree_width!r}")


def make_engine(target: LoadedTarget, draft_model: str | None = None, drafter: str | None = None,
                draft_len: int | None = None, kv_bits: int | None = None, kv_group_size: int = 64,
                mtp_hidden: str = "post", tree_width: int = 1, mtp_path: str | None = None,
                suffix_cache: str | None = None) -> Engine:
    """An Engine around a loaded target with the chosen drafter (see `load` for the arguments)."""
    declares_mtp = declared_mtp_layers(target.config) + declared_nextn_layers(target.config) > 0
    drafter = drafter or default_drafter(bool(draft_model), declares_mtp or bool(mtp_path),
                                         bool(target.default_draft_model))
    draft_model = draft_model or target.default_draft_model
    check_options(drafter, draft_len, mtp_hidden, tree_width)
    if drafter == "draft-model" and not draft_model:
        raise SpecError("--drafter draft-model needs --draft-model PATH_OR_REPO")
    if drafter == "mtp" and not (declares_mtp or mtp_path):
        raise SpecError(f"{target.path} declares no MTP layer (mtp_num_hidden_layers, num_nextn_predict_layers): "
                        "train one with `mlx-spec train-mtp` and give it with --mtp-path, or use --drafter ngram or "
                        "--draft-model")
    head_path = resolve(mtp_path) if mtp_path and drafter == "mtp" else None
    if head_path and not is_mtp_head(head_config := read_config(head_path)):
        raise SpecError(f"--mtp-path {mtp_path} holds no MTP head (its config.json does not name the architecture "
                        f"{MTP_HEAD}): give a folder `mlx-spec train-mtp` wrote")
    if head_path and mtp_hidden != "post":
        raise SpecError("--mtp-hidden pre: a trained MTP head reads the target's post-norm hidden state; drop it")
    if tree_width > 1 and drafter not in TREE_DRAFTERS:
        raise SpecError(f"--tree-width needs a draft model (--draft-model) or --drafter ngram or suffix: the "
                        f"{drafter} drafter proposes chains only")
    draft_path = resolve(draft_model) if drafter == "draft-model" else None
    draft_config = read_config(draft_path) if draft_path else {}
    assistant, medusa, eagle3 = is_assistant(draft_config), is_medusa(draft_config), is_eagle3(draft_config)
    block = block_kind(draft_config) and block_config(draft_config, draft_path)
    if is_mtp_head(draft_config):
        raise SpecError(f"{draft_model} is an MTP head: draft with it by --mtp-path {draft_model}")
    if tree_width > 1 and assistant:
        raise SpecError("--tree-width needs a draft model: a Gemma 4 assistant proposes chains only")
    max_draft_len = target.entry.get("draft_len") or (
        ASSISTANT_MAX_DRAFT_LEN if assistant else medusa_shape(draft_config, draft_path)[0] if medusa
        else min(block["drafts"], MAX_DRAFT_LEN) if block else DRAFTERS[drafter].max_draft_len)
    wants_hidden = (mtp_hidden if drafter == "mtp" else "post" if assistant or medusa
                    else eagle3_features(draft_path, draft_config, target) if eagle3
                    else block_features(draft_path, block, target) if block else None)
    if isinstance(wants_hidden, list) and target.distributed == "pipeline":
        raise SpecError(f"the {'block drafter' if block else 'EAGLE-3 head'} reads the outputs of layers that "
                        "--distributed pipeline places on other ranks: use --distributed tensor")
    if kv_bits and (problem := kv_quantization_problem(target.config, kv_group_size)):
        raise SpecError(f"--kv-bits cannot be used with {target.path}: {problem}")
    runner = Target(target.model, kv_bits, kv_group_size, hidden=wants_hidden)
    if drafter != "off" and (problem := runner.rollback_problem()):
        raise SpecError(f"speculation is not available for {target.path}: {problem}; run with --drafter off")

    chosen = None
    if drafter == "ngram":
        chosen = NgramDrafter()
    elif drafter == "suffix":
        chosen = SuffixDrafter(shared_index(Path(suffix_cache).expanduser() if suffix_cache else None))
    elif drafter == "lookahead":
        if problem := runner.tree_problem():
            raise SpecError(f"lookahead decoding verifies a token tree, and {target.path.name} {problem}: use "
                            "--drafter ngram")
        chosen = LookaheadDrafter()
    elif head_path:
        mtp = load_head(head_path, head_config, target.model, target.config)
        chosen = MTPDrafter(mtp, compat.input_embedding(target.model), mtp.logits)
    elif drafter == "mtp" and is_nextn(target.config):
        check_supported(target.config, target.path)
        nextn = load_nextn(target.path, target.config, checkpoint_files(target.path))
        chosen = MTPDrafter(nextn, compat.input_embedding(target.model),
                            lambda x: target.model.lm_head(nextn.shared_norm(x)))
    elif drafter == "mtp":
        if text_model(target.model) is None:
            raise SpecError(f"MTP drafting supports Qwen3.5 / 3.6 and Qwen3-Next checkpoints; {target.path} is "
                            f"{target.config.get('model_type')!r}: use --drafter ngram or --draft-model")
        chosen = MTPDrafter(load_mtp(target.path, target.config), text_model(target.model).model.embed_tokens,
                             lm_head(target.model))
    elif assistant:
        check_memory(draft_path, None, what="draft model")
        chosen = load_assistant_drafter(draft_path, target, runner, kv_bits)
    elif medusa:
        chosen = load_medusa_drafter(draft_path, draft_config, target)
    elif eagle3:
        check_memory(draft_path, None, what="EAGLE-3 head")
        chosen = Eagle3Drafter(load_eagle3(draft_path, draft_config), target.model)  # paired: eagle3_features
    elif block:
        check_memory(draft_path, None, what="block drafter")
        chosen = BlockDrafter(load_block_drafter(draft_path, draft_config), target.model)  # paired: block_features
    elif drafter == "draft-model":
        check_memory(draft_path, None, what="draft model")
        draft, draft_tok, draft_cfg = load_checkpoint(draft_path, "draft model")
        if kv_bits and (problem := kv_quantization_problem(draft_cfg, kv_group_size)):
            raise SpecError(f"--kv-bits cannot be used with the draft model {draft_path}: {problem}")
        if why := vocab_mismatch(target.tokenizer, target.config, draft_tok, draft_cfg):
            raise SpecError(f"draft model {draft_path} does not share the target's vocabulary: {why}; "
                            "use a draft from the same model family")
        chosen = DraftModelDrafter(draft, vocab_size(target.config), kv_bits, kv_group_size)
        if problem := chosen.runner.rollback_problem():
            raise SpecError(f"draft model {draft_path} cannot be used: {problem}")

    if tree_width > 1 and chosen is not None:
        where, problem = target.path.name, runner.tree_problem()
        if problem is None and isinstance(chosen, DraftModelDrafter):
            where, problem = draft_path.name, chosen.runner.tree_problem(by_levels=True)
        if problem is None and chosen.name in ("dspark", "dflash2"):
            where, problem = draft_path.name, f"is a {chosen.name} drafter: each draft depends on the one before"
        if problem is None and chosen.name == "eagle3" and chosen.mtp.windowed:
            where, problem = draft_path.name, "has sliding-window layers, which draft chains only"
        chosen.width, chosen.no_tree = (1, f"{where} {problem}") if problem else (tree_width, None)

    def sibling(name: str) -> Engine:
        return make_engine(target, draft_model, name, draft_len, kv_bits, kv_group_size, mtp_hidden,
                           tree_width if name in TREE_DRAFTERS else 1, mtp_path, suffix_cache)
    runner.hidden_tail = getattr(chosen, "hidden_tail", None)
    engine = Engine(runner, target.tokenizer, chosen, draft_len, max(max_draft_len, draft_len or 0), sibling,
                    available_drafters(target, draft_model, runner.tree_problem() is None, mtp_path) + ["off"],
                    context_length(target.config),
                    Profiles(str(target.path.resolve()), drafter, str(draft_path or mtp_path or ""), f"kv {kv_bits}",
                             f"width {getattr(chosen, 'width', 1)}", str(target.distributed)))
    engine.lockstep = target.lockstep
    return engine


def available_drafters(target: LoadedTarget, draft_model: str | None, trees: bool,
                       mtp_path: str | None = None) -> list[str]:
    """The drafters this target can use ("off" aside): its MTP layer or a trained one, a known draft model,
    n-gram, and lookahead where it verifies token trees."""
    return (["mtp"] * (bool(mtp_path) or declared_mtp_layers(target.config) + declared_nextn_layers(target.config) > 0)
            + ["draft-model"] * bool(draft_model or target.default_draft_model) + ["ngram", "suffix"]
            + ["lookahead"] * trees)


def assistant_mismatch(assistant_cfg: dict, target_cfg: dict) -> str | None:
    """Why a Gemma 4 assistant cannot serve this target (None when it can)."""
    text, own = target_cfg.get("text_config", target_cfg), assistant_cfg["text_config"]
    if not text.get("model_type", "").startswith("gemma4"):
        return f"the target is {target_cfg.get('model_type')!r}, not a Gemma 4 model"
    if assistant_cfg["backbone_hidden_size"] != text["hidden_size"]:
        return (f"it was trained on a backbone of hidden size {assistant_cfg['backbone_hidden_size']}, the target's "
                f"is {text['hidden_size']}")
    if own["vocab_size"] != text["vocab_size"]:
        return f"vocabulary sizes differ ({text['vocab_size']} vs {own['vocab_size']})"
    for key in ("head_dim", "global_head_dim", "num_key_value_heads"):
        if own.get(key) != text.get(key):
            return f"its {key} is {own.get(key)}, the target's K/V have {text.get(key)}"
    return None


def load_medusa_drafter(path: Path, config: dict, target: LoadedTarget) -> MedusaDrafter:
    """Medusa heads checked against their target."""
    heads = load_medusa(path, config)
    vocab, hidden = heads.heads[0].out.weight.shape
    text = target.config.get("text_config", target.config)
    trained_for = config.get("base_model_name_or_path", "another model")
    if hidden != text["hidden_size"] or vocab != vocab_size(target.config):
        raise SpecError(f"the Medusa heads {path} (hidden size {hidden}, vocabulary {vocab}) were trained for "
                        f"{trained_for}, not {target.path} (hidden size {text['hidden_size']}, vocabulary "
                        f"{vocab_size(target.config)}): use heads trained for this target")
    return MedusaDrafter(heads)


def eagle3_features(path: Path, config: dict, target: LoadedTarget) -> list[int]:
    """The target layers an EAGLE-3 head reads, after checking that the head was trained for this target."""
    text = target.config.get("text_config", target.config)
    layers, hidden = text["num_hidden_layers"], text["hidden_size"]
    head = eagle3_config(config, path)
    features = feature_layers(head, layers)
    if head["target_hidden"] != hidden or head["vocab_size"] != vocab_size(target.config) or max(features) >= layers:
        raise SpecError(f"the EAGLE-3 head {path} (target hidden size {head['target_hidden']}, vocabulary "
                        f"{head['vocab_size']}, features of layers {features}) was not trained for {target.path} "
                        f"(hidden size {hidden}, vocabulary {vocab_size(target.config)}, {layers} layers): use the "
                        "head published for this target (see models.toml)")
    return features


def block_features(path: Path, block: dict, target: LoadedTarget) -> list[int]:
    """The target's hidden states a block drafter reads (the outputs of its target layers, as `hidden_reader`
    indices), after checking that it was trained for this target."""
    text = target.config.get("text_config", target.config)
    layers, hidden, vocab = text["num_hidden_layers"], text["hidden_size"], vocab_size(target.config)
    ids = block["target_layer_ids"]
    trained = (block["hidden_size"], block["target_layers"] or layers, block["vocab_size"])  # speculators': no count
    if trained != (hidden, layers, vocab) or max(ids) >= layers:
        counted = f"{block['target_layers']} target layers" if block["target_layers"] else f"layer ids up to {max(ids)}"
        raise SpecError(f"the {block['kind']} drafter {path} (hidden size {block['hidden_size']}, "
                        f"{counted}, vocabulary {block['vocab_size']}) was not trained "
                        f"for {target.path} (hidden size {hidden}, {layers} layers, vocabulary {vocab}): use the "
                        "drafter published for this target (see models.toml)")
    if not 0 <= block["mask"] < vocab:
        raise SpecError(f"the {block['kind']} drafter {path}: its mask token {block['mask']} is outside the "
                        f"vocabulary of {vocab}: re-download the drafter")
    return [i + 1 for i in ids]


def load_assistant_drafter(path: Path, target: LoadedTarget, runner: Target, kv_bits: int | None):
    """A Gemma 4 assistant checked against its target."""
    config = read_config(path)
    if why := assistant_mismatch(config, target.config):
        raise SpecError(f"the Gemma 4 assistant {path} does not pair with {target.path}: {why}; use the assistant "
                        "published for this target (see models.toml)")
    if kv_bits:
        raise SpecError("the Gemma 4 assistant reads the target's K/V, which must stay float: drop --kv-bits")
    missing = set(config["text_config"]["layer_types"]) - set(shared_kv_sources(target.model))
    if missing:
        raise SpecError(f"{target.path} has no non-shared {', '.join(sorted(missing))} layer for the assistant")
    return AssistantDrafter(load_assistant(path), runner)


def load(model: str | None = None, draft_model: str | None = None, drafter: str | None = None,
         draft_len: int | None = None, kv_bits: int | None = None, kv_group_size: int = 64,
         mtp_hidden: str = "post", tree_width: int = 1, distributed: str | None = None,
         mtp_path: str | None = None, suffix_cache: str | None = None) -> Engine:
    """Load a target and a drafter into an Engine.

    model: directory, models.toml alias or hub id; None uses the built-in offline demo model.
    draft_len: drafts per round, pinned; None (default) lets the adaptive policy choose between 0 (plain
    decoding) and the models.toml recommendation or the drafter's default maximum.
    drafter: a name from `drafter_kinds.DRAFTERS` ("mtp", "draft-model", "ngram", "off"); default: the first of
    `drafters.DEFAULT_ORDER` that this target has.
    mtp_hidden: the target hidden state fed to the MTP layer, after ("post", as the reference implementations)
    or before ("pre") the final norm.
    mtp_path: an MTP head `mlx-spec train-mtp` trained for this target: the "mtp" drafter (and the default one
    unless a draft model is given).
    suffix_cache: a file the "suffix" drafter's index is loaded from and saved to when the process exits.
    tree_width: > 1 makes the draft model (or n-gram, suffix) propose token trees of that many nodes per level
    (verified in one forward); targets or drafts whose caches cannot hold a tree draft chains, and
    `status().shape` says why.
    distributed: "tensor" or "pipeline": the target sharded across the ranks `mlx.launch` started, the drafter
    whole on each (`distributed.Lockstep`; rank 0 leads, the others call `engine.lockstep.follow(engine)`).
    """
    check_options(drafter, draft_len, mtp_hidden, tree_width)
    planned_draft = draft_model if drafter in (None, "draft-model") else None
    if planned_draft is None and (drafter == "draft-model" or drafter is None and not mtp_path):
        planned_draft = registry().get(model or DEMO_NAME, {}).get("draft_model")
    target = load_target(model, planned_draft, distributed)
    return make_engine(target, draft_model, drafter, draft_len, kv_bits, kv_group_size, mtp_hidden, tree_width,
                       mtp_path, suffix_cache)
