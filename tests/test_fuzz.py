"""Fuzzing the command line and the .pte loader (hypothesis): every failure is an exit code other
than 0 with exactly one line on stderr, a ``harness: error: <problem>; <fix>`` line; never a
traceback, a signal death or a hang.

In-process runs (``harness.cli.main``, stderr captured) take the many random prompts, token counts
and paths; real ``python -m harness`` processes take what only a process shows (argv bytes that
are not UTF-8, what native code writes to file descriptor 2); damaged ``.pte`` files run in a
child process with a timeout, one stderr file per case at the file-descriptor level, so that a
segfault or a hang is caught and attributed to its case.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import examples

pytestmark = pytest.mark.mac

CHILD_ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``harness.cli.main(argv)`` in this process: (exit code, stdout, stderr)."""
    from harness.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse: usage errors and --help
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def assert_clean(rc: int, stderr: str, what) -> None:
    """Success: exit 0 and nothing on stderr; failure: exit != 0 and one harness: error: line."""
    lines = stderr.splitlines()
    if rc == 0:
        assert stderr == "", f"{what}: exit 0 but stderr {stderr!r}"
        return
    assert len(lines) == 1, f"{what}: exit {rc}, {len(lines)} lines on stderr: {stderr[-2000:]!r}"
    assert lines[0].startswith("harness: error: "), f"{what}: exit {rc}, not a harness error: {lines[0]!r}"
    assert "; " in lines[0], f"{what}: the line names no fix: {lines[0]!r}"
    assert rc == 2, f"{what}: a user error exits 2, got {rc}"


@pytest.fixture(scope="module")
def pte_file(pipeline) -> str:
    return str(pipeline("fp32").pte_path)


# ---- prompts and token counts, in-process ---------------------------------------------------------
prompts = st.one_of(
    st.text(max_size=40),  # any code point, lone surrogates (undecodable argv bytes) included
    st.text(st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp"]), max_size=20),  # control, format, spaces
    st.text(st.sampled_from(" \t\n\r\x0b\x0c\u00a0\u2028\u3000"), max_size=30),  # whitespace only
    st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=8), st.integers(20, 400)),  # very long
    st.sampled_from(["What is the capital of France?", "-x", "--prompt", "<start_of_turn>", "<turn|>", "\x00",
                     "\ud800", "\udcff", "🙂" * 3, "a\u0301"]),
)
token_counts = st.one_of(
    st.integers(-3, 140).map(str),
    st.sampled_from(["", "abc", "1e3", "0x10", " 5", "9" * 30, "-0", "+4", "٣"]),
)


@settings(max_examples=examples(40))
@given(prompt=prompts, n=token_counts)
def test_generate_with_random_prompts_and_counts(pte_file, prompt, n):
    rc, out, err = run_cli(["generate", "--pte", pte_file, f"--prompt={prompt}", f"--max-new-tokens={n}"])
    assert_clean(rc, err, (prompt[:80], n))


# ---- paths, in-process ---------------------------------------------------------------------------
path_text = st.one_of(
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=30),
    st.sampled_from(["", ".", "..", "/", "//", "~", "-", "x.pte", "dir.pte", "dir.pte/", "a/b/c.pte",
                     "n" * 300 + ".pte", "/".join(["d"] * 200) + "/m.pte", "/proc/self/mem",
                     "/dev/null", "/nonexistent/m.pte", "empty.pte", "notes.pte", "tokdir", "garbagetok"]),
)


def _arena(root: Path) -> Path:
    """A folder with the shapes of things a wrong path can hit."""
    (root / "dir.pte").mkdir(exist_ok=True)
    (root / "empty.pte").write_bytes(b"")
    (root / "notes.pte").write_text("not a program\n")
    (root / "tokdir").mkdir(exist_ok=True)
    (root / "garbagetok").mkdir(exist_ok=True)
    (root / "garbagetok" / "tokenizer.json").write_bytes(b"\x00{not json")
    return root


def _under(root: Path, text: str) -> str:
    """Relative text goes under ``root``; absolute text stays (only ever read, or refused)."""
    return text if text.startswith("/") else str(root / text)


@settings(max_examples=examples(25))
@given(pte=path_text, tok=path_text, which=st.sampled_from(["pte", "tokenizer", "both"]))
def test_generate_with_random_paths(pte_file, tmp_path_factory, pte, tok, which):
    root = _arena(tmp_path_factory.mktemp("paths"))
    pte_arg = pte_file if which == "tokenizer" else _under(root, pte)
    tok_arg = "fixture" if which == "pte" else _under(root, tok)
    rc, out, err = run_cli(["generate", f"--pte={pte_arg}", f"--tokenizer={tok_arg}", "--prompt=hi"])
    assert_clean(rc, err, (pte_arg[:200], tok_arg[:200]))


@settings(max_examples=examples(15))
@given(out=path_text, recipe=st.sampled_from(["fp32", "int3", "", "FP32", "fp32 "]),
       model=st.sampled_from(["fixture", "/nonexistent", "tokdir", "notes.pte", "garbagetok", "cfg.json"]))
def test_export_with_random_paths(pipeline, tmp_path_factory, out, recipe, model):
    """Export writes, so every relative --out stays inside a temp folder; with the cached fixture
    .pte an export that succeeds takes seconds."""
    assume(not out.startswith("/") or out in ("/nonexistent/m.pte", "/dev/null", "/proc/self/mem", "/"))
    pipeline("fp32").pte_path  # cached, so a valid export only copies it
    root = _arena(tmp_path_factory.mktemp("export"))
    (root / "cfg.json").write_text('{"vocab_size": "many"}')
    model_arg = model if model in ("fixture", "/nonexistent") else str(root / model)
    rc, stdout, err = run_cli(["export", f"--model={model_arg}", f"--recipe={recipe}", f"--out={_under(root, out)}"])
    assert_clean(rc, err, (out[:200], recipe, model))
    if rc == 0:
        assert Path(_under(root, out)).is_file()


# ---- real processes: argv bytes, file descriptor 2 ------------------------------------------------
def _cli_process(args: list, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, env=CHILD_ENV,
                          timeout=timeout)


@settings(max_examples=examples(2))  # a process each: ~10 s
@given(prompt=st.one_of(st.binary(min_size=1, max_size=40).filter(lambda b: b"\x00" not in b),
                        st.sampled_from([b"\xff\xfe", b"caf\xe9", b"   ", b"x" * 3000])),
       n=st.sampled_from([b"0", b"-1", b"nine", b"100000", b"3"]))
def test_generate_process_with_raw_argv_bytes(pte_file, prompt, n):
    res = _cli_process([b"generate", b"--pte", pte_file.encode(), b"--prompt=" + prompt, b"--max-new-tokens=" + n])
    assert res.returncode >= 0, f"killed by signal {-res.returncode}"
    assert_clean(res.returncode, res.stderr.decode("utf-8", "replace"), (prompt, n))


@pytest.mark.parametrize("args", [
    ["generate", "--pte", "{pte}", "--prompt", "What is the capital of France?", "--max-new-tokens", "200"],
    ["generate", "--pte", "{cut}", "--prompt", "hi"],
    ["generate", "--pte", "{pte}"],
    ["export", "--model", "fixture", "--recipe", "fp32", "--out", "{tmp}"],
    ["nonsense"],
], ids=["context-overrun-after-runtime-start", "truncated-pte", "missing-prompt", "out-is-a-directory",
        "unknown-command"])
def test_process_stderr_is_one_line(pte_file, tmp_path, args):
    """What the runtime writes to stderr itself (its native log) does not reach the user."""
    data = Path(pte_file).read_bytes()
    (tmp_path / "cut.pte").write_bytes(data[: len(data) // 2])
    args = [a.format(pte=pte_file, cut=tmp_path / "cut.pte", tmp=tmp_path / "d.pte") for a in args]
    (tmp_path / "d.pte").mkdir()
    res = _cli_process(args)
    assert res.returncode == 2
    assert_clean(res.returncode, res.stderr.decode(), args)


# ---- damaged .pte files through the loader and the command, in a child with a timeout -------------
PTE_CHILD = textwrap.dedent("""
    import io, json, os, sys
    from harness.cli import main
    out_dir = sys.argv[1]
    results = []
    for i, path in enumerate(sys.argv[2:]):
        print(f"case {i}", flush=True)  # the parent attributes a crash or a hang to this case
        saved_fd = os.dup(2)
        with open(os.path.join(out_dir, f"{i}.err"), "wb") as f:
            os.dup2(f.fileno(), 2)  # native writes to fd 2 land in the case's file too
        saved, sys.stderr = sys.stderr, io.TextIOWrapper(os.fdopen(os.dup(2), "wb"), write_through=True)
        try:
            rc = main(["generate", "--pte", path, "--prompt", "What is the capital of France?",
                       "--max-new-tokens", "3"])
        except SystemExit as e:
            rc = e.code
        except BaseException as e:
            rc = f"escaped {type(e).__name__}: {e}"
        sys.stderr.flush()
        sys.stderr = saved
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        results.append(rc)
    print(json.dumps(results), flush=True)
""")

damage = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 0.9999)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 0.9999), st.integers(1, 255)), min_size=1,
                                        max_size=16)),
    st.tuples(st.just("random"), st.binary(min_size=0, max_size=4096)),
    st.tuples(st.just("et-header"), st.binary(min_size=0, max_size=4096)),
    st.tuples(st.just("zero-run"), st.tuples(st.floats(0, 0.9999), st.integers(1, 4096))),
)


def _damaged(good: bytes, kind: str, arg) -> bytes:
    if kind == "truncate":
        return good[: int(len(good) * arg)]
    if kind == "flip":
        data = bytearray(good)
        for where, xor in arg:
            data[int(len(good) * where)] ^= xor
        return bytes(data)
    if kind == "et-header":  # past the harness's header check, into the runtime's parser
        return b"\x00\x00\x00\x00ET12" + arg
    if kind == "zero-run":
        start = int(len(good) * arg[0])
        return good[:start] + bytes(min(arg[1], len(good) - start)) + good[start + arg[1]:]
    return arg


@settings(max_examples=examples(3))  # one child process per example, the cases run in it
@given(cases=st.lists(damage, min_size=8, max_size=16))
def test_damaged_pte_through_the_command(pte_file, tmp_path_factory, cases):
    good = Path(pte_file).read_bytes()
    folder = tmp_path_factory.mktemp("pte-fuzz")
    paths = []
    for i, (kind, arg) in enumerate(cases):
        (folder / f"case{i}.pte").write_bytes(_damaged(good, kind, arg))
        paths.append(str(folder / f"case{i}.pte"))
    child = subprocess.Popen([sys.executable, "-c", PTE_CHILD, str(folder), *paths], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=CHILD_ENV, start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        last = [l for l in stdout.splitlines() if l.startswith("case ")][-1:]
        pytest.fail(f"hang: no answer in 240 s, at {last} of {cases}")
    started = [l for l in stdout.splitlines() if l.startswith("case ")]
    assert child.returncode == 0, (
        f"the interpreter died (exit {child.returncode}) at {started[-1:]}: "
        f"{cases[int(started[-1].split()[1])] if started else cases}; {stderr[-1000:]}")
    results = json.loads(stdout.strip().splitlines()[-1])
    for i, (case, rc) in enumerate(zip(cases, results)):
        assert isinstance(rc, int), f"{case}: {rc}"
        err = (folder / f"{i}.err").read_text(errors="replace")
        if rc == 0:  # damage that the program survives (weights, padding): it ran and answered
            assert err == "", f"{case}: exit 0 with stderr {err!r}"
        else:
            assert_clean(rc, err, case)
