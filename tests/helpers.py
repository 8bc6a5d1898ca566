"""Shared by several test modules: references computed independently of mlx-spec's engine."""

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors
from mlx_lm.utils import load
from safetensors.numpy import load_file, save_file

from mlx_spec.drafters.protocol import Draft, Drafter
from mlx_spec.policy.interface import DraftPolicy
from mlx_spec.policy.batch import BatchDraftLength
from mlx_spec.policy.sequence import AdaptiveDraftLength, FixedDraftLength
from mlx_spec.core.verify import position_keys
from tiny import PROMPT  # noqa: F401  the tests' prompt (the Medusa test heads are trained on it)


@functools.lru_cache(maxsize=8)
def loaded(path: str):
    """mlx-lm's model and tokenizer of a checkpoint, loaded once (a model holds no state between forwards)."""
    return load(path)


def penalty_processors(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, penalty_window=64):
    """mlx-lm's own logits processors for mlx-spec's penalties, each over the last `penalty_window` tokens."""
    return make_logits_processors(
        repetition_penalty=repetition_penalty if repetition_penalty != 1.0 else None,
        repetition_context_size=penalty_window, presence_penalty=presence_penalty or None,
        presence_context_size=penalty_window, frequency_penalty=frequency_penalty or None,
        frequency_context_size=penalty_window)


def plain_greedy(path, prompt_ids, max_tokens, repetition_penalty=1.0, kv_bits=None, **penalties):
    """mlx-lm's own plain greedy decoding, up to and including the first end-of-sequence token: the reference
    output of the target alone. `penalties`: presence_penalty, frequency_penalty, penalty_window, through
    mlx-lm's logits processors as `repetition_penalty` is."""
    model, tokenizer = loaded(str(path))
    processors = penalty_processors(repetition_penalty, **penalties)
    cache = make_prompt_cache(model)
    if kv_bits:  # full-attention layers quantized from the first prompt token (mlx-lm's generate_step keeps the
        # prompt unquantized); sliding-window and recurrent layers as they are
        cache = [QuantizedKVCache(group_size=32, bits=kv_bits) if type(c) is KVCache else c for c in cache]
    steps = generate_step(mx.array(prompt_ids), model, max_tokens=max_tokens, logits_processors=processors or None,
                          prompt_cache=cache)
    tokens = []
    for token, _ in steps:
        tokens.append(int(token))
        if tokens[-1] in tokenizer.eos_token_ids:
            break
    return tokens


def numpy_distribution(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """Temperature, then top-k, then top-p over what top-k kept, then min-p (the transformers order)."""
    probs = np.exp((logits - logits.max()) / temperature)
    probs /= probs.sum()
    order = np.argsort(-probs)
    if top_k:
        probs[order[top_k:]] = 0
        probs /= probs.sum()
    if top_p < 1.0:
        cumulative = np.cumsum(probs[order])
        probs[order[np.searchsorted(cumulative, top_p) + 1:]] = 0
    if min_p:
        probs[probs < min_p * probs.max()] = 0
    return probs / probs.sum()


def plain_sampled(path, prompt: list[int], max_tokens: int, temperature: float, top_p: float = 1.0, seed: int = 0,
                  top_k: int = 0, min_p: float = 0.0, allowed=None, **penalties) -> list[int]:
    """mlx-lm's model decoding alone, its logits through mlx-lm's own penalty processors (`penalty_processors`),
    each token drawn from its NumPy distribution by the documented rule: the Gumbel-max draw with the key of its
    position in the sequence (`position_keys`), up to the first end token. `allowed(tokens so far)`: a bool
    array over the logits of what may come next (a grammar's mask; None: everything)."""
    model, tokenizer = loaded(str(path))
    processors, history = penalty_processors(**penalties), mx.array(prompt)
    cache, tokens = make_prompt_cache(model), []
    logits = model(mx.array([prompt]), cache=cache)[:, -1]
    for position in range(len(prompt), len(prompt) + max_tokens):
        for processor in processors:
            logits = processor(history, logits)
        scores = np.array(logits[0], dtype=np.float64)
        if allowed is not None:
            scores = np.where(allowed(tokens), scores, -np.inf)
        p = numpy_distribution(scores, temperature, top_k, top_p, min_p)
        noise = np.array(mx.random.gumbel((p.size,), key=position_keys(mx.random.key(seed), position, 1)[0]))
        with np.errstate(divide="ignore"):
            tokens.append(int(np.argmax(np.log(p) + noise)))
        if tokens[-1] in tokenizer.eos_token_ids:
            break
        history = mx.concatenate([history, mx.array(tokens[-1:])])
        logits = model(mx.array([tokens[-1:]]), cache=cache)[:, -1]
    return tokens


def plain_decoded(path, prompt: list[int], max_tokens: int, seed: int = 0, temperature: float = 0.0,
                  **fields) -> list[int]:
    """The target alone under a request's sampling fields (mlx-spec's names): `plain_greedy` at temperature 0,
    else `plain_sampled` with `seed`."""
    if temperature == 0:
        assert not {"top_k", "top_p", "min_p"} & set(fields), "top-k, top-p and min-p need a temperature"
        return plain_greedy(path, prompt, max_tokens, **fields)
    return plain_sampled(path, prompt, max_tokens, temperature, seed=seed, **fields)


def plain_text(path, prompt: list[int], max_tokens: int, **fields) -> str:
    """`plain_decoded`'s answer as mlx-lm writes it (`mlx_lm_text`), without its end token."""
    tokenizer = loaded(str(path))[1]
    tokens = plain_decoded(path, prompt, max_tokens, **fields)
    return mlx_lm_text(tokenizer, tokens[:-1] if tokens[-1] in tokenizer.eos_token_ids else tokens)


def mlx_lm_text(tokenizer, tokens: list[int]) -> str:
    """`tokens` as mlx-lm's own streaming detokenizer writes them."""
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for token in tokens:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text


def chat_ids(path, messages: list[dict]) -> list[int]:
    """A chat as the model reads it, through its tokenizer's own chat template (as mlx-lm applies it)."""
    return loaded(str(path))[1].apply_chat_template(messages, add_generation_prompt=True)


class CorruptedOracleDrafter(Drafter):
    """Proposes the known reference continuation with one wrong token at a random position (or none), so
    rounds end after every possible number of accepted drafts. It drives the engine; it is not under test."""

    name = "oracle"

    def __init__(self, reference: list[int], prompt_len: int, vocab: int, seed: int = 0):
        import random

        self.reference, self.prompt_len, self.vocab = reference, prompt_len, vocab
        self.rng = random.Random(seed)

    def begin(self, context, prompt_step):
        pass

    def propose(self, context, k, params, key):
        done = len(context) - self.prompt_len
        tokens = list(self.reference[done:done + k])
        wrong_at = self.rng.randrange(len(tokens) + 1) if tokens else 0
        if wrong_at < len(tokens):
            tokens[wrong_at] = (tokens[wrong_at] + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
        return Draft(mx.array(tokens, dtype=mx.int32)) if tokens else Draft.empty()

    def accept(self, context, accepted, step):
        pass


class ModelledCostPolicy(AdaptiveDraftLength):
    """The adaptive policy fed a fixed cost model (a plain step 1, each draft `per_draft`) instead of the clock,
    so that a test's draft lengths depend on acceptance alone, not on how busy the machine is."""

    def __init__(self, max_len: int, per_draft: float = 0.1, **kwargs):
        super().__init__(max_len, **kwargs)
        self.per_draft = per_draft

    def observe(self, draft_len, accepted, seconds, rows=None, asked=None):
        super().observe(draft_len, accepted, 1.0 + self.per_draft * draft_len, rows, asked)


class FlatCostBatchPolicy(BatchDraftLength):
    """The batch policy fed a flat cost (every round one second, as a bandwidth-bound GPU would take) instead of
    the clock, so that a test's draft lengths depend on acceptance alone, not on how busy the machine is."""

    def observe(self, draft_len, accepted, seconds, rows=None, asked=None):
        super().observe(draft_len, accepted, 1.0, rows)


class Unreadied(FixedDraftLength):
    """Sequences start where drafting does not pay (`drafts_at`: no drafter work on their prompts); two drafts a
    round from the policy's third round on."""

    def __init__(self):
        super().__init__(2)
        self.rounds = 0

    def drafts_at(self, rows: int = 1) -> bool:
        return False

    def next_draft_len(self, remaining: int, outlook=None) -> int:
        self.rounds += 1
        return 0 if self.rounds < 3 else min(2, remaining - 1)


class RandomDraftLengths(DraftPolicy):
    """Seeded runs of one draft length and width each (length 0 included, up to 12 rounds long): every change of
    length and shape, drafting turned off for a while and back on, in a reproducible order."""

    note = "random draft lengths (test)"

    def __init__(self, max_len: int, seed: int, widths: tuple[int, ...] = (1,)):
        import random

        self.rng, self.max_len, self.widths, self.run, self.width = random.Random(seed), max_len, widths, [], 1
        self.readied = seed % 2 == 1

    def next_draft_len(self, remaining, outlook=None):
        if not self.run:
            length = self.rng.choice([0, *range(self.max_len + 1)])  # off twice as often as any one length
            self.run, self.width = [length] * self.rng.randint(1, 12), self.rng.choice(self.widths)
        return max(0, min(self.run.pop(), remaining - 1))

    def drafts_at(self, rows=1):
        """Odd seeds ready every sequence to draft; even ones do not (its drafter starts on the positions it
        decodes, no work on its prompt)."""
        return self.readied



def default_ctrl_c():
    """In the child: Ctrl+C at its default, as in a terminal, even when this run inherited it ignored (a shell
    starts background jobs that way), so that Python installs its own handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def edited_copy(source, dest, edit, weights: str = "model.safetensors"):
    """A copy of the checkpoint `source` at `dest` whose `weights` file went through `edit(dict) -> dict`."""
    shutil.copytree(source, dest)
    save_file(edit(load_file(str(dest / weights))), str(dest / weights))
    return dest


def pickled_only(source, dest, pickle: str):
    """`source`'s config.json beside a PyTorch pickle named `pickle`: a head published without safetensors."""
    dest.mkdir()
    shutil.copy(source / "config.json", dest)
    (dest / pickle).write_bytes(b"not read")
    return dest


def converted_q8(source, out) -> dict:
    """`mlx-spec convert -q` of `source` into `out` at 8 bits, groups of 32; the config it wrote."""
    proc = run_cli("convert", "--hf-path", str(source), "--mlx-path", str(out), "-q", "--q-bits", "8",
                   "--q-group-size", "32")
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "config.json").read_text())


def run_cli(*args, env=None, stdin=None):
    return subprocess.run([sys.executable, "-m", "mlx_spec.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, input=stdin, timeout=300)


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mlx-spec: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


KEY = "test-key"  # the API key of the servers tests start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tiny, *extra, drafter: tuple[str, ...] | None = None, model=None) -> tuple[subprocess.Popen, str]:
    """`mlx-spec serve` of the tiny qwen3 (qwen3-long: its context fits generations that run for minutes; or
    `model`) with its layer-skip draft (or the `drafter` flags) on a free localhost port, key KEY; returns (the
    process, its base URL) once /health answers."""
    port = free_port()
    drafter = drafter or ("--draft-model", str(tiny["qwen3-draft"]))
    proc = subprocess.Popen([sys.executable, "-m", "mlx_spec.cli", "serve", "--model", str(model or tiny["qwen3-long"]),
                             *drafter, "--port", str(port), "--api-key", KEY, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_ctrl_c)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read())
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not start")


def kill_at_checkpoint(command: list[str], marker) -> None:
    """Run a training `command` until its checkpoint `marker` file appears (or it ends), then SIGKILL it."""
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=default_ctrl_c)
    for _ in range(3000):
        if marker.exists() or proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def assert_same_weights(folder_a, folder_b) -> None:
    """Two written drafters hold the same tensors, bit for bit."""
    b = load_file(str(folder_b / "model.safetensors"))
    for name, value in load_file(str(folder_a / "model.safetensors")).items():
        np.testing.assert_array_equal(value, b[name], err_msg=name)


def assert_cli_decodes_greedily(target, *flags, max_tokens: int = 20) -> None:
    """`mlx-spec generate` with the drafter `flags` gives the target's plain greedy continuation of a head text."""
    from tiny import HEAD_TEXTS

    import mlx_spec

    proc = run_cli("generate", "--model", str(target), *flags, "--prompt", HEAD_TEXTS[0], "--raw", "--max-tokens",
                   str(max_tokens), "--json")
    assert proc.returncode == 0, proc.stderr
    ids = mlx_spec.load(str(target), drafter="off").encode(HEAD_TEXTS[0])
    assert json.loads(proc.stdout)["tokens"] == plain_greedy(target, ids, max_tokens)
