"""Resolve a model name, path or hub id; load target and drafter; check that they belong together."""

from __future__ import annotations

import tomllib
from importlib import import_module
from pathlib import Path

from .decode.engine import Engine, check_draft_len
from .drafters.kinds import DRAFTERS, default_drafter
from .drafters.protocol import Pairing
from .models.nextn import declared_nextn_layers
from .models.qwen3_5 import declared_mtp_layers
from .policy.profiles import Profiles
from .runners.checkpoint import (
    LoadedTarget,
    check_memory,
    context_length,
    kv_quantization_problem,
    load_checkpoint,
    read_config,
    unread_mtp_claim,
)
from .runners.target import Target
from .runners.vision import Vision
from .seams import compat
from .seams.distributed import Lockstep, join
from .seams.errors import SpecError

REGISTRY = Path(__file__).with_name("models.toml")
HUB_PATTERNS = ["*.json", "model*.safetensors", "mtp.safetensors", "medusa_lm_head.safetensors", "tokenizer.model",
                "*.tiktoken", "*.txt", "*.jinja"]


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
                        Lockstep(group) if group else None, distributed, Vision.of(target_path, config))


MAX_TREE_WIDTH = 8


def check_options(drafter: str | None, draft_len: int | None, mtp_hidden: str | None, tree_width: int) -> None:
    """Refuse the options that are wrong whatever the model (before it loads)."""
    if drafter is not None and drafter not in DRAFTERS:
        raise SpecError(f"unknown drafter {drafter!r}: choose one of {', '.join(DRAFTERS)}")
    check_draft_len(draft_len)
    if mtp_hidden not in (None, "post", "pre"):
        raise SpecError(f"mtp_hidden must be 'post', 'pre' or None, got {mtp_hidden!r}")
    if isinstance(tree_width, bool) or not isinstance(tree_width, int) or not 1 <= tree_width <= MAX_TREE_WIDTH:
        raise SpecError(f"tree width must be from 1 (a chain) to {MAX_TREE_WIDTH}, got {tree_width!r}")


def make_engine(target: LoadedTarget, draft_model: str | None = None, drafter: str | None = None,
                draft_len: int | None = None, kv_bits: int | None = None, kv_group_size: int = 64,
                mtp_hidden: str | None = None, tree_width: int = 1, mtp_path: str | None = None,
                suffix_cache: str | None = None) -> Engine:
    """An Engine around a loaded target with the chosen drafter (see `load` for the arguments): the first of the
    drafter's kinds (`drafters.kinds.DRAFTERS`) that recognises the checkpoints given is checked against the
    target, tells what it reads of it, and is built."""
    declares_mtp = declared_mtp_layers(target.config) + declared_nextn_layers(target.config) > 0
    unread = None if declares_mtp or mtp_path else unread_mtp_claim(target.config, target.path)
    notice = unread and not drafter  # the default drafter is not the MTP layer the config claims
    drafter = drafter or default_drafter(bool(draft_model), declares_mtp or bool(mtp_path),
                                         bool(target.default_draft_model))
    draft_model = draft_model or target.default_draft_model
    check_options(drafter, draft_len, mtp_hidden, tree_width)
    if drafter == "draft-model" and not draft_model:
        raise SpecError("--drafter draft-model needs --draft-model PATH_OR_REPO")
    if drafter == "mtp" and unread:
        raise SpecError(f"MTP drafting cannot run: {unread}; use --drafter ngram or --draft-model")
    if drafter == "mtp" and not (declares_mtp or mtp_path):
        raise SpecError(f"{target.path} declares no MTP layer (mtp_num_hidden_layers, num_nextn_predict_layers): "
                        "train one with `mlx-spec train-mtp` and give it with --mtp-path, or use --drafter ngram or "
                        "--draft-model")
    if tree_width > 1 and not DRAFTERS[drafter].trees:
        raise SpecError(f"--tree-width needs a draft model (--draft-model) or --drafter ngram or suffix: the "
                        f"{drafter} drafter proposes chains only")
    pairing = pair(target, draft_model if drafter == "draft-model" else None, mtp_path if drafter == "mtp" else None,
                   kv_bits, kv_group_size, mtp_hidden, suffix_cache)
    kind = next((kind for module in DRAFTERS[drafter].modules
                 for kind in import_module(f"{__package__}.drafters.{module}").KINDS if kind.recognises(pairing)),
                None)  # None: drafting off
    if kind and tree_width > 1 and kind.chains_only:
        raise SpecError(f"--tree-width needs a draft model: {kind.chains_only}")
    if kind:
        kind.check(pairing)
    max_draft_len = target.entry.get("draft_len") or (kind and kind.max_draft_len(pairing)) or \
        DRAFTERS[drafter].max_draft_len
    reads = kind.reads(pairing) if kind else None
    if isinstance(reads, list) and target.distributed == "pipeline":
        raise SpecError(f"the {kind.name} drafter reads the outputs of layers that --distributed pipeline places "
                        "on other ranks: use --distributed tensor")
    if kv_bits and (problem := kv_quantization_problem(target.config, kv_group_size)):
        raise SpecError(f"--kv-bits cannot be used with {target.path}: {problem}")
    runner = Target(target.model, kv_bits, kv_group_size, hidden=reads)
    if drafter != "off" and (problem := runner.rollback_problem()):
        raise SpecError(f"speculation is not available for {target.path}: {problem}; run with --drafter off")
    chosen = kind.build(pairing, runner) if kind else None
    if tree_width > 1 and chosen is not None:
        problem = runner.tree_problem()
        no_tree = f"{target.path.name} {problem}" if problem else kind.tree_problem(pairing, chosen)
        chosen.width, chosen.no_tree = (1, no_tree) if no_tree else (tree_width, None)

    def sibling(name: str) -> Engine:
        return make_engine(target, draft_model, name, draft_len, kv_bits, kv_group_size, mtp_hidden,
                           tree_width if DRAFTERS[name].trees else 1, mtp_path, suffix_cache)
    runner.hidden_tail = chosen.hidden_tail if chosen else None
    engine = Engine(runner, target.tokenizer, chosen, draft_len, max(max_draft_len, draft_len or 0), sibling,
                    available_drafters(target, draft_model, runner.tree_problem() is None, mtp_path) + ["off"],
                    context_length(target.config),
                    Profiles(str(target.path.resolve()), drafter, str(pairing.draft_path or mtp_path or ""),
                             f"kv {kv_bits}", f"width {chosen.width if chosen else 1}", str(target.distributed)),
                    target.vision)
    engine.lockstep = target.lockstep
    engine.notice = f"{unread}: drafting with {drafter}" if notice else None
    return engine


def pair(target: LoadedTarget, draft_model: str | None, mtp_path: str | None, kv_bits: int | None,
         kv_group_size: int, mtp_hidden: str | None, suffix_cache: str | None) -> Pairing:
    """The target and the drafter's checkpoints (resolved, with their configs) as the drafters' kinds see them."""
    draft_path = resolve(draft_model) if draft_model else None
    head_path = resolve(mtp_path) if mtp_path else None
    return Pairing(target, draft_model, draft_path, read_config(draft_path) if draft_path else {}, mtp_path,
                   head_path, read_config(head_path) if head_path else {}, kv_bits, kv_group_size, mtp_hidden,
                   Path(suffix_cache).expanduser() if suffix_cache else None)


def available_drafters(target: LoadedTarget, draft_model: str | None, trees: bool,
                       mtp_path: str | None = None) -> list[str]:
    """The drafters this target can use ("off" aside): its MTP layer or a trained one, a known draft model,
    n-gram, and lookahead where it verifies token trees."""
    return (["mtp"] * (bool(mtp_path) or declared_mtp_layers(target.config) + declared_nextn_layers(target.config) > 0)
            + ["draft-model"] * bool(draft_model or target.default_draft_model) + ["ngram", "suffix"]
            + ["lookahead"] * trees)


def load(model: str | None = None, draft_model: str | None = None, drafter: str | None = None,
         draft_len: int | None = None, kv_bits: int | None = None, kv_group_size: int = 64,
         mtp_hidden: str | None = None, tree_width: int = 1, distributed: str | None = None,
         mtp_path: str | None = None, suffix_cache: str | None = None) -> Engine:
    """Load a target and a drafter into an Engine.

    model: directory, models.toml alias or hub id; None uses the built-in offline demo model.
    draft_len: drafts per round, pinned; None (default) lets the adaptive policy choose between 0 (plain
    decoding) and the models.toml recommendation or the drafter's default maximum.
    drafter: a name from `drafters.kinds.DRAFTERS` ("mtp", "draft-model", "ngram", "off"); default: the first of
    `drafters.DEFAULT_ORDER` that this target has.
    mtp_hidden: the target hidden state fed to the MTP layer, after ("post") or before ("pre") the final norm;
    None: as the family's reference implementation feeds it (after, but for MiMo).
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
