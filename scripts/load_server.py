"""Load on `mlx-spec serve`: requests per second and p50 / p99 latency, with speculation and without.

    python scripts/load_server.py [--model M --draft-model D] [--requests 24 --concurrency 4 --max-tokens 32]

Starts the server on a free localhost port (the model as `mlx-spec serve` takes it; default the built-in demo),
then for each contender (drafting off, and the server's default drafter) sends `--requests` chat requests
from `--concurrency` client threads with the official `openai` client, the contenders' batches interleaved
`--rounds` times, each round in the other order (neither always runs second). Every request's prompt starts with
its own serial number, so the server's prompt cache serves no request from an earlier one beyond the chat
template's common start, alike for every contender. Bounded in count and in time (`--time-limit` seconds),
localhost only. `--batch-size` goes to the server: concurrent requests decode together up to it (1: one at a
time, where concurrency adds queueing, not throughput). Prints each batch's latencies and wall time as raw
timings (scripts/record.py keeps them apart).
"""

from __future__ import annotations

import argparse
import itertools
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timings import raw_line  # noqa: E402

QUESTIONS = ["Write a function that reverses a list.", "Explain what a hash table is.", "Sort a dict by value.",
             "Write a class for a stack.", "Parse a date in ISO 8601.", "Read a CSV file and sum a column."]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--draft-model")
    parser.add_argument("--requests", type=int, default=24, help="per contender and round")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=600, help="seconds; stops sending after this")
    parser.add_argument("--batch-size", type=int, help="the server's --batch-size (default: its own)")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "mlx_spec.cli", "serve", "--port", str(port), "--max-queue", "1000"]
    command += ["--model", args.model] * bool(args.model) + ["--draft-model", args.draft_model] * bool(args.draft_model)
    command += ["--batch-size", str(args.batch_size)] * (args.batch_size is not None)
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                health = httpx.get(f"{url}/health", timeout=1).json()
                break
            except httpx.TransportError:
                if server.poll() is not None:
                    print(server.stderr.read(), file=sys.stderr)
                    return 2
                time.sleep(0.2)
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=args.time_limit)
        model = health["model"]

        serials = itertools.count(100000)  # one per request, all of one length: no prompt extends another

        def ask(i: int, drafter: str | None) -> float:
            content = f"({next(serials)}) {QUESTIONS[i % len(QUESTIONS)]}"
            start = time.perf_counter()
            api.chat.completions.create(model=model, max_tokens=args.max_tokens, messages=[
                {"role": "user", "content": content}], extra_body={"drafter": drafter})
            return time.perf_counter() - start

        contenders = {"drafting off": "off", "default drafter": None}
        latencies, walls, deadline = {n: [] for n in contenders}, {n: 0.0 for n in contenders}, time.time()
        deadline += args.time_limit
        for drafter in contenders.values():  # warm-up: first touches of the weights, each drafter's first use
            ask(0, drafter)
        for r in range(args.rounds):
            for name, drafter in list(contenders.items())[::-1 if r % 2 else 1]:
                if time.time() > deadline:
                    break
                start = time.perf_counter()
                with ThreadPoolExecutor(args.concurrency) as pool:
                    batch = list(pool.map(lambda i, d=drafter: ask(i, d), range(args.requests)))
                wall = time.perf_counter() - start
                latencies[name] += batch
                walls[name] += wall
                print(raw_line(f"{name}, round {r + 1}, batch wall {wall:.4g} s; latencies", "s", batch), flush=True)
        print(f"{model}: {args.requests} chat requests x {args.rounds} rounds per contender, {args.concurrency} "
              f"clients, {args.max_tokens} tokens each")
        print("| contender | requests/s | p50 latency (s) | p99 latency (s) |")
        print("|---|---|---|---|")
        for name, values in latencies.items():
            if values:
                p99 = statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]
                print(f"| {name} | {len(values) / walls[name]:.2f} | {statistics.median(values):.2f} | {p99:.2f} |")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
