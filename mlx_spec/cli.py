"""`mlx-spec` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import SpecError


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model directory, models.toml name or hub id (default: built-in demo)")
    parser.add_argument("--draft-model", help="a smaller model of the same vocabulary to draft with")
    parser.add_argument("--drafter", choices=["mtp", "draft-model", "ngram", "off"],
                        help="how to draft (default: the draft model when one is known, else the checkpoint's "
                             "MTP layer when it has one, else ngram)")
    parser.add_argument("--num-draft", type=int,
                        help="pin the tokens drafted per round (default: adaptive, from 0 = plain decoding up to "
                             "the models.toml recommendation, else mtp 3, draft-model 6, ngram 6)")
    parser.add_argument("--mtp-hidden", choices=["post", "pre"], default="post",
                        help="target hidden state fed to the MTP layer: after (default) or before the final norm")
    parser.add_argument("--kv-bits", type=int, choices=[4, 8], help="quantize the full-attention KV cache")
    parser.add_argument("--kv-group-size", type=int, default=64)


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--penalty-window", type=int, default=64, help="tokens the penalties look back on")
    parser.add_argument("--seed", type=int, default=0)


def sampling_params(args):
    from .sampling import SamplingParams

    return SamplingParams(args.temp, args.top_k, args.top_p, args.min_p, args.repetition_penalty,
                          args.presence_penalty, args.frequency_penalty, args.penalty_window)


def load_engine(args):
    from . import linux_blas
    from .loading import DEMO_NOTICE, load, registry

    if args.model is None:
        print(DEMO_NOTICE, file=sys.stderr)
    engine = load(args.model, args.draft_model, args.drafter, args.num_draft, args.kv_bits, args.kv_group_size,
                  args.mtp_hidden)
    if note := registry().get(args.model or "", {}).get("note"):
        print(f"{args.model}: {' '.join(note.split())}", file=sys.stderr)
    drafter = f"{engine.drafter.name}, {engine.policy.note}" if engine.drafter else "off"
    print(f"drafter: {drafter} | BLAS: {linux_blas.describe()}", file=sys.stderr)
    return engine


def generate(args) -> int:
    from .engine import Done, Token

    params = sampling_params(args)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    engine = load_engine(args)
    if not args.raw and getattr(engine.tokenizer, "has_chat_template", False) and prompt.strip():
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                      add_generation_prompt=True)
    for event in engine.stream(prompt, params, args.max_tokens, args.stop, args.seed):
        if isinstance(event, Token) and not args.json:
            print(event.text, end="", flush=True)
        elif isinstance(event, Done):
            if args.json:
                print(json.dumps({"text": event.text, "tokens": event.tokens, "stop_reason": event.stop_reason,
                                  "stats": event.stats.to_dict()}))
            else:
                print()
                print(f"[{event.stop_reason}] {event.stats.summary()}", file=sys.stderr)
    return 0


def convert(args) -> int:
    from .convert import add_mtp, convert

    if args.add_mtp:
        add_mtp(args.hf_path, args.mlx_path, args.mtp_bits, args.q_group_size)
    else:
        out = convert(args.hf_path, args.mlx_path, args.quantize, args.q_bits, args.q_group_size, args.mtp_bits,
                      args.dtype)
        print(f"[INFO] Wrote {out}")
    return 0


def batch(args) -> int:
    from .batch import run

    if not Path(args.input).exists():
        raise SpecError(f"{args.input} does not exist: give a JSONL file with one request per line")
    engine = load_engine(args)
    generated = bad = 0
    for record in run(engine, args.input, args.output, args.max_tokens, progress=not args.quiet):
        if "error" in record:
            bad += 1
            print(f"{args.input}:{record['line']}: skipped: {record['error']}", file=sys.stderr)
        else:
            generated += 1
    print(f"{generated} generated into {args.output}" + (f", {bad} bad line(s) skipped" if bad else ""),
          file=sys.stderr)
    return 1 if bad else 0


def bench(args) -> int:
    from .bench import load_prompts, run_bench, svg_chart, table
    from .loading import DEMO, DEMO_NOTICE, available_drafters, load_target

    demo_prompts = str(DEMO / "prompts.jsonl") if args.model is None and args.suite is None else None
    categories = load_prompts(args.suite, args.prompts or demo_prompts)
    if args.model is None:
        print(DEMO_NOTICE.replace("using", "benchmarking"), file=sys.stderr)
    target = load_target(args.model, args.draft_model)
    drafters = args.drafters.split(",") if args.drafters else available_drafters(target, args.draft_model)
    total = sum(len(prompts) for _, prompts in categories.values()) * args.reps * (len(drafters) + 1)
    print(f"bench: {', '.join(['plain', *drafters])} on {len(categories)} categories, {total} runs of "
          f"{args.max_tokens} tokens, interleaved", file=sys.stderr)
    done = []

    def progress(run):
        done.append(run)
        print(f"\r  {len(done)}/{total} runs", end="", file=sys.stderr, flush=True)
    report = run_bench(target, drafters, categories, args.max_tokens, args.reps, args.draft_model, progress,
                       args.num_draft)
    print(file=sys.stderr)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if args.plot:
        Path(args.plot).write_text(svg_chart(report))
    return 0


def chat(args) -> int:
    from tui.app import ChatApp

    from .loading import DEMO_NOTICE

    engine = load_engine(args)
    notice = "" if args.model else DEMO_NOTICE
    ChatApp(engine, sampling_params(args), args.max_tokens, args.model or "built-in demo model", notice=notice).run()
    return 0


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
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, tokens and statistics")
    gen.set_defaults(run=generate)

    cha = commands.add_parser("chat", help="a terminal chat that shows speculation working")
    add_model_args(cha)
    add_sampling_args(cha)
    cha.add_argument("--max-tokens", type=int, default=512)
    cha.set_defaults(run=chat)

    ben = commands.add_parser("bench", help="measure whether speculation pays here, per kind of work")
    add_model_args(ben)
    ben.add_argument("--drafters", help="comma-separated drafters to compare with plain decoding "
                                        "(default: every one available for the model)")
    ben.add_argument("--suite", choices=["spec", "quick"], help="built-in prompt suite (default: spec; "
                     "for the demo model, held-out code prompts from its training report)")
    ben.add_argument("--prompts", help="JSONL file of {\"prompt\" or \"messages\", \"category\", \"temperature\"}")
    ben.add_argument("--max-tokens", type=int, default=128)
    ben.add_argument("--reps", type=int, default=1, help="repetitions of every prompt and contender")
    ben.add_argument("--json", help="write the full report here")
    ben.add_argument("--plot", help="write an SVG bar chart of the speedups here")
    ben.set_defaults(run=bench)

    bat = commands.add_parser("batch", help="generate for every request of a JSONL file, resumably")
    bat.add_argument("input", help="JSONL: one {\"id\", \"prompt\" or \"messages\", optional parameters} per line")
    bat.add_argument("-o", "--output", required=True, help="JSONL results; a rerun skips the ids already there")
    bat.add_argument("--max-tokens", type=int, default=256, help="default for requests that set none")
    bat.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_args(bat)
    bat.set_defaults(run=batch)

    conv = commands.add_parser("convert", help="convert a Hugging Face checkpoint to MLX, keeping its MTP layer")
    conv.add_argument("--hf-path", required=True, help="Hugging Face repo id or local directory")
    conv.add_argument("--mlx-path", required=True, help="output directory (must not exist, unless --add-mtp)")
    conv.add_argument("-q", "--quantize", action="store_true", help="quantize the weights")
    conv.add_argument("--q-bits", type=int, default=4, choices=[2, 3, 4, 5, 6, 8])
    conv.add_argument("--q-group-size", type=int, default=64, choices=[32, 64, 128])
    conv.add_argument("--mtp-bits", type=int, choices=[4, 8, 16],
                      help="bits of the MTP layer (default: 8 for a quantized model, else unquantized; 16 = float)")
    conv.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], help="dtype of unquantized weights")
    conv.add_argument("--add-mtp", action="store_true",
                      help="add the MTP layer of --hf-path to the existing MLX conversion at --mlx-path")
    conv.set_defaults(run=convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .linux_blas import reexec_with_openblas

    args = build_parser().parse_args(argv)
    if argv is None:  # a real command line, which can be restarted with a faster BLAS
        reexec_with_openblas()
    try:
        return args.run(args)
    except SpecError as e:
        print(f"mlx-spec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
