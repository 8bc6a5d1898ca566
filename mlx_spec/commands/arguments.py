"""The command line's arguments: what `mlx-spec --help` shows. It imports nothing heavy (help and argument errors
come at once); cli.py runs the commands."""

from __future__ import annotations

import argparse
import os

SERVE_BATCH = 8  # `serve`'s default batch size where memory allows


def add_model_args(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags that choose what to load; returns them."""
    from ..drafters.kinds import DEFAULT_ORDER, DRAFTERS

    actions = []

    def add(*flags, **kwargs):
        actions.append(parser.add_argument(*flags, **kwargs))

    add("--model", help="model directory, models.toml name or hub id (default: built-in demo)")
    add("--draft-model", help="what to draft with: a smaller model of the same vocabulary, a Gemma 4 assistant, "
                              "Medusa or EAGLE-3 heads, or a DFlash / DFlash2 / DSpark block drafter")
    add("--mtp-path", help="an MTP head `mlx-spec train-mtp` trained for --model: the mtp drafter")
    add("--drafter", choices=list(DRAFTERS),
        help="; ".join(f"{k.name}: {k.help}" for k in DRAFTERS.values()) + f" (default: {DEFAULT_ORDER})")
    add("--num-draft", type=int,
        help="pin the tokens drafted per round (default: adaptive, from 0 = plain decoding up to "
             "the models.toml recommendation, else " +
             ", ".join(f"{k.name} {k.max_draft_len}" for k in DRAFTERS.values() if k.max_draft_len)
             + ")")
    add("--tree-width", type=int, default=1,
        help="draft token trees with this many nodes per level (a draft model, Medusa or EAGLE-3 heads, a DFlash "
             "block drafter, ngram or suffix; default 1: a chain)")
    add("--suffix-cache", metavar="FILE", help="the suffix drafter's index of earlier requests, loaded from FILE "
                                                "at start and saved there at exit (default: kept in memory only)")
    add("--mtp-hidden", choices=["post", "pre"],
        help="target hidden state fed to the MTP layer: after or before the final norm (default: as the family's "
             "reference implementation feeds it, after but for MiMo)")
    add("--kv-bits", type=int, choices=[4, 8], help="quantize the full-attention KV cache")
    add("--kv-group-size", type=int, default=64, choices=[32, 64, 128])
    add("--verbose", action="store_true", help="print the model's whole note every run (the built-in demo's is "
                                                "printed on a machine's first run only)")
    add("--distributed", choices=["tensor", "pipeline"],
        help="shard the target across the processes mlx.launch started (tensor or pipeline parallelism); every "
             "rank drafts for itself, rank 0 prints and writes")
    return actions


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """Defaults: the model's models.toml `sampling` recommendation, else SamplingParams' own."""
    parser.add_argument("--temp", type=float, help="temperature (0 = greedy; default 0)")
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--min-p", type=float)
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--presence-penalty", type=float)
    parser.add_argument("--frequency-penalty", type=float)
    parser.add_argument("--penalty-window", type=int, help="tokens the penalties look back on (default 64)")
    parser.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlx-spec", description="Lossless speculative decoding on MLX.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate text from a prompt")
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--prompt", required=True, help="the prompt text, or - to read it from stdin")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--raw", action="store_true", help="do not wrap the prompt in the chat template")
    gen.add_argument("--image", action="append", default=[], metavar="PATH",
                     help="an image the prompt shows, before its text (repeatable; a vision-language model)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, tokens and statistics")
    gen.add_argument("--prediction", metavar="FILE", help="the output expected, or most of it (a file to re-emit "
                                                         "with an edit): drafted from while the output follows it")
    shape = gen.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", help="the output must be JSON matching the schema in FILE "
                                                            "(verified exactly under speculation)")
    shape.add_argument("--regex", help="the output must match this regular expression")
    shape.add_argument("--lark", metavar="FILE", help="the output must match the Lark grammar in FILE")

    cha = commands.add_parser("chat", help="a terminal chat that shows speculation working")
    cha.set_defaults(model_flags=add_model_args(cha))
    add_sampling_args(cha)
    cha.add_argument("--max-tokens", type=int, default=512)
    cha.add_argument("--server", help="talk to a running `mlx-spec serve` at this address (e.g. "
                                      "http://127.0.0.1:8080) instead of loading a model here")
    cha.add_argument("--api-key", default=os.environ.get("MLX_SPEC_API_KEY"),
                     help="the server's key (default: $MLX_SPEC_API_KEY)")

    ben = commands.add_parser("bench", help="measure whether speculation pays here, per kind of work")
    add_model_args(ben)
    ben.add_argument("--drafters", help="comma-separated drafters to compare with plain decoding "
                                        "(default: every one available for the model but suffix)")
    ben.add_argument("--suite", choices=["spec", "quick", "work"], help="built-in prompt suite (default: spec; "
                     "for the demo model, held-out code prompts from its training report; work: nine kinds of "
                     "chat work, from writing and translation to code, three prompts each)")
    ben.add_argument("--prompts", help="JSONL file of {\"prompt\" or \"messages\", \"category\", \"temperature\"}")
    ben.add_argument("--max-tokens", type=int, default=128)
    ben.add_argument("--reps", type=int, default=1, help="repetitions of every prompt and contender")
    ben.add_argument("--json", help="write the full report here")
    ben.add_argument("--plot", help="write an SVG bar chart of the speedups here")

    bat = commands.add_parser("batch", help="generate for every request of a JSONL file, resumably")
    bat.add_argument("input", help="JSONL: one {\"id\", \"prompt\" or \"messages\", optional parameters} per line")
    bat.add_argument("-o", "--output", required=True, help="JSONL results; a rerun skips the ids already there")
    bat.add_argument("--max-tokens", type=int, default=256, help="default for requests that set none")
    bat.add_argument("--batch-size", type=int, help="requests decoded together, each drafting for itself "
                     "(default: the most that fit in half the free memory, up to 32; 1 where the model or drafter "
                     "cannot batch)")
    bat.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_args(bat)
    add_sampling_args(bat)  # defaults for requests that set none

    srv = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (chat and text completions)")
    add_model_args(srv)
    add_sampling_args(srv)  # defaults for requests that set none
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    srv.add_argument("--port", type=int, default=8080)
    srv.add_argument("--api-key", default=os.environ.get("MLX_SPEC_API_KEY"),
                     help="require 'Authorization: Bearer KEY' (default: $MLX_SPEC_API_KEY, else none)")
    srv.add_argument("--max-tokens", type=int, default=512, help="default for requests that set none")
    srv.add_argument("--max-queue", type=int, default=16, help="requests that may wait; more get 503")
    srv.add_argument("--timeout", type=float, default=600, help="seconds a request may run (default 600)")
    srv.add_argument("--batch-size", type=int, help=f"concurrent requests decoded together (default: {SERVE_BATCH}, "
                     "or fewer when memory is short; 1 where the model or drafter cannot batch)")
    srv.add_argument("--prompt-cache-gb", type=float, help="memory for earlier conversations' caches, so that their "
                     "next turns run only their new tokens (default: a quarter of the memory available; 0: none)")

    trn = commands.add_parser("train-mtp", help="train an MTP head for a model that has none (Llama, Qwen2/3, "
                                                "Mistral, SmolLM), on this machine (= train-drafter --kind mtp)")
    drf = commands.add_parser("train-drafter", help="train a drafter for a model nobody published one for, on this "
                                                    "machine: an MTP head, or a DFlash / DSpark block drafter")
    drf.add_argument("--kind", choices=["mtp", "dflash", "dspark"], default="dspark",
                     help="mtp: one draft per head forward (as train-mtp); dflash / dspark: a block of drafts per "
                     "forward from the target's hidden states (default dspark: its Markov head learns fastest)")
    for trainer in (trn, drf):
        trainer.add_argument("--model", required=True, help="the target: directory, models.toml name or hub id")
        trainer.add_argument("--data", nargs="+", help="text files or folders of them to train on")
        trainer.add_argument("--prompts", help="a JSONL file of prompts (as bench reads) the target answers first: "
                             "its answers are half of every batch, and held-out acceptance is measured on them too")
        trainer.add_argument("--answer-tokens", type=int, default=256, help="tokens per answer at most (default 256)")
        trainer.add_argument("--out", required=True, help="the drafter's directory (must not exist; then --mtp-path "
                             "OUT for an MTP head, --draft-model OUT for a block drafter)")
        trainer.add_argument("--steps", type=int, default=2000)
        trainer.add_argument("--batch-tokens", type=int, default=512, help="tokens per step (default 512)")
        trainer.add_argument("--lr", type=float, help="Adam's learning rate (default 3e-3 for mtp, 1e-3 for block "
                             "drafters)")
        trainer.add_argument("--max-hours", type=float, help="stop after this long and write what is trained so far")
        trainer.add_argument("--vocab-top", type=int, default=32768,
                             help="the drafter's vocabulary: the N tokens the data uses most (default 32768; 0: all)")
        trainer.add_argument("--seq-len", type=int, default=256)
        trainer.add_argument("--eval-every", type=int, default=200, help="steps between held-out acceptance reports")
        trainer.add_argument("--checkpoint-every", type=int, default=100,
                             help="steps between checkpoints (resume: rerun)")
        trainer.add_argument("--seed", type=int, default=0)
        trainer.add_argument("--quiet", action="store_true", help="no progress bar (the held-out reports still print)")
        trainer.add_argument("--layer-lr", type=float, default=0.1, help="mtp: the copied decoder layer's learning "
                             "rate, a fraction of --lr (default 0.1; 0 freezes it)")
        trainer.add_argument("--draft-steps", type=int, default=1, help="mtp: chained drafts trained, each fed the "
                             "head's own output as drafting does (default 1)")
        trainer.add_argument("--reuse", type=int, default=2, help="mtp: updates per batch the target runs, the extra "
                             "ones on recent batches kept in memory (default 2)")
    drf.add_argument("--block-size", type=int, default=8, help="dflash / dspark: positions a block (dflash drafts "
                     "one fewer, dspark drafts from the anchor; default 8)")
    drf.add_argument("--layers", type=int, default=1, help="dflash / dspark: decoder layers (default 1)")
    drf.add_argument("--target-layers", type=int, default=3,
                     help="dflash / dspark: target layers read, spread evenly (default 3)")
    drf.add_argument("--anchors", type=int, default=64, help="dflash / dspark: blocks trained a row a step "
                     "(default 64)")
    drf.add_argument("--markov-rank", type=int, default=256, help="dspark: rank of its Markov head (default 256)")

    conv = commands.add_parser("convert", help="convert a Hugging Face checkpoint (keeping its MTP layer) or a GGUF "
                                               "file to MLX")
    conv.add_argument("--hf-path", required=True,
                      help="Hugging Face repo id, local directory, or a .gguf file (llama, qwen2, qwen3, gemma3)")
    conv.add_argument("--mlx-path", required=True, help="output directory (must not exist, unless --add-mtp)")
    conv.add_argument("-q", "--quantize", action="store_true", help="quantize the weights")
    conv.add_argument("--q-bits", type=int, choices=[2, 3, 4, 5, 6, 8], help="bits of the quantized weights "
                      "(with -q; default 4)")
    conv.add_argument("--q-group-size", type=int, default=64, choices=[32, 64, 128])
    conv.add_argument("--mtp-bits", type=int, choices=[4, 8, 16],
                      help="bits of the MTP layer (default: 8 for a quantized model, else unquantized; 16 = float)")
    conv.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], help="dtype of unquantized weights")
    conv.add_argument("--add-mtp", action="store_true",
                      help="add the MTP layer of --hf-path to the existing MLX conversion at --mlx-path")
    return parser
