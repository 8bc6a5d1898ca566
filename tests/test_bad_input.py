"""Bad input never reaches the user as a traceback: one `mlx-spec: error: ...` line (exit 2), `FILE:LINE: skipped`
for a bad batch line (the rest runs, exit 1), and a quiet exit 130 on Ctrl+C, whenever it comes.

The tracebacks of issue 11 through the real command, then fuzzing: malformed JSONL lines and files, and bad
arguments for every command, run in-process through `mlx_spec.cli.main` (it returns a status, never raises)."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import PROMPT, assert_one_line_error, default_ctrl_c, run_cli

from mlx_spec.cli import exit_on_interrupt, main


def batch_file(path, *lines):
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) + "\n" for line in lines))
    return path


def results(path):
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def run_main(capsys, *argv):
    """main(argv) in this process -> (status, stderr, stdout); "usage" for argparse's own errors. Asserts what
    every outcome must satisfy: no traceback, and exactly one error line for a refusal."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's usage errors: exit 2 with a usage line, acceptable
        captured = capsys.readouterr()
        assert e.code == 2 and "usage:" in captured.err, (argv, captured.err)
        return "usage", captured.err, captured.out
    captured = capsys.readouterr()
    assert isinstance(status, int), argv
    assert "Traceback" not in captured.err + captured.out, (argv, captured.err)
    errors = [line for line in captured.err.splitlines() if line.startswith("mlx-spec: error:")]
    if status == 2:
        assert len(errors) == 1, (argv, captured.err)
    else:
        assert status in (0, 1) and not errors, (argv, status, captured.err)
    return status, captured.err, captured.out


# -- issue 11: each reported traceback is now one line ---------------------------------------------------------

@pytest.mark.parametrize("line,reason", [
    ({"id": "m", "messages": []}, "messages must be a non-empty list"),
    ({"id": "n", "prompt": 123, "raw": True}, "\"prompt\" must be text, got int"),
])
def test_batch_bad_request_is_a_skipped_line(tiny, tmp_path, line, reason):
    requests = batch_file(tmp_path / "in.jsonl", line, {"id": "ok", "prompt": "x"})
    proc = run_cli("batch", requests, "-o", tmp_path / "out.jsonl", "--model", tiny["qwen3"], "--max-tokens", "2",
                   "--quiet")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{requests}:1: skipped: {reason}" in proc.stderr
    assert list(results(tmp_path / "out.jsonl")) == ["ok"]


def test_batch_output_in_a_missing_folder_is_refused_before_loading(tiny, tmp_path):
    requests = batch_file(tmp_path / "in.jsonl", {"id": "a", "prompt": "x"})
    proc = run_cli("batch", requests, "-o", "/nonexistent/dir/out.jsonl", "--model", tiny["qwen3"])
    assert_one_line_error(proc, "-o /nonexistent/dir/out.jsonl", "/nonexistent/dir does not exist")
    assert "drafter:" not in proc.stderr  # printed once the model is loaded


def test_batch_output_that_is_not_jsonl_is_refused(tiny, tmp_path):
    requests = batch_file(tmp_path / "in.jsonl", {"id": "a", "prompt": "x"})
    output = tmp_path / "notes.txt"
    output.write_text("my notes, not results\n")
    proc = run_cli("batch", requests, "-o", output, "--model", tiny["qwen3"])
    assert_one_line_error(proc, f"{output}:1 is not a result line", "give -o a new file")
    assert output.read_text() == "my notes, not results\n" and "drafter:" not in proc.stderr


def test_bench_missing_prompts_file(tiny, tmp_path):
    proc = run_cli("bench", "--model", tiny["qwen3"], "--prompts", tmp_path / "nofile.jsonl")
    assert_one_line_error(proc, "nofile.jsonl does not exist", "JSONL file of prompts")


def test_bench_zero_reps(tiny):
    proc = run_cli("bench", "--model", tiny["qwen3"], "--reps", "0")
    assert_one_line_error(proc, "--reps must be >= 1, got 0")


def test_bench_unwritable_plot_is_refused_before_any_run(tiny, tmp_path):
    start = time.perf_counter()
    proc = run_cli("bench", "--model", tiny["qwen3"], "--suite", "spec", "--reps", "3", "--plot", "/nonexistent/x.svg")
    assert_one_line_error(proc, "--plot /nonexistent/x.svg", "/nonexistent does not exist")
    assert "bench:" not in proc.stderr and "runs" not in proc.stderr  # nothing loaded, nothing run
    assert time.perf_counter() - start < 60  # the whole spec suite three times over would take far longer


def interrupted(args, delay, during_output=False):
    """Run the command, send SIGINT `delay` s after the CLI module installed its Ctrl+C handler (or after the first
    output) -> (status, stderr). `-X importtime` tells: cli.py imports mlx_spec.seams.errors right after installing it.
    (Before that, Python's own start-up and `import mlx_spec` run: see test_ctrl_c_before_and_after_main.)"""
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "mlx_spec.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_ctrl_c)
    lines, imported = [], threading.Event()

    def drain():
        for line in proc.stderr:
            lines.append(line.decode(errors="replace"))
            if line.rstrip().endswith(b"| mlx_spec.seams.errors"):
                imported.set()
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    assert imported.wait(120)
    if during_output:
        proc.stdout.read(1)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    status = proc.wait(120)
    reader.join(30)
    return status, "".join(line for line in lines if not line.startswith("import time:"))


@pytest.mark.parametrize("delay,during_output", [(0.0, False), (0.02, False), (0.3, False), (1.0, False),
                                                 (0.05, True)])
def test_ctrl_c_ends_quietly_whenever_it_comes(tiny, delay, during_output):
    status, stderr = interrupted(["generate", "--prompt", "hi", "--max-tokens", "500", "--model", tiny["qwen3"],
                                  "--drafter", "ngram"], delay, during_output)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    # -2: killed by SIGINT, as Python ends when a library saw the interrupt first (a shell reports 130 too);
    # 0: it had finished, or a library swallowed the interrupt (MLX runs `g++ --version` through system())
    assert status in (130, -signal.SIGINT, 0), stderr


def test_interrupted_extension_import_counts_as_ctrl_c(monkeypatch, capsys):
    """An extension module interrupted while it initialises raises ImportError from the KeyboardInterrupt."""
    import mlx_spec.cli as cli

    def interrupted_import(args):
        raise ImportError("Encountered an error while initializing the extension.") from KeyboardInterrupt()
    monkeypatch.setattr(cli, "convert", interrupted_import)
    assert cli.main(["convert", "--hf-path", "x", "--mlx-path", "y"]) == 130
    assert "Traceback" not in capsys.readouterr().err

    def broken_import(args):
        raise ImportError("a real one")
    monkeypatch.setattr(cli, "convert", broken_import)
    with pytest.raises(ImportError, match="a real one"):  # not ours to hide
        cli.main(["convert", "--hf-path", "x", "--mlx-path", "y"])


def test_ctrl_c_before_and_after_main_ends_quietly():
    """The windows outside main()'s `except KeyboardInterrupt`, hit exactly: as the `mlx-spec` script, Ctrl+C
    right after the module's import, during shutdown after main() returned, and in a finaliser (where Python
    prints "Exception ignored ... Traceback" and carries on)."""
    start = "import os, signal, sys, time\nsys.argv = ['mlx-spec']\nimport mlx_spec.cli\n"
    before = start + "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n"
    after = (start + "status = mlx_spec.cli.main(['convert', '--hf-path', '/nonexistent', '--mlx-path', '/x'])\n"
             "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\nsys.exit(status)\n")
    finaliser = (start + "class Interrupted:\n    def __del__(self):\n        raise KeyboardInterrupt\n"
                 "Interrupted()\ntime.sleep(30)\n")
    for code in (before, after, finaliser):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              preexec_fn=default_ctrl_c)
        assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    # imported by another program (here pytest), the module leaves Ctrl+C alone
    assert signal.getsignal(signal.SIGINT) is not exit_on_interrupt


def test_prompt_on_stdin_that_is_not_utf8(tiny):
    command = [sys.executable, "-m", "mlx_spec.cli", "generate", "--prompt", "-", "--model", str(tiny["qwen3"])]
    for encoding, fragment in [("utf-8:strict", "the prompt on stdin is not UTF-8 text"),
                               ("utf-8:surrogateescape", "the prompt is not valid Unicode")]:
        proc = subprocess.run(command, input=b"caf\xe9\n", capture_output=True, timeout=300,
                              env={**os.environ, "PYTHONIOENCODING": encoding})
        assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                                          proc.stderr.decode()), fragment)


# -- batch: bad lines are skipped, the rest runs; sampling flags are defaults -------------------------------------

def test_batch_empty_prompt_is_skipped_and_the_rest_runs(tiny, tmp_path, capsys):
    requests = batch_file(tmp_path / "in.jsonl", {"id": "e", "prompt": ""}, {"id": "ok", "prompt": "x"})
    status, err, _ = run_main(capsys, "batch", requests, "-o", tmp_path / "out.jsonl", "--model", tiny["qwen3"],
                              "--max-tokens", "2", "--quiet")
    assert status == 1 and f"{requests}:1: skipped: the prompt is empty" in err
    assert list(results(tmp_path / "out.jsonl")) == ["ok"]


def test_batch_messages_for_a_model_without_chat_template(tiny, tmp_path, capsys):
    model = shutil.copytree(tiny["llama"], tmp_path / "no-template")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    requests = batch_file(tmp_path / "in.jsonl",
                          {"id": "chat", "messages": [{"role": "user", "content": "def f(x):"},
                                                      {"role": "user", "content": "    return"}]},
                          {"id": "text", "prompt": "def f(x):\n    return"})
    status, err, _ = run_main(capsys, "batch", requests, "-o", tmp_path / "out.jsonl", "--model", model,
                              "--max-tokens", "6", "--quiet")
    out = results(tmp_path / "out.jsonl")
    assert status == 0 and set(out) == {"chat", "text"}, err
    assert out["chat"]["text"] == out["text"]["text"]  # the contents joined by newlines, no template


def test_batch_sampling_flags_are_defaults_for_lines_that_set_none(tiny, tmp_path, capsys):
    model = ["--model", tiny["qwen3"], "--drafter", "ngram", "--num-draft", "2"]  # pinned: the seed repeats
    requests = batch_file(tmp_path / "in.jsonl", {"id": "default", "prompt": PROMPT},
                          {"id": "own", "prompt": PROMPT, "temperature": 0, "seed": 9})
    sampling = ["--temp", "0.9", "--top-p", "0.95", "--seed", "3"]
    status, err, _ = run_main(capsys, "batch", requests, "-o", tmp_path / "out.jsonl", *model, *sampling,
                              "--max-tokens", "12", "--quiet")
    assert status == 0, err
    out = results(tmp_path / "out.jsonl")

    def generate(*flags):
        status, err, stdout = run_main(capsys, "generate", "--prompt", PROMPT, *model, "--max-tokens", "12", "--json",
                                       *flags)
        assert status == 0, err
        return json.loads(stdout)["text"]
    assert out["default"]["text"] == generate(*sampling)
    assert out["own"]["text"] == generate("--temp", "0") != out["default"]["text"]  # a line's own value wins


# -- fuzzing ------------------------------------------------------------------------------------------------------

MESSAGES = [[], [{}], [{"role": "user"}], [{"role": 5, "content": "hi"}], [{"content": "hi"}],
            [{"role": "user", "content": 1}], [{"role": "user", "content": ""}], [{"role": "system", "content": "s"}],
            [{"role": "assistant", "content": "a"}], [{"role": "user", "content": "hi"}, "x"],
            [{"role": "user", "content": "\ud800"}], [{"role": "user", "content": "hi", "extra": [[{}]]}]]
JUNK = [None, True, False, 0, -1, 1, 2, 2**31, 2**64, -10**30, 0.5, -0.5, 1e308, 1e-320, "", " ", "x", "\x00",
        "\ud800", "日本語🙂", "a\u2028b\x85c", [], [1], [""], ["a", 1], ["\ud800"], {}, {"a": 1}, [[["deep"]]],
        *MESSAGES]
LITERALS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "1" * 400, "-0", "\"\\ud800\"",
            "\"\\udc80\\ud800\"", "[" * 50 + "]" * 50, "{\"a\": {\"b\": [null, NaN]}}"]
FIELDS = ["id", "prompt", "messages", "raw", "max_tokens", "stop", "seed", "temperature", "top_p", "top_k", "min_p",
          "repetition_penalty", "presence_penalty", "frequency_penalty", "penalty_window", "nonsense"]
VALID = {"id": [5, "x", "日本"], "prompt": ["日本語🙂", "a\u2028b\x85c", " ", "\x00"],
         "messages": [[{"role": "user", "content": "hi"}]], "raw": [True, False], "max_tokens": [1, 3],
         "stop": [[], ["\n"], [""]], "seed": [0, 2**64 - 1], "temperature": [0, 0.7, 1e-6], "top_p": [0.9, 1],
         "top_k": [0, 5, 10**30], "min_p": [0.05], "repetition_penalty": [1.1], "presence_penalty": [-1, 0.5],
         "frequency_penalty": [0.3], "penalty_window": [1, 10**30], "nonsense": [None]}
HAND_WRITTEN = [b"", b"   ", b"[]", b"null", b"1", b"\"s\"", b"{", b"{}", b"{}}", b"{\"id\": \"a\"}",
                b"{\"id\": true, \"prompt\": \"x\"}", b"{\"id\": 1.5, \"prompt\": \"x\"}",
                b"{\"id\": null, \"prompt\": \"x\"}", b"{\"id\": [\"x\"], \"prompt\": \"x\"}",
                b"{\"id\": \"dup\", \"prompt\": \"x\", \"max_tokens\": 2}",
                b"{\"id\": \"dup\", \"prompt\": \"y\", \"max_tokens\": 2}",
                b"{\"id\": \"bytes\", \"prompt\": \"\xff\xfe\", \"max_tokens\": 2}", b"\xc3\x28\xa0\xa1",
                "{\"id\": \"raw-u2028\", \"prompt\": \"a\u2028b\x85c\", \"max_tokens\": 2}".encode(),
                b"{\"id\": 7, \"prompt\": \"x\", \"max_tokens\": 2, \"stop\": [\"\", \"\\n\"]}",
                b"{\"id\": \"nul\", \"prompt\": \"\\u0000\", \"max_tokens\": 2}",
                b"{\"id\": \"space\", \"prompt\": \" \", \"raw\": true, \"max_tokens\": 2}",
                b"{\"id\": \"huge-top-k\", \"prompt\": \"x\", \"top_k\": 99999999999999999999999, \"temperature\": 1,"
                b" \"max_tokens\": 2}"]


def fuzzed_lines(rng: random.Random, n: int) -> list[bytes]:
    """Valid requests with one or two fields replaced by junk of every type, or by raw JSON literals."""
    lines = []
    for i in range(n):
        item = {"id": f"f{i}", "prompt": "def f(x):", "max_tokens": 2}
        literal = None
        for _ in range(rng.randint(1, 2)):
            field = rng.choice(FIELDS)
            if field == "messages" and rng.random() < 0.7:
                item.pop("prompt", None)
            if rng.random() < 0.25 and field != "max_tokens":  # never a huge max_tokens: it would run for ages
                literal = (field, rng.choice(LITERALS))
            else:
                value = rng.choice(VALID[field] if rng.random() < 0.4 else JUNK)
                if field == "max_tokens" and isinstance(value, int) and value > 4:
                    value = -value
                item[field] = value
        text = json.dumps(item, ensure_ascii=rng.random() < 0.5)
        if literal:
            text = text[:-1] + f", \"{literal[0]}\": {literal[1]}}}"
        line = text.encode("utf-8", errors="surrogatepass")  # an unescaped lone surrogate: not UTF-8 either
        if rng.random() < 0.05:
            line = line[:rng.randrange(1, len(line))]  # torn
        lines.append(line)
    return lines


def test_fuzzed_batch_lines_are_skipped_or_run_never_a_traceback(tiny, tmp_path, capsys):
    rng = random.Random(11)
    lines = fuzzed_lines(rng, 160) + HAND_WRITTEN
    rng.shuffle(lines)
    requests = tmp_path / "in.jsonl"
    requests.write_bytes(b"\n".join(lines) + b"\n" + b"{\"id\": \"torn-last\", \"prom")
    output = tmp_path / "out.jsonl"
    status, err, _ = run_main(capsys, "batch", requests, "-o", output, "--model", tiny["qwen3"], "--drafter",
                              "ngram", "--max-tokens", "2", "--quiet")
    assert status == 1
    skipped = {}
    for line in err.splitlines():
        if ": skipped: " in line:
            where, reason = line.split(": skipped: ", 1)
            number = int(where.rsplit(":", 1)[1])
            assert number not in skipped and reason.strip(), line
            skipped[number] = reason
    out = results(output)
    assert len(out) == len(output.read_text().splitlines())  # each id once
    assert all({"id", "text", "stop_reason", "stats"} <= set(r) for r in out.values())
    for number, line in enumerate(requests.read_bytes().split(b"\n"), start=1):
        if line.strip() and number not in skipped:  # not reported as bad: it was generated
            assert json.loads(line)["id"] in out, (number, line)
    assert len(skipped) > 50 and len(out) > 10 and max(skipped) == len(lines) + 1  # the torn last line


BAD_OUTPUTS = {"not json": b"hello\n", "a list": b"[1, 2]\n", "no id": b"{\"x\": 1}\n", "id a list": b"{\"id\": []}\n",
               "binary output": bytes(range(256))}


@pytest.mark.parametrize("case", ["empty", "blank lines", "bom and crlf", "u2028 in a prompt", "bad utf-8 line",
                                  "torn last line", "binary input", *BAD_OUTPUTS, "torn output", "same file", "folder"])
def test_batch_files(tiny, tmp_path, capsys, case):
    good = b"{\"id\": \"good\", \"prompt\": \"x\", \"max_tokens\": 2}"
    data, expected_status, expected = {
        "empty": (b"", 0, "0 generated"),
        "blank lines": (b"\n \n\t\n", 0, "0 generated"),
        "bom and crlf": (b"\xef\xbb\xbf" + good + b"\r\n", 0, "1 generated"),
        "u2028 in a prompt": ("{\"id\": \"good\", \"prompt\": \"a\u2028b\x85c\", \"max_tokens\": 2}\n".encode(), 0,
                              "1 generated"),
        "bad utf-8 line": (b"{\"id\": \"x\", \"prompt\": \"caf\xe9\"}\n" + good + b"\n", 1, ":1: skipped: not UTF-8"),
        "torn last line": (good + b"\n{\"id\": \"b\", \"pro", 1, ":2: skipped: not valid JSON"),
        "binary input": (bytes(random.Random(1).randrange(256) for _ in range(3000)), 1, "skipped"),
    }.get(case, (good + b"\n", 2, "mlx-spec: error:"))
    requests = tmp_path / "in.jsonl"
    requests.write_bytes(data)
    output = tmp_path / "out.jsonl"
    if case in BAD_OUTPUTS:
        output.write_bytes(BAD_OUTPUTS[case])
    elif case == "torn output":
        output.write_bytes(b"{\"id\": \"old\", \"text\": \"\", \"stop_reason\": \"eos\", \"stats\": {}}\n{\"id\": \"to")
        expected_status, expected = 0, "1 generated"
    elif case == "same file":
        output = requests
    elif case == "folder":
        output = tmp_path
    before = output.read_bytes() if output.is_file() else None
    status, err, _ = run_main(capsys, "batch", requests, "-o", output, "--model", tiny["qwen3"], "--quiet")
    assert status == expected_status and expected in err, err
    if status == 2:
        assert (output.read_bytes() if output.is_file() else None) == before  # refused: nothing written
    if case in ("bom and crlf", "u2028 in a prompt", "bad utf-8 line", "torn last line", "torn output"):
        assert "good" in results(output)


def test_outputs_without_write_permission_are_refused_before_loading(tiny, tmp_path, capsys, monkeypatch):
    import mlx_spec.seams.files

    monkeypatch.setattr(mlx_spec.seams.files.os, "access", lambda path, mode: False)  # as if not root, read-only
    requests = batch_file(tmp_path / "in.jsonl", {"id": "a", "prompt": "x"})
    for argv in (["batch", requests, "-o", tmp_path / "out.jsonl"], ["bench", "--json", tmp_path / "r.json"]):
        status, err, _ = run_main(capsys, *argv, "--model", tiny["qwen3"])
        assert status == 2 and "no permission to write there" in err, err
        assert "drafter:" not in err and "bench:" not in err  # nothing loaded


BAD_NUMBERS = ["-1", "0", "nan", "inf", "-inf", "1e999", "1e-999", "-1e-320", str(2**70), str(-2**70), "abc", "",
               "0x10", "1.5", "3", "1e-300", "1e300"]
NUMERIC = {
    "generate": ["--max-tokens", "--num-draft", "--kv-bits", "--kv-group-size", "--temp", "--top-p", "--top-k",
                 "--min-p", "--repetition-penalty", "--presence-penalty", "--frequency-penalty", "--penalty-window",
                 "--seed"],
    "bench": ["--max-tokens", "--reps", "--num-draft", "--kv-bits", "--kv-group-size"],
    "convert": ["--q-bits", "--q-group-size", "--mtp-bits"],
}
NUMERIC["batch"] = NUMERIC["generate"]


def fuzzed_arguments(rng: random.Random, paths: dict, n: int) -> list[list[str]]:
    """Every command with one to three numeric flags set to nonsense (never a huge token or repetition count)."""
    cases = []
    for _ in range(n):
        command = rng.choice(list(NUMERIC))
        base = {"generate": ["--prompt", "hi", "--model", paths["qwen3"], "--max-tokens", "2"],
                "batch": [paths["requests"], "-o", paths["tmp"] / f"out{len(cases)}.jsonl", "--model", paths["qwen3"],
                          "--max-tokens", "2", "--quiet"],
                "bench": ["--model", paths["qwen3"], "--prompts", paths["prompts"], "--max-tokens", "2"],
                "convert": ["--hf-path", paths["qwen3"], "--mlx-path", paths["tmp"] / f"conv{len(cases)}"]}[command]
        flags = []
        for flag in rng.sample(NUMERIC[command], rng.randint(1, 3)):
            value = rng.choice(BAD_NUMBERS)
            if flag in ("--max-tokens", "--reps") and value in (str(2**70), "1e300", "3"):
                value = "-3"
            flags += [flag, value]
        cases.append([command, *base, *flags])
    return cases


@pytest.fixture
def paths(tiny, tmp_path):
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    batch_file(tmp_path / "requests.jsonl", {"id": "a", "prompt": "x"})
    (tmp_path / "file.txt").write_text("a file\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "bad-config").mkdir()
    (tmp_path / "bad-config" / "config.json").write_text("{not json")
    (tmp_path / "not-utf8.jsonl").write_bytes(b"{\"prompt\": \"caf\xe9\"}\n")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    return {**tiny, "tmp": tmp_path, "prompts": tmp_path / "prompts.jsonl", "requests": tmp_path / "requests.jsonl",
            "file": tmp_path / "file.txt", "folder": tmp_path / "folder", "bad-config": tmp_path / "bad-config"}


def hand_written_arguments(p: dict) -> list[list]:
    q, tmp, missing = p["qwen3"], p["tmp"], p["tmp"] / "missing"
    prompt = ["generate", "--max-tokens", "2", "--prompt"]
    gen = [*prompt, "hi"]
    batch = ["batch", p["requests"], "--model", q, "--max-tokens", "2", "--quiet", "-o"]
    bench = ["bench", "--model", q, "--max-tokens", "2"]
    convert, add_mtp = ["convert", "--hf-path"], ["convert", "--add-mtp", "--hf-path"]
    return [
        [*gen, "--model", missing], [*gen, "--model", p["file"]], [*gen, "--model", p["folder"]],
        [*gen, "--model", p["bad-config"]], [*gen, "--model", q, "--draft-model", missing],
        [*gen, "--model", q, "--draft-model", p["file"]], [*gen, "--model", q, "--draft-model", p["other-vocab"]],
        [*gen, "--model", q, "--drafter", "mtp"], [*gen, "--model", q, "--drafter", "draft-model"],
        [*gen, "--model", q, "--drafter", "bogus"], [*gen, "--model", q, "--num-draft", "99"],
        [*gen, "--model", q, "--num-draft", "-1"], [*gen, "--model", q, "--seed", str(2**64)],
        [*gen, "--model", q, "--kv-bits", "4", "--kv-group-size", "32", "--draft-model", p["qwen3-draft"]],
        [*gen, "--model", p["gemma4"], "--draft-model", p["gemma4-assistant"], "--kv-bits", "4",
         "--kv-group-size", "32"],
        [*gen, "--model", p["qwen3_5"], "--drafter", "mtp", "--mtp-hidden", "pre", "--num-draft", "3"],
        [*gen, "--model", q, "--stop", "", "--stop", "\udcff"], [*prompt, "", "--model", q],
        [*prompt, "a\udcffb", "--model", q], [*prompt, " ", "--model", q, "--raw"],
        [*gen, "--model", q, "--repetition-penalty", "1e-300", "--temp", "1"],
        [*gen, "--model", q, "--presence-penalty", "1e39", "--temp", "1"],
        ["batch", missing, "-o", tmp / "o.jsonl", "--model", q], ["batch", p["folder"], "-o", tmp / "o.jsonl"],
        [*batch, p["folder"]], [*batch, missing / "out.jsonl"], [*batch, p["requests"]], [*batch, p["file"]],
        [*batch, p["file"] / "out.jsonl"], [*batch, ""], ["batch", "", "-o", tmp / "o2.jsonl"],
        [*bench, "--prompts", missing], [*bench, "--prompts", p["folder"]],
        [*bench, "--prompts", tmp / "empty.jsonl"], [*bench, "--prompts", tmp / "not-utf8.jsonl"],
        [*bench, "--prompts", p["requests"]], [*bench, "--prompts", p["file"]],
        [*bench, "--prompts", p["prompts"], "--json", p["folder"]],
        [*bench, "--prompts", p["prompts"], "--plot", missing / "x.svg"],
        [*bench, "--prompts", p["prompts"], "--json", tmp / "r.json", "--plot", tmp / "r.json"],
        [*bench, "--prompts", p["prompts"], "--drafters", "bogus"],
        [*bench, "--prompts", p["prompts"], "--drafters", ","],
        [*bench, "--prompts", p["prompts"], "--drafters", "mtp"],
        [*bench, "--prompts", p["prompts"], "--num-draft", "99"],
        [*bench, "--prompts", p["prompts"], "--draft-model", p["other-vocab"]], [*bench, "--suite", "nope"],
        [*convert, missing, "--mlx-path", tmp / "c1"], [*convert, p["file"], "--mlx-path", tmp / "c2"],
        [*convert, p["folder"], "--mlx-path", tmp / "c3"], [*convert, "", "--mlx-path", tmp / "c4"],
        [*convert, p["bad-config"], "--mlx-path", tmp / "c5"], [*convert, q, "--mlx-path", p["folder"]],
        [*convert, q, "--mlx-path", p["file"]], [*add_mtp, q, "--mlx-path", missing],
        [*add_mtp, q, "--mlx-path", q], [*add_mtp, missing, "--mlx-path", p["qwen3_5"]],
    ]


def test_fuzzed_arguments_never_traceback(paths, capsys):
    cases = hand_written_arguments(paths) + fuzzed_arguments(random.Random(5), paths, 70)
    outcomes = [run_main(capsys, *argv)[0] for argv in cases]
    assert outcomes.count(2) > 30 and outcomes.count("usage") > 10  # the refusals are ours, not argparse's


@pytest.mark.parametrize("case", ["kv group larger than the head", "gemma4 quantized kv", "convert under a file",
                                  "add-mtp to a bad config"])
def test_refusals_found_by_fuzzing(paths, capsys, case):
    """Found by the fuzzing above: each was a traceback."""
    gen = ["generate", "--prompt", "hi", "--max-tokens", "2", "--drafter", "ngram"]
    argv = {"kv group larger than the head": [*gen, "--model", paths["qwen3"], "--kv-bits", "4"],  # head size 32
            "gemma4 quantized kv": [*gen, "--model", paths["gemma4"], "--kv-bits", "4", "--kv-group-size", "32"],
            "convert under a file": ["convert", "--hf-path", paths["qwen3"], "--mlx-path", paths["file"] / "out"],
            "add-mtp to a bad config": ["convert", "--add-mtp", "--hf-path", paths["qwen3"], "--mlx-path",
                                        paths["bad-config"]]}[case]
    fragment = {"kv group larger than the head": "--kv-group-size 64 does not divide its head size 32",
                "gemma4 quantized kv": "Gemma 4's KV-shared layers",
                "convert under a file": "cannot write in the folder",
                "add-mtp to a bad config": "is not valid JSON"}[case]
    status, stderr, _ = run_main(capsys, *argv)
    assert status == 2 and fragment in stderr, stderr


# -- issue 37: the edges a new user found ----------------------------------------------------------------------

@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("command", ["batch", "bench", "convert", "train-mtp"])
def test_outputs_where_no_file_can_be_made_are_refused_before_loading(paths, capsys, command):
    argv = {"batch": ["batch", paths["requests"], "-o", "/proc/out.jsonl", "--model", paths["qwen3"]],
            "bench": ["bench", "--json", "/proc/report.json", "--model", paths["qwen3"]],
            "convert": ["convert", "--hf-path", paths["qwen3"], "--mlx-path", "/proc/converted"],
            "train-mtp": ["train-mtp", "--model", paths["qwen3"], "--data", paths["prompts"], "--out", "/proc/head"],
            }[command]
    status, err, _ = run_main(capsys, *argv)
    assert status == 2 and ("no file can be made in /proc" in err or "cannot write in the folder /proc" in err), err
    assert "drafter:" not in err and "bench:" not in err and "[INFO]" not in err  # nothing loaded or written


def test_a_special_file_is_no_output(paths, capsys):
    status, err, _ = run_main(capsys, "bench", "--json", os.devnull, "--model", paths["qwen3"])
    assert status == 2 and "is not a regular file" in err and "bench:" not in err, err


def test_closed_stdin_and_a_full_disk_are_one_line_errors(tiny):
    generate = f"{sys.executable} -m mlx_spec.cli generate --model {tiny['qwen3']} --max-tokens 3"
    proc = subprocess.run(["bash", "-c", f"{generate} --prompt - <&-"], capture_output=True, text=True, timeout=300)
    assert_one_line_error(proc, "--prompt - reads the prompt from stdin, which is closed")
    if os.path.exists("/dev/full"):  # Linux: every write fails with "No space left on device"
        proc = subprocess.run(["bash", "-c", f"{generate} --prompt hi > /dev/full"], capture_output=True, text=True,
                              timeout=300)
        assert_one_line_error(proc, "cannot write the output (No space left on device)")


def test_checkpoints_without_a_tokenizer_or_with_a_truncated_mtp_file(tiny, tmp_path, capsys):
    from mlx_spec.loading import DEMO

    bare = shutil.copytree(tiny["qwen3"], tmp_path / "bare", ignore=shutil.ignore_patterns("tokenizer*"))
    status, err, _ = run_main(capsys, "generate", "--model", bare, "--prompt", "hi")
    assert status == 2 and "holds no tokenizer" in err, err
    demo = shutil.copytree(DEMO / "demo", tmp_path / "demo")
    data = (demo / "mtp.safetensors").read_bytes()
    (demo / "mtp.safetensors").write_bytes(data[: len(data) // 2])
    status, err, _ = run_main(capsys, "generate", "--model", demo, "--prompt", "hi")
    assert status == 2 and "mtp.safetensors" in err and "truncated or corrupt" in err, err


def test_a_prompt_past_the_context_is_refused(tiny, capsys):
    status, err, _ = run_main(capsys, "generate", "--model", tiny["qwen3"], "--prompt", "hi", "--max-tokens", "5000")
    assert status == 2 and "more than the model's context of 4096: shorten the prompt or lower max_tokens" in err, err
