"""`--distributed`: the target sharded across two real processes on MLX's ring backend over localhost, started by
the real `mlx.launch` (or by hand where a test needs each rank's own process: killing one, giving one other
weights), each running the real CLI."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from helpers import (KEY, PROMPT, assert_one_line_error, default_ctrl_c, free_port, mlx_lm_text, plain_greedy,
                     run_cli)
from test_grammar import PERSON, from_schema, reference
from tiny import build_checkpoint

import mlx_spec
from mlx_spec.core.prompts import render_prompt
from mlx_spec.core.sampling import SamplingParams

LAUNCHER = Path(sys.executable).parent / "mlx.launch"  # installed with mlx, next to this interpreter


def free_port_pair() -> int:
    """A port p such that p and p + 1 are free (the ring backend listens on one port per rank)."""
    while True:
        port = free_port()
        if port < 65535 and not _taken(port + 1):
            return port


def _taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def mlx_launch(*args, timeout: int = 240) -> subprocess.CompletedProcess:
    """`mlx.launch -n 2 --backend ring ... mlx-spec ARGS` on localhost (its exit status is 0 even when a rank
    fails: the tests read what rank 0 printed). Its stdin is a pipe left open: mlx.launch polls its stdin, and
    spins a core once that is at end of file."""
    command = [str(LAUNCHER), "-n", "2", "--backend", "ring", "--starting-port", str(free_port_pair()),
               "--python", sys.executable, "--", "-m", "mlx_spec.cli", *args]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err, text=True)
        try:
            proc.wait(timeout=timeout)
        finally:
            proc.kill()
            proc.stdin.close()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, out.read(), err.read())


STARTED: list[subprocess.Popen] = []  # every rank a test started, killed after it if still running


@pytest.fixture(autouse=True)
def no_rank_left_behind():
    yield
    while STARTED:
        STARTED.pop().kill()


def start_ranks(tmp_path, *argv_of_rank, program=("-m", "mlx_spec.cli")) -> list[subprocess.Popen]:
    """Each rank's `mlx-spec ARGS` (or `python PROGRAM ARGS`) as its own process, wired as mlx.launch wires them
    (a hostfile and a rank)."""
    port = free_port_pair()
    hostfile = tmp_path / f"hosts-{port}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port + r}"] for r in range(len(argv_of_rank))]))
    ranks = [subprocess.Popen([sys.executable, *program, *argv],
                              env={**os.environ, "MLX_HOSTFILE": str(hostfile), "MLX_RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_ctrl_c)
             for rank, argv in enumerate(argv_of_rank)]
    STARTED.extend(ranks)
    return ranks


def wait_until_serving(port: int, ranks: list[subprocess.Popen]) -> None:
    """Until rank 0's server answers /health (every rank still running meanwhile)."""
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
        assert all(rank.poll() is None for rank in ranks), ranks[0].stderr.read() + ranks[1].stderr.read()
    raise AssertionError("the server never answered /health")


def generated(proc: subprocess.CompletedProcess) -> dict:
    """Rank 0's `generate --json` result (the only line any rank prints on stdout)."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return json.loads(lines[0])


def drafter_args(tiny, drafter: str) -> list[str]:
    """The tiny Qwen3.5 (its MTP layer fitted to draft its continuations of PROMPT, for `mtp`) and `drafter`."""
    extra = ["--draft-model", str(tiny["qwen3_5-draft"])] if drafter == "draft-model" else []
    model = tiny["qwen3_5-fitted-mtp"] if drafter == "mtp" else tiny["qwen3_5"]
    return ["--model", str(model), "--drafter", drafter, *extra]


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
@pytest.mark.parametrize("drafter", ["draft-model", "mtp", "ngram"])
def test_greedy_on_two_ranks_is_plain_decoding_on_one(tiny, mode, drafter):
    """The tiny Qwen3.5 (Gated DeltaNet and attention layers, an MTP layer) split in two: exactly mlx-lm's plain
    greedy decoding in one process. The draft model's lengths are the adaptive policy's, from rank 0's round times
    (so whether its drafts are accepted depends on the clock); the MTP layer and n-gram drafts are pinned, on
    prompts where they are sometimes right: PROMPT for the fitted layer, and for n-gram PROMPT, the target's own
    continuation of it and PROMPT again (drafted from that copy)."""
    tokenizer = mlx_spec.load(str(tiny["qwen3_5"]), drafter="off").tokenizer
    prompt = {"draft-model": PROMPT * 2, "mtp": PROMPT}.get(drafter) or PROMPT + mlx_lm_text(
        tokenizer, plain_greedy(tiny["qwen3_5"], render_prompt(tokenizer, PROMPT, raw=True), 40)) + PROMPT
    pinned = [] if drafter == "draft-model" else ["--num-draft", "3"]
    proc = mlx_launch("generate", *drafter_args(tiny, drafter), *pinned, "--distributed", mode, "--raw", "--json",
                      "--max-tokens", "40", "--prompt", prompt)
    result = generated(proc)
    assert result["tokens"] == plain_greedy(tiny["qwen3_5"], render_prompt(tokenizer, prompt, raw=True), 40)
    assert result["stats"]["drafted"] > 0, proc.stderr  # it speculated
    if pinned:
        assert 0 < result["stats"]["accepted"] < result["stats"]["drafted"]


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_sampled_on_two_ranks_is_one_process_with_the_same_seed(tiny, mode):
    proc = mlx_launch("generate", *drafter_args(tiny, "draft-model"), "--num-draft", "3", "--distributed", mode,
                      "--raw", "--json", "--temp", "1.0", "--seed", "11", "--max-tokens", "40", "--prompt", PROMPT)
    engine = mlx_spec.load(str(tiny["qwen3_5"]), str(tiny["qwen3_5-draft"]), "draft-model", draft_len=3)
    alone = engine.generate(PROMPT, SamplingParams(temperature=1.0), max_tokens=40, seed=11)
    result = generated(proc)
    assert result["tokens"] == alone.tokens
    assert result["stats"]["accepted"] == alone.stats.accepted > 0  # the same drafts stood on both


@pytest.mark.parametrize("model, extra, mode", [
    ("qwen3", ["--draft-model", "qwen3-draft", "--tree-width", "2"], "tensor"),
    ("qwen3", ["--draft-model", "qwen3-draft", "--kv-bits", "8", "--kv-group-size", "32"], "tensor"),
    ("qwen3", ["--drafter", "lookahead"], "tensor"),
    ("qwen3", ["--draft-model", "qwen3-medusa"], "tensor"),
    ("qwen3", ["--draft-model", "qwen3-eagle3"], "tensor"),
    ("qwen3", ["--draft-model", "qwen3-dflash", "--tree-width", "2"], "tensor"),
    ("deepseek_v3", ["--drafter", "mtp"], "pipeline"),
    ("glm4_moe", ["--drafter", "mtp"], "tensor"),
])
def test_other_drafters_and_caches_on_two_ranks_are_one_process(tiny, tmp_path, model, extra, mode):
    """Token trees (a tree mask and per-token positions through the sharded attention), 8-bit KV caches, lookahead,
    Medusa and EAGLE-3 heads (reading the sharded target's hidden states), DeepSeek-V3 (MLA, MoE) and GLM-4.5
    nextn layers: rank 0 writes what one process does, and only rank 0 writes."""
    extra = [str(tiny[a]) if a in tiny else a for a in extra]
    args = ["generate", "--model", str(tiny[model]), *extra, "--raw", "--json", "--max-tokens", "30", "--prompt",
            PROMPT]
    ranks = start_ranks(tmp_path, [*args, "--distributed", mode], [*args, "--distributed", mode])
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    result = json.loads(outputs[0][0])
    ids = render_prompt(mlx_spec.load(str(tiny[model]), drafter="off").tokenizer, PROMPT, raw=True)
    kv_bits = int(extra[extra.index("--kv-bits") + 1]) if "--kv-bits" in extra else None
    assert result["tokens"] == plain_greedy(tiny[model], ids, 30, kv_bits=kv_bits) and result["stats"]["drafted"] > 0
    assert outputs[1][0] == ""


def test_constrained_output_on_two_ranks_is_plain_constrained_decoding(tiny, tmp_path):
    """`generate --json-schema` across two ranks: each builds the grammar over its own tokenizer from what rank 0
    hands on; the output is mlx-lm's plain greedy decoding masked by llguidance's matcher of the schema."""
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    proc = mlx_launch("generate", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-draft"]),
                      "--num-draft", "3", "--distributed", "tensor", "--raw", "--json", "--max-tokens", "40",
                      "--json-schema", str(schema), "--prompt", PROMPT)
    result = generated(proc)
    ids = render_prompt(mlx_spec.load(str(tiny["qwen3"]), drafter="off").tokenizer, PROMPT, raw=True)
    assert result["tokens"] == reference(tiny["qwen3"], ids, from_schema(PERSON), 40)[:len(result["tokens"])]
    assert result["text"].startswith('{"name":"') and result["stats"]["drafted"] > 0
    assert 0 < result["stats"]["accepted"] < result["stats"]["drafted"]


def test_tensor_parallel_qwen3_with_a_draft_model_serves_clients_in_a_batch(tiny, tmp_path):
    """Rank 0 serves (real clients over HTTP, at once: their requests share a batch, one of them constrained to a
    JSON schema), rank 1 follows each batch; Ctrl+C ends both."""
    port = free_port()
    args = ["serve", "--model", str(tiny["qwen3"]), "--draft-model", str(tiny["qwen3-draft"]), "--distributed",
            "tensor", "--port", str(port), "--api-key", KEY]
    ranks = start_ranks(tmp_path, args, args)
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEY}"}
    prompts = ["def main():", PROMPT, PROMPT * 2]

    shape = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}

    def complete(prompt: str, constrained: bool = False) -> dict:
        return httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 24,
                                                         **({"response_format": shape} if constrained else {})},
                          headers=headers, timeout=120).json()

    try:
        wait_until_serving(port, ranks)
        with ThreadPoolExecutor(len(prompts) + 1) as pool:
            constrained = pool.submit(complete, PROMPT, True)
            replies = list(pool.map(complete, prompts))
            constrained = constrained.result()
    finally:
        ranks[0].send_signal(signal.SIGINT)
        codes = [rank.wait(timeout=60) for rank in ranks]
    errors = ranks[0].stderr.read() + ranks[1].stderr.read()
    assert codes == [130, 0], errors  # Ctrl+C ends the leader as every command; it tells the follower to stop
    assert "one request at a time" not in errors
    engine = mlx_spec.load(str(tiny["qwen3"]), drafter="off")
    assert [reply["choices"][0]["text"] for reply in replies] == [engine.generate(p, max_tokens=24).text
                                                                  for p in prompts]
    assert max(reply["usage"]["batch_size"] for reply in replies) > 1
    expected = reference(tiny["qwen3"], engine.encode(PROMPT), from_schema(PERSON), 24)
    assert constrained["choices"][0]["text"] == engine.tokenizer.decode(expected), constrained


PIN_AND_STOP_MIDWAY = """
import json, sys
import mlx_spec
from mlx_spec.core.events import Done, Round
engine = mlx_spec.load(sys.argv[1], sys.argv[2], "draft-model", draft_len=3, distributed="tensor")
if not engine.lockstep.leader:
    sys.exit(engine.lockstep.follow(engine))
lengths = []
for event in engine.stream(sys.argv[3], max_tokens=200):
    if isinstance(event, Round):
        lengths.append(event.draft_len)
        if len(lengths) == 3:
            engine.pin(1)  # what the server's jobs route does from a request's thread
        if len(lengths) == 8:
            engine.stop()
    if isinstance(event, Done):
        print(json.dumps({"tokens": event.tokens, "lengths": lengths, "stop_reason": event.stop_reason}))
engine.lockstep.finish()
"""


def test_a_pin_and_a_stop_midway_reach_every_rank(tiny, tmp_path):
    """Rank 0's engine pinned and stopped between rounds (as the server does from other threads): the other rank
    drafts the same lengths and stops at the same round (else their collectives would no longer match), and
    the tokens are still plain decoding's."""
    args = [str(tiny["qwen3"]), str(tiny["qwen3-draft"]), PROMPT]
    ranks = start_ranks(tmp_path, args, args, program=("-c", PIN_AND_STOP_MIDWAY))
    codes = [rank.wait(timeout=120) for rank in ranks]
    outputs = [rank.stdout.read() for rank in ranks]
    assert codes == [0, 0], [rank.stderr.read() for rank in ranks]
    result = json.loads(outputs[0])
    # each reaches the other rank with the next round's agreement and acts from the round after it
    assert result["stop_reason"] == "stopped" and result["lengths"] == [3, 3, 3, 3, 1, 1, 1, 1, 1]
    tokenizer = mlx_spec.load(str(tiny["qwen3"]), drafter="off").tokenizer
    reference = plain_greedy(tiny["qwen3"], render_prompt(tokenizer, PROMPT, raw=True), len(result["tokens"]))
    assert result["tokens"] == reference


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_batches_on_two_ranks_are_plain_decoding_on_one(tiny, tmp_path, mode):
    """`batch` across two ranks: rows of different lengths join and leave one batch, drafting the adaptive
    policy's lengths from rank 0's round times; every row is mlx-lm's plain greedy decoding in one process."""
    tokenizer = mlx_spec.load(str(tiny["qwen3_5"]), drafter="off").tokenizer
    texts = [PROMPT, "def add(a, b):", PROMPT * 2, "class Stack:", "import os\n"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": text, "raw": True, "max_tokens": 12 + 6 * i}) + "\n"
                               for i, text in enumerate(texts)))
    out = tmp_path / "out.jsonl"
    proc = mlx_launch("batch", str(prompts), "-o", str(out), *drafter_args(tiny, "draft-model"), "--distributed",
                      mode, "--batch-size", "3", "--quiet")
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())} if out.exists() else {}
    assert sorted(results) == list(range(len(texts))), proc.stderr
    for i, text in enumerate(texts):
        ids = render_prompt(tokenizer, text, raw=True)
        assert results[i]["text"] == mlx_lm_text(tokenizer, plain_greedy(tiny["qwen3_5"], ids, 12 + 6 * i)), i
    assert max(r["stats"]["batch_size"] for r in results.values()) == 3
    assert sum(r["stats"]["drafted"] for r in results.values()) > 0, proc.stderr


PINS_AND_STOPS_IN_A_BATCH = """
import json, sys
import mlx_spec
from mlx_spec import Job, SamplingParams
from mlx_spec.core.events import Done, Round
distributed = sys.argv[4] if sys.argv[4] != "none" else None
engine = mlx_spec.load(sys.argv[1], sys.argv[2], "draft-model", distributed=distributed)
if distributed and not engine.lockstep.leader:
    sys.exit(engine.lockstep.follow(engine))
prompt = engine.encode(sys.argv[3])
jobs = {"greedy": Job(prompt, max_tokens=40), "sampled": Job(prompt[:20], SamplingParams(temperature=1.0), 30,
        seed=7, draft_len=2), "pinned": Job(prompt[5:], max_tokens=40, draft_len=3), "stopped": Job(prompt, max_tokens=60),
        "late": Job(prompt[:9], max_tokens=20)}
waiting, lengths, results = list(jobs.items()), {key: [] for key in jobs}, {}
for key, event in engine.stream_many(lambda: waiting.pop(0) if waiting else None, 3,
                                     lambda key: key == "stopped" and len(lengths[key]) >= 6):
    if isinstance(event, Round):
        lengths[key].append(event.draft_len)
        if key == "pinned" and len(lengths[key]) == 3:
            jobs[key].draft_len = 1  # what the server's control route does from a request's thread
    if isinstance(event, Done):
        results[key] = {"tokens": event.tokens, "lengths": lengths[key], "stop_reason": event.stop_reason,
                        "batch_size": event.stats.batch_size}
print(json.dumps(results))
if distributed:
    engine.lockstep.finish()
"""


def test_a_batchs_pins_stops_and_joins_reach_every_rank(tiny, tmp_path):
    """Five jobs through a batch of three on two ranks (the Python API, as the server drives it): a row re-pinned
    midway and a row stopped midway act on both ranks at the same round (else their collectives would no longer
    match), a row joins as one leaves; greedy rows are plain decoding, the sampled row draws what one process
    draws with its seed and pin."""
    args = [str(tiny["qwen3"]), str(tiny["qwen3-draft"]), PROMPT * 2]
    ranks = start_ranks(tmp_path, [*args, "tensor"], [*args, "tensor"], program=("-c", PINS_AND_STOPS_IN_A_BATCH))
    codes = [rank.wait(timeout=180) for rank in ranks]
    outputs = [rank.stdout.read() for rank in ranks]
    assert codes == [0, 0], [rank.stderr.read() for rank in ranks]
    results = json.loads(outputs[0])
    alone = subprocess.run([sys.executable, "-c", PINS_AND_STOPS_IN_A_BATCH, *args, "none"], capture_output=True,
                           text=True, timeout=180)
    assert results["sampled"] == json.loads(alone.stdout)["sampled"], alone.stderr
    ids = mlx_spec.load(str(tiny["qwen3"]), drafter="off").encode(PROMPT * 2)
    reference = {key: plain_greedy(tiny["qwen3"], prompt, 60)
                 for key, prompt in {"greedy": ids, "pinned": ids[5:], "stopped": ids, "late": ids[:9]}.items()}
    for key, expected in reference.items():
        assert results[key]["tokens"] == expected[:len(results[key]["tokens"])], key
    assert len(results["greedy"]["tokens"]) == 40 and results["stopped"]["stop_reason"] == "stopped"
    assert len(results["stopped"]["lengths"]) == 6  # asked after its 6th round
    pinned = results["pinned"]["lengths"]  # pinned after its 3rd round: from its 4th on (0 once one token is left)
    assert pinned[:3] == [3] * 3 and pinned[3] == 1 and set(pinned[3:]) <= {0, 1}, pinned
    assert max(result["batch_size"] for result in results.values()) == 3
    assert outputs[1] == ""


@pytest.mark.parametrize("victim", [1, 0])
def test_a_rank_killed_mid_run_ends_the_other_with_an_error(tiny, tmp_path, victim):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"def f{i}(x):"}) + "\n" for i in range(400)))
    out = tmp_path / "out.jsonl"
    args = ["batch", str(prompts), "-o", str(out), "--model", str(tiny["qwen3"]), "--draft-model",
            str(tiny["qwen3-draft"]), "--distributed", "tensor", "--max-tokens", "100", "--quiet"]
    ranks = start_ranks(tmp_path, args, args)
    deadline = time.monotonic() + 300
    while not out.exists() or out.read_text().count("\n") < 2:  # generating: every rank inside collectives
        assert all(rank.poll() is None for rank in ranks), ranks[0].stderr.read() + ranks[1].stderr.read()
        assert time.monotonic() < deadline, "the batch wrote no results"
        time.sleep(0.1)
    ranks[victim].kill()
    killed = time.monotonic()
    survivor = ranks[1 - victim]
    code = survivor.wait(timeout=30)
    assert time.monotonic() - killed < 10
    stderr = survivor.stderr.read()
    assert code == 2 and "the distributed group broke" in stderr and "Traceback" not in stderr, stderr
    assert f"rank {1 - victim}:" in stderr


def test_a_rank_killed_while_the_leader_serves_nothing_ends_the_leader(tiny, tmp_path):
    """No collective is under way to fail (the server waits for requests): the leader learns of the death from
    its watch on its neighbours, and says so rather than wait for a request to break."""
    port = free_port()
    args = ["serve", "--model", str(tiny["qwen3"]), "--distributed", "tensor", "--port", str(port)]
    ranks = start_ranks(tmp_path, args, args)
    wait_until_serving(port, ranks)
    ranks[1].kill()
    killed = time.monotonic()
    code = ranks[0].wait(timeout=30)
    assert time.monotonic() - killed < 10
    stderr = ranks[0].stderr.read()
    assert code == 2 and "rank 0: the distributed group broke (rank 1 ended)" in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_ranks_that_compute_different_tokens_stop_with_an_error(tiny, tmp_path):
    """Rank 1 with other weights (the perturbed copy of the same architecture): its head scores the shared
    activations differently, its tokens differ, and the round's checksum stops both ranks."""
    common = ["generate", "--drafter", "ngram", "--distributed", "tensor", "--max-tokens", "40", "--prompt", PROMPT]
    ranks = start_ranks(tmp_path, [*common, "--model", str(tiny["qwen3"])],
                        [*common, "--model", str(tiny["qwen3-noisy"])])
    codes = [rank.wait(timeout=120) for rank in ranks]
    errors = [rank.stderr.read() for rank in ranks]
    assert codes == [2, 2], errors
    for stderr in errors:
        assert "rank 1 accepted other tokens than rank 0" in stderr and "Traceback" not in stderr, stderr


def test_distributed_needs_a_launcher_a_shardable_model_and_no_terminal(tiny):
    assert_one_line_error(run_cli("generate", "--model", str(tiny["qwen3"]), "--distributed", "tensor", "--prompt",
                                  "x"), "--distributed tensor", "mlx.launch")
    assert_one_line_error(run_cli("chat", "--model", str(tiny["qwen3"]), "--distributed", "tensor"),
                          "mlx-spec serve --distributed tensor", "chat --server")
    assert_one_line_error(run_cli("bench", "--model", str(tiny["qwen3"]), "--distributed", "tensor"),
                          "scripts/bench_distributed.py")
    proc = mlx_launch("generate", "--model", str(tiny["qwen3_5"]), "--draft-model", str(tiny["qwen3_5-dspark"]),
                      "--distributed", "pipeline", "--prompt", "x")
    assert "mlx-spec: error: the block drafter reads the outputs of layers" in proc.stderr, proc.stderr
    assert "--distributed tensor" in proc.stderr and "Traceback" not in proc.stderr
    proc = mlx_launch("generate", "--model", str(tiny["qwen3"]), "--distributed", "pipeline", "--prompt", "x")
    assert "mlx-spec: error: mlx-lm" in proc.stderr and "cannot split" in proc.stderr, proc.stderr
    assert "--distributed tensor" in proc.stderr and "Traceback" not in proc.stderr


def test_images_on_two_ranks_are_mlx_vlms_plain_greedy(tiny, images, tmp_path):
    """Qwen 3.5 with its vision tower across two ranks: rank 0 reads the images and hands their features and M-RoPE
    positions on with each job, alone (`generate --image`, tensor-wise) and in a batch beside a text row (`batch`,
    pipeline-wise); each image answer is mlx-vlm's plain greedy generation."""
    from mlx_vlm import load
    from test_vision import QUESTION, chat, reference_greedy

    reference = load(str(tiny["qwen3_5-vision"]))
    proc = mlx_launch("generate", "--model", str(tiny["qwen3_5-vision"]), "--draft-model",
                      str(tiny["qwen3_5-vision-draft"]), "--num-draft", "2", "--distributed", "tensor", "--image",
                      images[0], "--image", images[1], "--prompt", QUESTION, "--max-tokens", "16", "--json")
    result = generated(proc)
    tokens = result["tokens"]
    assert tokens == reference_greedy(reference, images[:2], 16, QUESTION)[:len(tokens)] and len(tokens) > 4
    assert 0 < result["stats"]["accepted"] < result["stats"]["drafted"]
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in [
        {"id": "wide", "messages": chat(images[:1])}, {"id": "both", "messages": chat(images)},
        {"id": "text", "prompt": QUESTION}]))
    proc = mlx_launch("batch", str(requests), "-o", str(out), "--model", str(tiny["qwen3_5-vision"]), "--draft-model",
                      str(tiny["qwen3_5-vision-draft"]), "--distributed", "pipeline", "--max-tokens", "12",
                      "--batch-size", "3", "--quiet")
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())} if out.exists() else {}
    assert set(results) == {"wide", "both", "text"}, proc.stderr
    for name, shown in (("wide", images[:1]), ("both", images)):
        expected = reference[1].tokenizer.decode(reference_greedy(reference, shown, 12))
        assert results[name]["text"] and expected.startswith(results[name]["text"]), name
    assert max(r["stats"]["batch_size"] for r in results.values()) == 3


CONVERSATIONS_ON_RANKS = """
import json, sys
import mlx_spec
from mlx_spec import Job
engine = mlx_spec.load(sys.argv[1], drafter="ngram", draft_len=3, distributed="pipeline")
if not engine.lockstep.leader:
    sys.exit(engine.lockstep.follow(engine))
openings, turns, prompts, held = json.loads(sys.argv[2]), [], {}, {}

def turn(i, result):
    turns.append({"conversation": i, "prompt": prompts[i], "tokens": result.tokens, "held": held.get(i, 0),
                  "reused": result.stats.reused_prompt_tokens, "drafted": result.stats.drafted})
    held[i] = len(prompts[i]) + len(result.tokens) - 1
    prompts[i] = prompts[i] + result.tokens + engine.encode(f" and then {openings[i]}")

engine.cache_prompts(1 << 30)
for i, opening in enumerate(openings):  # the cut-back view: a prompt sharing part of the live sequence
    prompts[i] = engine.encode(opening)
    turn(i, engine.generate(prompts[i], max_tokens=16))
engine.cache_prompts(int(2.5 * max(entry.nbytes for entry in engine.prompt_cache.stored)))  # a second cache
for i in [0, 1, 2, 0, 2, 1]:  # alone, under a budget some sequences leave
    turn(i, engine.generate(prompts[i], max_tokens=16))
jobs = [(i, Job(prompts[i], max_tokens=16)) for i in (1, 2)]
for index, result in engine.generate_many([job for _, job in jobs], 2):  # rows
    turn(jobs[index][0], result)
print(json.dumps({"turns": turns, "budget": engine.prompt_cache.budget, "bytes": engine.prompt_cache.nbytes}))
engine.lockstep.finish()
"""


def test_conversations_on_two_ranks_reuse_the_prompt_cache_exactly(tiny, tmp_path):
    """The prompt cache across pipeline ranks that see their caches differently: a 2-layer Qwen3.5 split in
    two, one rank holding its Gated DeltaNet layer (a cache that cannot be cut back), the other its attention layer
    (one that can, and that takes other bytes). Conversations alternate alone, through a budget some leave, then as
    a batch's rows: the ranks decide alike (else their forwards would no longer match), returning turns run only
    what the cache does not hold, and every answer is mlx-lm's plain greedy decoding."""
    model = build_checkpoint(tmp_path / "qwen3_5-2", "qwen3_5", tiny["qwen3_5"], layers=2, overrides={
        "full_attention_interval": 2, "layer_types": ["linear_attention", "full_attention"]})
    openings = ["def add(a, b):", "def add(x, y):", "class Stack:"]
    ranks = start_ranks(tmp_path, [str(model), json.dumps(openings)], [str(model), json.dumps(openings)],
                        program=("-c", CONVERSATIONS_ON_RANKS))
    codes = [rank.wait(timeout=120) for rank in ranks]
    outputs = [rank.stdout.read() for rank in ranks]
    assert codes == [0, 0], [rank.stderr.read() for rank in ranks]
    result = json.loads(outputs[0])
    for turn in result["turns"]:
        assert turn["tokens"] == plain_greedy(model, turn["prompt"], 16), turn
    reused = [(turn["reused"], turn["held"]) for turn in result["turns"]]
    assert reused[1][0] == 0  # shares a prefix with the live sequence, which cannot be cut back on every rank
    returning = reused[3:]
    assert all(n in (0, held) for n, held in returning), reused  # a sequence held whole, or gone
    assert any(n == held > 0 for n, held in returning[:-2]) and any(n == held > 0 for n, held in returning[-2:])
    assert any(n == 0 for n, _ in returning), reused  # the budget let one go
    assert 0 < result["bytes"] <= result["budget"]
    assert sum(turn["drafted"] for turn in result["turns"]) > 0
