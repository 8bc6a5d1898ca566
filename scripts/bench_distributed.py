"""Speculation on a target sharded across ranks: 1 vs 2 ranks on localhost, plain vs speculative, real weights.

    python scripts/bench_distributed.py [--model qwen2.5-coder-0.5b --drafter ngram [--draft-model NAME]
                                         --modes tensor,pipeline --prompts 4 --tokens 64]

Runs itself as one process, then as two ranks on the ring backend over localhost for each mode (started as
`mlx.launch -n 2 --backend ring` starts them); the two ranks share this machine's cores, so each gets
OPENBLAS_NUM_THREADS=1 and the single process 2. Within each run, plain
decoding and speculation (adaptive policy) alternate prompt by prompt in the same processes, greedy, on the demo's
held-out code prompts; rank 0 reports decode tokens/s of each, acceptance, whether speculation wrote exactly what
plain decoding did, and the communication a plain step pays: the median time of the collective one step makes
(tensor parallelism: an all_sum of the hidden state, two per layer; pipeline: the activations sent to the next
rank and gathered back), times their number, against the plain step. A mode ending in "+rank0" (e.g.
tensor+rank0) measures the alternative to every rank drafting for itself: rank 0 drafts alone and sends each
draft to the others.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx_spec  # first, before mlx: it points MLX at the system OpenBLAS on Linux

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mlx.core as mx  # noqa: E402
import real_models  # noqa: E402
from bench_batch import code_prompts  # noqa: E402
import numpy as np  # noqa: E402
from mlx_spec.seams import linux_blas  # noqa: E402
from mlx_spec.core.draft import Draft  # noqa: E402
from mlx_spec.decode.engine import Engine  # noqa: E402
from mlx_spec.commands.bench import Neighbours  # noqa: E402

def collective_seconds(group, hidden: int, mode: str, reps: int = 100) -> tuple[float, str]:
    """(seconds of the collectives of one plain step, what they are), timed on one token's hidden state."""
    x = mx.ones((1, 1, hidden))
    if mode == "tensor":
        def once():
            return mx.distributed.all_sum(x, group=group, stream=mx.cpu)
    else:
        def once():
            sent = (mx.distributed.send(x, (group.rank() - 1) % group.size(), group=group, stream=mx.cpu)
                    if group.rank() else mx.distributed.recv_like(x, 1, group=group, stream=mx.cpu))
            return mx.distributed.all_gather(sent, group=group, stream=mx.cpu)
    for _ in range(10):
        mx.eval(once())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        mx.eval(once())
        times.append(time.perf_counter() - start)
    return statistics.median(times), ("all_sum" if mode == "tensor" else "send/recv + all_gather")


class DraftsFromRank0:
    """The alternative to every rank drafting for itself, measured here only: rank 0 drafts and sends each draft
    (tokens, and q when sampling) to the other ranks, whose drafter just receives it."""

    def __init__(self, drafter, lockstep):
        self.drafter, self.lockstep, self.name = drafter, lockstep, drafter.name

    def begin(self, context, prompt_step):
        if self.lockstep.leader:
            self.drafter.begin(context, prompt_step)

    def propose(self, context, k, params, key):
        if self.lockstep.leader:
            draft = self.drafter.propose(context, k, params, key)
            mx.eval(draft.tokens, *([draft.q] if draft.q is not None else []))
            self.lockstep.share((np.array(draft.tokens), None if draft.q is None else np.array(draft.q)))
            return draft
        tokens, q = self.lockstep.share()
        return Draft(mx.array(tokens), None if q is None else mx.array(q))

    def accept(self, context, n, step):
        if self.lockstep.leader:
            self.drafter.accept(context, n, step)


def worker(args) -> int:
    """One run (every rank of it): plain and speculative generations alternating; rank 0 prints RESULT json."""
    path = str(real_models.mlx_dir(args.model))
    draft = str(real_models.mlx_dir(args.draft_model)) if args.draft_model else None
    mode = None if args.worker == "one" else args.worker
    plain = mlx_spec.load(path, draft, "off", distributed=mode)
    if args.drafts_from_rank0:
        make = Engine.with_drafter

        def with_drafter(self, name):
            engine = make(self, name)
            engine.drafter = DraftsFromRank0(engine.drafter, self.lockstep)
            return engine
        Engine.with_drafter = with_drafter
    spec = plain.with_drafter(args.drafter)
    config = json.loads((Path(path) / "config.json").read_text())
    comm = None
    if mode:
        step, what = collective_seconds(plain.lockstep.group, config["hidden_size"], mode)
        count = 2 * config["num_hidden_layers"] if mode == "tensor" else 1
        comm = {"seconds": step, "what": what, "per_step": count}
        if not plain.lockstep.leader:
            return plain.lockstep.follow(plain)
    tokens, seconds, same, drafted, accepted = {"plain": 0, "spec": 0}, {"plain": 0.0, "spec": 0.0}, 0, 0, 0
    prompts = code_prompts(plain, args.prompts)
    for prompt in prompts:
        results = {}
        for name, engine in (("plain", plain), ("spec", spec)):
            result = engine.generate(prompt, max_tokens=args.tokens)
            tokens[name] += len(result.tokens)
            seconds[name] += result.stats.decode_seconds
            results[name] = result
        same += results["plain"].tokens == results["spec"].tokens
        drafted += results["spec"].stats.drafted
        accepted += results["spec"].stats.accepted
    if plain.lockstep:
        plain.lockstep.finish()
    print("RESULT " + json.dumps({
        "plain": tokens["plain"] / seconds["plain"], "spec": tokens["spec"] / seconds["spec"],
        "acceptance": accepted / drafted if drafted else None, "same": same, "prompts": len(prompts),
        "comm": comm, "blas": linux_blas.describe()}), flush=True)
    return 0


def run(args, mode: str) -> dict:
    """One run as its own process(es): the ranks started by hand as mlx.launch starts them (a hostfile naming a
    localhost port per rank, MLX_RANK), since mlx.launch's own I/O threads poll without sleeping and would take
    most of this machine's two cores."""
    own = [sys.executable, __file__, "--worker", mode, "--model", args.model, "--drafter", args.drafter,
           "--prompts", str(args.prompts), "--tokens", str(args.tokens)]
    own += ["--draft-model", args.draft_model] if args.draft_model else []
    own += ["--drafts-from-rank0"] if mode.endswith("+rank0") else []
    mode = mode.removesuffix("+rank0")
    own[3] = mode
    ranks = 1 if mode == "one" else 2
    with tempfile.TemporaryDirectory() as tmp:
        hostfile = Path(tmp) / "hosts.json"
        port = free_port()
        hostfile.write_text(json.dumps([[f"127.0.0.1:{port + r}"] for r in range(ranks)]))
        procs = []
        for rank in range(ranks):
            env = {**os.environ, "OPENBLAS_NUM_THREADS": str(2 // ranks)}
            if ranks > 1:
                env.update(MLX_HOSTFILE=str(hostfile), MLX_RANK=str(rank))
            procs.append(subprocess.Popen(own, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [proc.communicate() for proc in procs]
    lines = [line for line in outputs[0][0].splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{mode}: no result\n" + "\n".join(out + err for out, err in outputs))
    return json.loads(lines[0][len("RESULT "):])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--draft-model", help="a real model (name) to draft with (--drafter draft-model)")
    parser.add_argument("--modes", default="tensor,pipeline")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--drafts-from-rank0", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    for name in filter(None, [args.model, args.draft_model]):
        if not real_models.mlx_dir(name).exists():
            print(f"fetch the model first: python scripts/real_models.py {name}")
            return 2
    print(f"{args.model}, drafter {args.drafter}: {args.prompts} code prompts x {args.tokens} tokens, greedy",
          flush=True)
    print("| ranks | split | plain tok/s | speculative tok/s | speculative / plain | acceptance | same as plain |"
          " communication per plain step |")
    print("|---|---|---|---|---|---|---|---|")
    notes = []
    for mode in ["one", *args.modes.split(",")]:
        with Neighbours() as neighbours:  # the ranks are this process's children: their CPU time is its own
            r = run(args, mode)
        comm = "-"
        if r["comm"]:
            c = r["comm"]
            total = c["seconds"] * c["per_step"]
            comm = (f"{c['per_step']} x {c['what']} of {c['seconds'] * 1e3:.2f} ms = {total * 1e3:.1f} ms "
                    f"({total * r['plain']:.0%} of the step)")
        rate = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
        print(f"| {1 if mode == 'one' else 2} | {'-' if mode == 'one' else mode} | {r['plain']:.1f} | "
              f"{r['spec']:.1f} | {r['spec'] / r['plain']:.2f}x | {rate} | {r['same']}/{r['prompts']} | {comm} |",
              flush=True)
        notes.append(f"{mode}: {neighbours.verdict()[1]}; BLAS {r['blas']}")
    print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
