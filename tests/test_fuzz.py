"""Fuzzing the command line and the .pte loader (hypothesis). Each case decides from its own input
whether that input is valid, and holds the command to the outcome that input calls for:

- valid input (a prompt with something besides whitespace that fits the context, a token count in
  range, the good ``.pte``, a tokenizer folder): exit 0, nothing on stderr and the expected answer:
  for ``generate --ids`` the golden for a golden prompt, else the ids the same ``.pte`` gives
  through the Python API (``Pipeline.generate``); for ``export``, the cached ``.pte`` byte for byte;
- invalid input: exit 2 and exactly one ``harness: error: <problem>; <fix>`` line on stderr;
- a damaged ``.pte``: that line, or, where it still loads, exactly the golden answer; another
  answer with exit 0 fails, naming the damage and the answer.

Never a traceback, a signal death or a hang. Every case goes through ``verdict`` (or, for a
damaged ``.pte``, ``damage_problems``); ``test_the_checks_*`` show them failing a ``generate`` that
refuses valid input, one that answers wrongly, and a damaged ``.pte`` that answered wrongly.

In-process runs (``harness.cli.main.main``, stderr captured) take the many random prompts, token counts
and paths; real ``python -m harness`` processes take what only a process shows (argv bytes that
are not UTF-8, what native code writes to file descriptor 2); damaged ``.pte`` files run in a
child process with a timeout, one stderr file per case at the file-descriptor level, so that a
segfault or a hang is caught and attributed to its case.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import Phase, assume, event, example, given, settings
from hypothesis import strategies as st

from support import examples, run_cli
from harness.errors import HarnessError
from harness.goldens.store import GOLDEN_PROMPTS, MAX_NEW_TOKENS, golden_ids
from harness.models.load import FIXTURE_DIR
from harness.recipes import RECIPES, golden_recipe

pytestmark = pytest.mark.mac

RECIPE = "fp32"  # every case runs this recipe's .pte (lowered once, then cached)
CHILD_ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONUTF8": "1"}  # argv bytes decode as UTF-8
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


# ---- the outcome each input calls for -------------------------------------------------------------
class Answer(NamedTuple):
    ids: list[int]
    text: str


def printed_answer(stdout: str) -> tuple[str, list[int] | None]:
    """What ``generate --ids`` printed: the text, then the ids on the last line."""
    text, _, last = stdout.rstrip("\n").rpartition("\n")
    try:
        ids = json.loads(last)
    except ValueError:
        return stdout, None
    return (text, ids) if isinstance(ids, list) else (stdout, None)


def refusal_problem(rc: int, stderr: str) -> str | None:
    """Why this is not a clean refusal: exit 2 and one ``harness: error: <problem>; <fix>`` line."""
    lines = stderr.splitlines()
    if len(lines) != 1:
        return f"exit {rc} with {len(lines)} lines on stderr: {stderr[-2000:]!r}"
    if not lines[0].startswith("harness: error: "):
        return f"exit {rc}, not a harness error: {lines[0]!r}"
    if "; " not in lines[0]:
        return f"exit {rc}, the line names no fix: {lines[0]!r}"
    if rc != 2:
        return f"exit {rc}, a user error exits 2: {lines[0]!r}"
    return None


def answer_problem(rc: int, stdout: str, stderr: str, want: Answer) -> str | None:
    """Why this is not exit 0, a quiet stderr and exactly the expected text and ids."""
    if rc != 0:
        return f"exit {rc}, expected {want.ids} {want.text!r}: {stderr.strip()[-500:]!r}"
    if stderr:
        return f"exit 0 with stderr {stderr[-2000:]!r}"
    text, ids = printed_answer(stdout)
    if ids != want.ids:
        return f"exit 0 and answered {ids} {text!r}, expected {want.ids} {want.text!r}"
    if text != want.text:
        return f"exit 0 and answered {text!r}, expected {want.text!r} (the ids {ids} as expected)"
    return None


def verdict(rc: int, stdout: str, stderr: str, want: Answer | None) -> str | None:
    """None when the outcome is right for the input: ``want`` for valid input, None for invalid."""
    return refusal_problem(rc, stderr) if want is None else answer_problem(rc, stdout, stderr, want)


def assert_outcome(rc: int, stdout: str, stderr: str, want: Answer | None, what) -> None:
    problem = verdict(rc, stdout, stderr, want)
    assert problem is None, f"{what}: {'in' if want is None else ''}valid input: {problem}"


# ---- what makes input valid ---------------------------------------------------------------------
def whole_number(text: str) -> int | None:
    """``--max-new-tokens``: what ``int`` reads as a whole number (sign, spaces, any script's digits)."""
    try:
        return int(text)
    except ValueError:
        return None


def usable_prompt(prompt: str) -> bool:
    """Text (no lone surrogates, which undecodable argv bytes become) with more than whitespace."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return bool(prompt.strip())


def fits(prompt_tokens: int, new_tokens: int, max_context: int) -> bool:
    """Prefill takes at most ``max_context - 1`` tokens; every new token but the last is fed back."""
    return prompt_tokens <= max_context - 1 and prompt_tokens + new_tokens - 1 <= max_context


def golden_answer(prompt: str, n: int) -> list[int] | None:
    """The committed answer to ``n`` new tokens where the golden decides it: its first ``n`` ids,
    or all of them when it stopped at EOS before ``MAX_NEW_TOKENS``."""
    if prompt not in GOLDEN_PROMPTS:
        return None
    golden = golden_ids(golden_recipe(RECIPE), "pte", prompt)
    return golden[:n] if n <= len(golden) or len(golden) < MAX_NEW_TOKENS else None


def same_path(text: str, target: Path) -> bool:
    """``text``, read as the harness reads a path, names ``target`` (a symlink to it included)."""
    try:
        return os.path.samefile(Path(text), target)
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="module")
def pte_file(pipeline) -> str:
    return str(pipeline(RECIPE).pte_path)


@pytest.fixture(scope="module")
def expected(pipeline):
    """``expected(prompt, count="9")``: the Answer that valid input must give, None for invalid
    input. A golden prompt's is its golden; any other is what the .pte says through the Python API."""
    pipe = pipeline(RECIPE)
    memo: dict = {}

    def want(prompt: str, count: str = "9") -> Answer | None:
        n = whole_number(count)
        if n is None or n < 1 or not usable_prompt(prompt):
            return None
        if not fits(len(pipe.prompt_ids(prompt)), n, pipe.settings.max_context):
            return None
        if (prompt, n) not in memo:
            ids = golden_answer(prompt, n)
            if ids is None:
                ids = pipe.generate(prompt, stage="pte", max_new_tokens=n).ids
            memo[prompt, n] = Answer(ids, pipe.decode(ids))
        return memo[prompt, n]

    return want


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
@example(prompt="Who wrote Hamlet?", n="4")  # a golden prompt, cut short
@example(prompt=" café 🙂 ", n="+12")  # not a golden prompt: what the Python API says
def test_generate_with_random_prompts_and_counts(pte_file, expected, prompt, n):
    want = expected(prompt, n)
    event("valid input" if want is not None else "invalid input")  # --hypothesis-show-statistics
    rc, out, err = run_cli(["generate", "--pte", pte_file, f"--prompt={prompt}", f"--max-new-tokens={n}", "--ids"])
    assert_outcome(rc, out, err, want, (prompt[:80], n))


# ---- paths, in-process ---------------------------------------------------------------------------
path_text = st.one_of(
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=30),
    st.sampled_from(["", ".", "..", "/", "//", "~", "-", "x.pte", "dir.pte", "dir.pte/", "a/b/c.pte",
                     "n" * 300 + ".pte", "/".join(["d"] * 200) + "/m.pte", "/proc/self/mem",
                     "/dev/null", "/nonexistent/m.pte", "empty.pte", "notes.pte", "tokdir", "garbagetok",
                     "good.pte", "goodtok"]),
)
# Paths that name the right thing for one command or another (the good .pte and tokenizer that _arena
# holds, a new FILE.pte to export to), drawn half the time so that valid input is common.
good_paths = st.sampled_from(["good.pte", "./good.pte", "goodtok", "./goodtok/", "goodtok/.", "x.pte", "ü .pte"])


def _arena(root: Path, pte_file: str | None = None) -> Path:
    """A folder with the shapes of things a path can hit: wrong ones and, given ``pte_file``, a
    link to the good .pte and a copy of the fixture's tokenizer (right ones)."""
    (root / "dir.pte").mkdir(exist_ok=True)
    (root / "empty.pte").write_bytes(b"")
    (root / "notes.pte").write_text("not a program\n")
    (root / "tokdir").mkdir(exist_ok=True)
    (root / "garbagetok").mkdir(exist_ok=True)
    (root / "garbagetok" / "tokenizer.json").write_bytes(b"\x00{not json")
    if pte_file is None:
        return root
    (root / "good.pte").symlink_to(pte_file)
    (root / "goodtok").mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(FIXTURE_DIR / name, root / "goodtok" / name)
    return root


def _under(root: Path, text: str) -> str:
    """Relative text goes under ``root``; absolute text stays (only ever read, or refused)."""
    return text if text.startswith("/") else str(root / text)


def _good_tokenizer(text: str, root: Path) -> bool:
    return text == "fixture" or any(same_path(text, d) for d in (FIXTURE_DIR, root / "goodtok"))


@settings(max_examples=examples(25))
@given(pte=st.one_of(good_paths, path_text), tok=st.one_of(good_paths, path_text),
       which=st.sampled_from(["pte", "tokenizer", "both"]))
@example(pte="good.pte", tok="./goodtok/", which="both")
def test_generate_with_random_paths(pte_file, expected, tmp_path_factory, pte, tok, which):
    root = _arena(tmp_path_factory.mktemp("paths"), pte_file)
    pte_arg = pte_file if which == "tokenizer" else _under(root, pte)
    tok_arg = "fixture" if which == "pte" else _under(root, tok)
    valid = same_path(pte_arg, Path(pte_file)) and _good_tokenizer(tok_arg, root)
    event("valid input" if valid else "invalid input")
    rc, out, err = run_cli(["generate", f"--pte={pte_arg}", f"--tokenizer={tok_arg}", "--prompt=hi", "--ids"])
    assert_outcome(rc, out, err, expected("hi") if valid else None, (pte_arg[:200], tok_arg[:200]))


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long
        return False


def _export_valid(model: str, recipe: str, out: Path) -> bool:
    """The fixture, a recipe by its exact name, and an ``--out`` FILE.pte (a name the file system
    takes) in a folder that exists, which is not a folder itself."""
    name_fits = len(os.fsencode(out.name)) <= 255
    return (model == "fixture" and recipe in RECIPES and out.suffix == ".pte" and name_fits
            and _is_dir(out.parent) and not _is_dir(out))


def export_problem(rc: int, stderr: str, out: Path, want: bytes) -> str | None:
    """Why a valid export did not exit 0 quietly with the cached .pte, byte for byte, at ``out``."""
    if rc != 0:
        return f"exit {rc}: {stderr.strip()[-500:]!r}"
    if stderr:
        return f"exit 0 with stderr {stderr[-2000:]!r}"
    got = out.read_bytes() if out.is_file() else b""
    if got != want:
        return (f"exit 0 but {out} holds {len(got)} bytes (sha256 {hashlib.sha256(got).hexdigest()[:12]}), "
                f"not the .pte's {len(want)} (sha256 {hashlib.sha256(want).hexdigest()[:12]})")
    return None


@settings(max_examples=examples(15))
@given(out=st.one_of(good_paths, path_text),
       recipe=st.one_of(st.just("fp32"), st.sampled_from(["int3", "", "FP32", "fp32 ", "8da4w-fast "])),
       model=st.one_of(st.just("fixture"), st.sampled_from(["/nonexistent", "tokdir", "notes.pte", "garbagetok",
                                                            "cfg.json"])))
@example(out="notes.pte", recipe="fp32", model="fixture")  # valid: overwrites a file
def test_export_with_random_paths(pte_file, tmp_path_factory, out, recipe, model):
    """Export writes, so every relative --out stays inside a temp folder; with the cached fixture
    .pte an export that succeeds takes seconds."""
    assume(not out.startswith("/") or out in ("/nonexistent/m.pte", "/dev/null", "/proc/self/mem", "/"))
    root = _arena(tmp_path_factory.mktemp("export"))  # no link into the cache to write through
    (root / "cfg.json").write_text('{"vocab_size": "many"}')
    model_arg = model if model in ("fixture", "/nonexistent") else str(root / model)
    out_path = Path(_under(root, out))
    valid = _export_valid(model_arg, recipe, out_path)
    event("valid input" if valid else "invalid input")
    rc, stdout, err = run_cli(["export", f"--model={model_arg}", f"--recipe={recipe}", f"--out={out_path}"])
    what = (out[:200], recipe, model)
    if valid:
        problem = export_problem(rc, err, out_path, Path(pte_file).read_bytes())
        assert problem is None, f"{what}: valid input: {problem}"
    else:
        assert_outcome(rc, stdout, err, None, what)


# ---- real processes: argv bytes, file descriptor 2 ------------------------------------------------
def _cli_process(args: list, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, env=CHILD_ENV,
                          timeout=timeout)


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@settings(max_examples=examples(1))  # a process each, ~10 s: one drawn, one valid below
@given(prompt=st.one_of(st.binary(min_size=1, max_size=40).filter(lambda b: b"\x00" not in b),
                        st.sampled_from([b"\xff\xfe", b"caf\xe9", b"caf\xc3\xa9", b"   ", b"x" * 3000])),
       n=st.sampled_from([b"0", b"-1", b"nine", b"100000", b"3"]))
@example(prompt=b"caf\xc3\xa9 \xf0\x9f\x99\x82", n=b"3")  # valid UTF-8 bytes: the Python API's answer
def test_generate_process_with_raw_argv_bytes(pte_file, expected, prompt, n):
    res = _cli_process([b"generate", b"--pte", pte_file.encode(), b"--prompt=" + prompt,
                        b"--max-new-tokens=" + n, b"--ids"])
    assert res.returncode >= 0, f"killed by signal {-res.returncode}"
    text = _utf8(prompt)
    want = None if text is None else expected(text, n.decode())
    event("valid input" if want is not None else "invalid input")
    assert_outcome(res.returncode, res.stdout.decode("utf-8", "replace"), res.stderr.decode("utf-8", "replace"),
                   want, (prompt, n))


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
    assert_outcome(res.returncode, res.stdout.decode(), res.stderr.decode(), None, args)


# ---- damaged .pte files through the loader and the command, in a child with a timeout -------------
PTE_CHILD = textwrap.dedent("""
    import contextlib, io, json, os, sys
    from harness.cli.main import main
    out_dir, new_tokens, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    results = []
    for i, (path, prompt) in enumerate(cases):
        print(f"case {i}", flush=True)  # the parent attributes a crash or a hang to this case
        saved_fd = os.dup(2)
        with open(os.path.join(out_dir, f"{i}.err"), "wb") as f:
            os.dup2(f.fileno(), 2)  # native writes to fd 2 land in the case's file too
        saved, sys.stderr = sys.stderr, io.TextIOWrapper(os.fdopen(os.dup(2), "wb"), write_through=True)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                rc = main(["generate", "--pte", path, "--prompt", prompt, "--max-new-tokens", new_tokens, "--ids"])
        except SystemExit as e:
            rc = e.code
        except BaseException as e:
            rc = f"escaped {type(e).__name__}: {e}"
        sys.stderr.flush()
        sys.stderr = saved
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        results.append([rc, out.getvalue()])
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


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def damage_problems(cases: list, results: list, errs: list[str], goldens: dict[str, Answer]) -> list[str]:
    """Each damaged case whose outcome is wrong: a clean refusal is right, and so is exit 0 with
    exactly the golden answer (damage the program survives: padding, a weight that moves no
    argmax); anything else, another answer with exit 0 first of all, is named with its damage."""
    problems = []
    for i, (((kind, arg), prompt), (rc, stdout), err) in enumerate(zip(cases, results, errs)):
        if not isinstance(rc, int):
            problem = f"no exit code: {rc}"
        elif rc == 0:
            problem = answer_problem(rc, stdout, err, goldens[prompt])
        else:
            problem = refusal_problem(rc, err)
        if problem:
            problems.append(f"case{i}.pte, {kind} {_short(arg)}, on {prompt!r}: {problem}")
    return problems


@pytest.fixture(scope="module")
def goldens(pipeline) -> dict[str, Answer]:
    """The golden .pte answer to each golden prompt (``MAX_NEW_TOKENS`` new tokens)."""
    pipe = pipeline(RECIPE)
    answers = {p: golden_ids(golden_recipe(RECIPE), "pte", p) for p in GOLDEN_PROMPTS}
    return {p: Answer(ids, pipe.decode(ids)) for p, ids in answers.items()}


# One child process per example (~10 s to start, well under 1 s a case): few examples of many cases,
# and no shrinking (the failure already names every bad case).
@settings(max_examples=examples(2), phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(cases=st.lists(st.tuples(damage, st.sampled_from(GOLDEN_PROMPTS)), min_size=12, max_size=24))
def test_damaged_pte_through_the_command(pte_file, goldens, tmp_path_factory, cases):
    good = Path(pte_file).read_bytes()
    folder = tmp_path_factory.mktemp("pte-fuzz")
    runs = []
    for i, ((kind, arg), prompt) in enumerate(cases):
        (folder / f"case{i}.pte").write_bytes(_damaged(good, kind, arg))
        runs.append([str(folder / f"case{i}.pte"), prompt])
    child = subprocess.Popen([sys.executable, "-c", PTE_CHILD, str(folder), str(MAX_NEW_TOKENS), json.dumps(runs)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CHILD_ENV,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        last = [l for l in stdout.splitlines() if l.startswith("case ")][-1:]
        pytest.fail(f"hang: no answer in 240 s, at {last} of {cases}")
    started = [int(l.split()[1]) for l in stdout.splitlines() if l.startswith("case ")]
    if child.returncode != 0 and started:  # what it wrote last went to that case's stderr file
        last = started[-1]
        err = (folder / f"{last}.err").read_text(errors="replace")
        pytest.fail(f"the interpreter died (exit {child.returncode}) at case{last}.pte, {cases[last]}: "
                    f"{err[-1000:]!r} {stderr[-1000:]!r}")
    assert child.returncode == 0, f"the interpreter died (exit {child.returncode}) before a case: {stderr[-1000:]}"
    results = json.loads(stdout.strip().splitlines()[-1])
    errs = [(folder / f"{i}.err").read_text(errors="replace") for i in range(len(cases))]
    problems = damage_problems(cases, results, errs, goldens)
    assert not problems, (f"{len(problems)} of {len(cases)} damaged .pte files (kept in {folder}):\n"
                          + "\n".join(problems))


# ---- the checks can fail ---------------------------------------------------------------------------
def _golden_argv(pte_file: str) -> list[str]:
    return ["generate", "--pte", pte_file, f"--prompt={GOLDEN_PROMPTS[0]}", "--ids"]


def test_the_checks_fail_a_generate_that_refuses_valid_input(pte_file, expected, monkeypatch):
    """A generate that always gives a clean one-line error passed the old check; valid input
    must be answered, so the verdict fails it."""
    import harness.cli.main

    want = expected(GOLDEN_PROMPTS[0])
    assert verdict(*run_cli(_golden_argv(pte_file)), want) is None, "the real generate fails its own check"

    def refuse(args):
        raise HarnessError("the runtime is busy", "try again")

    monkeypatch.setattr(harness.cli.main, "cmd_generate", refuse)
    rc, out, err = run_cli(_golden_argv(pte_file))
    assert refusal_problem(rc, err) is None, f"not the clean one-line refusal this is about: exit {rc}, {err!r}"
    problem = verdict(rc, out, err, want)
    assert problem is not None and problem.startswith("exit 2, expected"), f"refusing valid input passed: {problem}"


def test_the_checks_fail_a_generate_that_answers_wrongly(pte_file, expected, monkeypatch):
    """A generate that drops the last token exits 0 quietly; the verdict names both answers."""
    import harness.runtimes.base

    real = harness.runtimes.base.greedy

    def one_short(*args, **kw):
        gen = real(*args, **kw)
        gen.ids = gen.ids[:-1]
        return gen

    monkeypatch.setattr(harness.runtimes.base, "greedy", one_short)
    want = expected(GOLDEN_PROMPTS[0])
    rc, out, err = run_cli(_golden_argv(pte_file))
    assert (rc, err) == (0, ""), f"exit {rc}, {err!r}"
    problem = verdict(rc, out, err, want)
    assert problem is not None and f"answered {want.ids[:-1]}" in problem and str(want.ids) in problem, problem


def test_the_checks_fail_a_damaged_pte_that_answers_wrongly(goldens):
    """Of three damaged files, one refused cleanly, one that still said the golden and one that
    said something else with exit 0: only the last is a problem, named with its damage and answer."""
    prompt = GOLDEN_PROMPTS[0]
    golden = goldens[prompt]
    wrong = golden.ids[:2] + golden.ids[3:]
    cases = [(("zero-run", (0.2, 64)), prompt), (("truncate", 0.5), prompt), (("flip", [(0.61, 128)]), prompt)]
    results = [[0, f"{golden.text}\n{golden.ids}\n"], [2, ""], [0, f"whatever\n{wrong}\n"]]
    refused = "harness: error: case1.pte is a damaged or incompatible .pte (x); re-export it with: harness export\n"
    errs = ["", refused, ""]
    problems = damage_problems(cases, results, errs, goldens)
    assert len(problems) == 1, problems
    assert problems[0].startswith("case2.pte, flip [(0.61, 128)], on "), problems[0]
    assert f"answered {wrong}" in problems[0] and str(golden.ids) in problems[0], problems[0]
