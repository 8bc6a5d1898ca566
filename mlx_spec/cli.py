"""`mlx-spec` command line: a thin client of the engine's public API. Every failure the user can cause ends
with one `mlx-spec: error: ...` line and exit status 2; Ctrl+C ends quietly with 130."""

from __future__ import annotations

import os
import signal
import sys


def exit_on_interrupt(signum=None, frame=None):
    """Ctrl+C while the command starts up or shuts down, outside main(): status 130, as main() gives, and no
    KeyboardInterrupt traceback from whatever import or clean-up it interrupted."""
    os._exit(130)


def unraisable_interrupt(unraisable):
    """A Ctrl+C that lands in a callback or finaliser (the import system has some), which Python would print as
    "Exception ignored ... Traceback" and then carry on: honour it instead."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        exit_on_interrupt()
    sys.__unraisablehook__(unraisable)


# Installed before anything else is imported when this module is the program (`python -m mlx_spec.cli`, or the
# `mlx-spec` script, which imports it), not when another program imports it; once the arguments are parsed (MLX
# imported), main() turns Ctrl+C back into KeyboardInterrupt, for the command's own clean-up.
if ((__name__ == "__main__" or os.path.basename(sys.argv[0]) == "mlx-spec")
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
    signal.signal(signal.SIGINT, exit_on_interrupt)
    sys.unraisablehook = unraisable_interrupt

import errno  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from .commands.arguments import SERVE_BATCH, build_parser  # noqa: E402
from .seams.errors import SpecError  # noqa: E402

FLAG_NAMES = {"temperature": "temp"}  # SamplingParams fields whose flag is named otherwise
WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


def sampling_params(args, defaults: dict | None = None):
    """The sampling the user asked for, the rest from `defaults` (else the model's recommendation) and
    SamplingParams' own."""
    from dataclasses import fields

    from .core.sampling import SamplingParams
    from .loading import model_entry

    if not 0 <= args.seed < 2**64:  # what mx.random.key takes
        raise SpecError(f"--seed must be a whole number from 0 to 2**64 - 1, got {args.seed}")
    if defaults is None:
        defaults = model_entry(args.model).get("sampling", {})  # keys: SamplingParams fields
    given = {f.name: getattr(args, FLAG_NAMES.get(f.name, f.name)) for f in fields(SamplingParams)}
    return SamplingParams(**{**defaults, **{k: v for k, v in given.items() if v is not None}})


def model_notice(model: str | None) -> str:
    """What the user should know about the model: the demo notice, or its models.toml note."""
    from .loading import DEMO_NOTICE, model_entry

    note = " ".join(model_entry(model).get("note", "").split())
    if model is None:
        return DEMO_NOTICE.format(note=note)
    return f"{model}: {note}" if note else ""


def told_before(what: str) -> bool:
    """Whether this machine's user has been told `what` (a marker in their cache folder); marks it told."""
    marker = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlx-spec" / f"told-{what}"
    if marker.exists():
        return True
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:  # a read-only home: tell it every time
        pass
    return False


def leads(args) -> bool:
    """False on the ranks of `--distributed` other than 0: they read no input and write nothing (their files
    may not exist on their machine), and only follow rank 0's generations."""
    if not args.distributed:
        return True
    from .seams.distributed import join

    return join(args.distributed).rank() == 0


def check_model_flags(args) -> None:
    """Refuse model flags that contradict each other, before anything loads."""
    if args.drafter == "off" and args.num_draft:
        raise SpecError(f"--drafter off drafts nothing: drop --num-draft {args.num_draft}")
    if args.draft_model and args.drafter not in (None, "draft-model"):
        raise SpecError(f"--draft-model is the draft-model drafter's, not --drafter {args.drafter}'s: drop one of them")
    if args.mtp_path and args.drafter not in (None, "mtp"):
        raise SpecError(f"--mtp-path is the mtp drafter's, not --drafter {args.drafter}'s: drop one of them")
    if args.suffix_cache:
        if args.drafter != "suffix":
            raise SpecError("--suffix-cache keeps the suffix drafter's index: add --drafter suffix, or drop it")
        from .seams.files import check_writable

        check_writable(args.suffix_cache, "--suffix-cache")


def load_engine(args):
    """The engine the model flags ask for. Under `--distributed`, only rank 0 returns: the other ranks run the
    generations it starts and exit when it is done."""
    import atexit

    from .loading import load
    from .seams import linux_blas

    engine = load(args.model, args.draft_model, args.drafter, args.num_draft, args.kv_bits, args.kv_group_size,
                  args.mtp_hidden, args.tree_width, args.distributed, args.mtp_path, args.suffix_cache)
    if lockstep := engine.lockstep:
        if not lockstep.leader:
            sys.exit(lockstep.follow(engine))
        atexit.register(lockstep.finish)
    notice = model_notice(args.model)
    if args.model is None and not args.verbose and told_before("demo-notice"):
        notice = "using the built-in demo model (--model for a real one; --verbose for its whole note)"
    if notice:
        print(notice, file=sys.stderr)
    status = engine.status()
    if status.notice:
        print(status.notice, file=sys.stderr)
    drafter = f"{status.drafter}, {status.shape}, {status.policy}" if status.drafter != "off" else "off"
    print(f"drafter: {drafter} | BLAS: {linux_blas.describe()}", file=sys.stderr)
    return engine


def generate(args) -> int:
    from .core.events import Done, Text, Token
    from .core.prompts import render_prompt

    params = sampling_params(args)
    try:
        prompt = sys.stdin.read() if args.prompt == "-" and leads(args) else args.prompt
    except UnicodeDecodeError:
        raise SpecError("the prompt on stdin is not UTF-8 text: convert it first (e.g. iconv -t UTF-8)") from None
    except (AttributeError, OSError):  # no stdin at all (`<&-`: sys.stdin is None), or one that cannot be read
        raise SpecError("--prompt - reads the prompt from stdin, which is closed here: pipe the prompt in or give "
                        "it as --prompt TEXT") from None
    prediction = read_text("--prediction", args.prediction) if args.prediction else None
    engine = load_engine(args)
    if args.image and args.raw:
        raise SpecError("--image needs the chat template to place the images: drop --raw")
    ids = render_prompt(engine.tokenizer, prompt, raw=args.raw) if not args.image else \
        [{"role": "user", "content": [*({"type": "image", "image": path} for path in args.image),
                                      {"type": "text", "text": prompt}]}]
    grammar = output_grammar(args, engine.tokenizer)
    for event in engine.stream(ids, params, args.max_tokens, args.stop, args.seed, grammar=grammar,
                               prediction=prediction):
        if isinstance(event, (Token, Text)) and not args.json:
            print(event.text, end="", flush=True)
        elif isinstance(event, Done):
            if args.json:
                print(json.dumps({"text": event.text, "tokens": event.tokens, "stop_reason": event.stop_reason,
                                  "stats": event.stats.to_dict()}))
            else:
                print()
                print(f"[{event.stop_reason}] {event.stats.summary()}", file=sys.stderr)
    return 0


def read_text(flag: str, path: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{flag} {path}: cannot read it ({getattr(e, 'strerror', None) or e}): give a readable "
                        "UTF-8 file") from None


def output_grammar(args, tokenizer):
    """The grammar --json-schema, --regex or --lark asks for (None: none)."""
    from .core.grammar import Grammar

    if args.regex is not None:
        return Grammar(tokenizer, "regex", args.regex)
    for flag, path in (("--json-schema", args.json_schema), ("--lark", args.lark)):
        if path is None:
            continue
        text = read_text(flag, path)
        if flag == "--lark":
            return Grammar(tokenizer, "lark", text)
        try:
            return Grammar(tokenizer, "json_schema", json.loads(text))
        except json.JSONDecodeError as e:
            raise SpecError(f"--json-schema {path} is not JSON ({e.msg}, line {e.lineno}): give a JSON schema "
                            "file") from None
    return None


def convert(args) -> int:
    from .commands.convert import add_mtp, convert
    from .commands.from_gguf import convert_gguf

    if args.q_bits is not None and not args.quantize:
        raise SpecError(f"--q-bits {args.q_bits} applies only with -q (--quantize): add -q or drop --q-bits")
    args.q_bits = args.q_bits or 4
    if args.hf_path.lower().endswith(".gguf"):
        if args.add_mtp or args.mtp_bits:
            raise SpecError("a GGUF file has no MTP layer: drop --add-mtp / --mtp-bits")
        out = convert_gguf(args.hf_path, args.mlx_path, args.quantize, args.q_bits, args.q_group_size, args.dtype)
        print(f"[INFO] Wrote {out}")
    elif args.add_mtp:
        add_mtp(args.hf_path, args.mlx_path, args.mtp_bits, args.q_group_size)
    else:
        out = convert(args.hf_path, args.mlx_path, args.quantize, args.q_bits, args.q_group_size, args.mtp_bits,
                      args.dtype)
        print(f"[INFO] Wrote {out}")
    return 0


def batch(args) -> int:
    from .commands.batch import check_paths, run

    if args.max_tokens < 1:
        raise SpecError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if leads(args):
        check_paths(args.input, args.output)
    defaults = sampling_params(args)
    engine = load_engine(args)
    generated = bad = 0
    for record in run(engine, args.input, args.output, args.max_tokens, not args.quiet, defaults, args.seed,
                      args.batch_size, notice=lambda why: print(f"batch: {why}", file=sys.stderr)):
        if "error" in record:
            bad += 1
            print(f"{args.input}:{record['line']}: skipped: {record['error']}", file=sys.stderr)
        else:
            generated += 1
    print(f"{generated} generated into {args.output}" + (f", {bad} bad line(s) skipped" if bad else ""),
          file=sys.stderr)
    return 1 if bad else 0


def train_drafter(args) -> int:
    if args.max_hours is not None and args.max_hours <= 0:
        raise SpecError(f"--max-hours must be > 0, got {args.max_hours}")
    kind = getattr(args, "kind", "mtp")
    shared = (args.model, args.data, args.out, args.steps, args.batch_tokens)
    options = dict(max_hours=args.max_hours, vocab_top=args.vocab_top, seq_len=args.seq_len,
                   eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed,
                   progress=not args.quiet, prompts=args.prompts, answer_tokens=args.answer_tokens)
    if kind == "mtp":
        from .train.mtp import train

        out = train(*shared, lr=3e-3 if args.lr is None else args.lr, draft_steps=args.draft_steps,
                    reuse=args.reuse, layer_lr=args.layer_lr, **options)
        print(f"wrote the MTP head to {out}: draft with it by --mtp-path {out}", file=sys.stderr)
        return 0
    from .train.block import train_drafter as train

    out = train(kind, *shared, lr=1e-3 if args.lr is None else args.lr, block_size=args.block_size,
                layers=args.layers, target_layers=args.target_layers, anchors=args.anchors,
                markov_rank=args.markov_rank, **options)
    print(f"wrote the {kind} drafter to {out}: draft with it by --draft-model {out}", file=sys.stderr)
    return 0


train_mtp = train_drafter  # train-mtp is train-drafter --kind mtp (its arguments have no --kind)


def bench(args) -> int:
    from .commands.bench import run_bench, svg_chart, table
    from .core.prompts import load_prompts
    from .loading import DEMO, load
    from .seams.files import check_writable

    if args.distributed:
        raise SpecError("bench measures one process: scripts/bench_distributed.py compares plain and speculative "
                        "decoding on 1 and 2 ranks")
    if args.reps < 1:
        raise SpecError(f"--reps must be >= 1, got {args.reps}")
    if args.max_tokens < 1:
        raise SpecError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    for path, flag in ((args.json, "--json"), (args.plot, "--plot")):
        if path:
            check_writable(path, flag)
    if args.json and args.plot and Path(args.json).resolve() == Path(args.plot).resolve():
        raise SpecError(f"--json and --plot both name {args.json}: give the chart a file of its own")
    demo_prompts = str(DEMO / "prompts.jsonl") if args.model is None and args.suite is None else None
    categories = load_prompts(args.suite, args.prompts or demo_prompts)
    if args.model is None:
        print(model_notice(None).replace("using", "benchmarking"), file=sys.stderr)
    plain = load(args.model, args.draft_model, "off", kv_bits=args.kv_bits, kv_group_size=args.kv_group_size,
                 mtp_hidden=args.mtp_hidden, tree_width=args.tree_width, mtp_path=args.mtp_path)
    # suffix decoding would draft each repetition from the ones before: asked for by name only, and said so
    available = [d for d in plain.status().drafters if d not in ("off", "suffix")]
    drafters = args.drafters.split(",") if args.drafters else available
    if "suffix" in drafters:
        print("bench: the suffix drafter drafts each run from every run before it, the same prompts included: its "
              "figures are those of repeated work", file=sys.stderr)
    total = sum(len(prompts) for _, prompts in categories.values()) * args.reps * (len(drafters) + 1)
    print(f"bench: {', '.join(['plain', *drafters])} on {len(categories)} categories, {total} runs of "
          f"{args.max_tokens} tokens, interleaved", file=sys.stderr)
    done = []

    def progress(run):
        done.append(run)
        print(f"\r  {len(done)}/{total} runs", end="", file=sys.stderr, flush=True)
    report = run_bench(plain, drafters, categories, args.max_tokens, args.reps, progress, args.num_draft)
    print(file=sys.stderr)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if args.plot:
        Path(args.plot).write_text(svg_chart(report))
    return 0


def chat(args) -> int:
    from .tui.app import ChatApp

    if args.server:
        return remote_chat(args)
    if args.distributed:
        raise SpecError("the chat needs a terminal, which mlx.launch does not give its ranks: serve the sharded "
                        f"model (mlx.launch ... mlx-spec serve --distributed {args.distributed}) and chat with it by "
                        "mlx-spec chat --server URL")
    check_terminal()
    params = sampling_params(args)
    engine = load_engine(args)
    notice = model_notice(args.model)
    ChatApp(engine, params, args.max_tokens, args.model or "built-in demo model", notice=notice).run()
    return 0


def check_terminal() -> None:
    """The chat draws on a terminal and reads its keys: refuse without one (it would hang, drawing into a file)."""
    if not (sys.stdin and sys.stdin.isatty() and sys.stdout.isatty()):
        raise SpecError("chat needs a terminal for its input and output: run it in one, or script with generate, "
                        "batch or serve")


def remote_chat(args) -> int:
    """The chat on a running `mlx-spec serve`: its model and drafters, this terminal's sampling flags."""
    from dataclasses import asdict

    from .serve.client import RemoteEngine
    from .tui.app import ChatApp

    given = [a.option_strings[0] for a in args.model_flags
             if a.dest != "verbose" and getattr(args, a.dest) != a.default]
    if given:
        raise SpecError(f"{given[0]} chooses what the server loads, not the chat: drop it (the server's own "
                        "flags decide; F8 switches among its drafters)")
    engine = RemoteEngine(args.server, args.api_key)
    params = sampling_params(args, asdict(engine.sampling))
    status = engine.status()
    print(f"connected to {engine.url}: {engine.model}, drafter {status.drafter}, {status.policy}", file=sys.stderr)
    check_terminal()
    ChatApp(engine, params, args.max_tokens, f"{engine.model} at {engine.url}", memory_report=RemoteEngine.memory,
            notice=f"served by {engine.url}: {engine.model}").run()
    return 0


def serve(args) -> int:
    import psutil

    from .serve.server import Server, check_port, serve

    for value, flag, least in ((args.port, "--port", 0), (args.max_tokens, "--max-tokens", 1),
                               (args.max_queue, "--max-queue", 1)):
        if value < least or (flag == "--port" and value > 65535):
            raise SpecError(f"{flag} must be {'from 0 to 65535' if flag == '--port' else f'>= {least}'}, got {value}")
    if args.timeout <= 0:
        raise SpecError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    if args.batch_size is not None and args.batch_size < 1:
        raise SpecError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.prompt_cache_gb is not None and not 0 <= args.prompt_cache_gb < 1e6:
        raise SpecError(f"--prompt-cache-gb must be a number of GB >= 0, got {args.prompt_cache_gb}")
    check_port(args.host, args.port)
    defaults = sampling_params(args)
    engine = load_engine(args)
    batch_size = args.batch_size or 1
    if problem := engine.batch_problem():
        if batch_size > 1:
            raise SpecError(f"--batch-size {batch_size}: {problem}; use --batch-size 1")
        print(f"serve: one request at a time: {problem}", file=sys.stderr)
    elif args.batch_size is None:
        batch_size = min(SERVE_BATCH, engine.largest_batch(args.max_tokens + 2048))
    budget = psutil.virtual_memory().available // 4 if args.prompt_cache_gb is None else int(args.prompt_cache_gb * 1e9)
    engine.cache_prompts(budget)
    print(f"serve: prompt cache: {f'up to {budget / 1e9:.1f} GB of earlier conversations' if budget else 'off'} "
          f"({'on every rank, ' if engine.lockstep else ''}--prompt-cache-gb)", file=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"mlx-spec: warning: serving on {args.host} without --api-key: anyone who can reach this port can "
              "use the model", file=sys.stderr)
    serve(Server(engine, args.model or "demo", defaults, args.max_tokens, args.max_queue, args.timeout, args.api_key,
                 args.num_draft, batch_size), args.host, args.port)
    return 0


def main(argv: list[str] | None = None) -> int:
    program = signal.getsignal(signal.SIGINT) is exit_on_interrupt
    try:
        args = build_parser().parse_args(argv)
        if program:
            import mlx.core  # noqa: F401  under the quiet handler: a Ctrl+C inside MLX's native start-up is not
            # a KeyboardInterrupt Python can unwind (nanobind prints "Critical nanobind error" and a traceback)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if hasattr(args, "drafter"):
            check_model_flags(args)
        command = globals()[args.command.replace("-", "_")]  # each command's function bears its name
        return command(args)
    except SpecError as e:
        print(f"mlx-spec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except ImportError as e:  # a C extension interrupted while it initialises reports an ImportError
        if not isinstance(e.__cause__ or e.__context__, KeyboardInterrupt):
            raise
        print(file=sys.stderr)
        return 130
    except RuntimeError as e:  # a collective of `--distributed` ranks failed: another rank went away
        from .seams.distributed import lost

        if (error := lost(e)) is None:
            raise
        print(f"mlx-spec: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (e.g. `| head`): no complaint at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the machine's, not the user's input: a full disk under stdout, a vanished folder
        if e.errno in WRITE_ERRORS:
            error = f"cannot write {e.filename or 'the output'} ({e.strerror}): free some space or write elsewhere"
        else:
            error = f"{e.filename}: {e.strerror}" if e.filename else str(e)
        print(f"mlx-spec: error: {error}", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is left unflushed cannot go anywhere
        return 2
    finally:
        if program:  # a Ctrl+C during the interpreter's shutdown would print "Exception ignored ..." tracebacks
            signal.signal(signal.SIGINT, exit_on_interrupt)


if __name__ == "__main__":
    sys.exit(main())
