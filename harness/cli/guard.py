"""What keeps every failed command to one line on stderr: library chatter silenced (unless
``--debug``), argparse errors on one line, file-system errors and unexpected exceptions turned
into a ``harness: error: <problem>; <fix>`` line instead of a traceback.

The libraries this harness imports talk on stderr at import and run time: torchao logs two
"Failed to load ..." lines for CUDA kernels a CPU machine lacks, torch warns about an Enum
registration, transformers draws a "Loading weights" bar, and ExecuTorch's runtime prints its
native log (``[cpuinfo_utils.cpp:71] Reading file ...``, ``[program.cpp:114] File size is too
small ...``) through Python's ``sys.stderr``. None of it tells the user what to do; the harness's
own error line does. ``--debug`` shows all of it, and the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import logging
import os
import re
import sys
import warnings
from pathlib import Path

from harness.errors import HarnessError

# ExecuTorch's native log, as its Python bindings print it: "[file.cpp:123] message".
NATIVE_LOG_LINE = re.compile(r"^\[[\w./+-]+\.(?:c|cc|cpp|cxx|h|hpp):\d+\] ")
_QUIET_LOGGERS = ("torchao", "torch.utils._pytree", "transformers", "executorch", "root")


@contextlib.contextmanager
def quiet_libraries(debug: bool = False):
    """Silence library chatter on stderr while a command runs (restored afterwards, so that
    calling ``harness.cli.main.main`` in-process leaves the caller's stderr and warnings alone)."""
    if debug:
        yield
        return
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    loggers = [logging.getLogger(None if name == "root" else name) for name in _QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    saved = sys.stderr
    sys.stderr = NativeLogFilter(saved)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if isinstance(sys.stderr, NativeLogFilter):
            sys.stderr.close_pending()
        sys.stderr = saved
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def run_main(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse, then run the subcommand quietly and guarded (see ``run_guarded``)."""
    args = parser.parse_args(argv)
    with quiet_libraries(args.debug):
        return run_guarded(args.func, args, args.debug)


class NativeLogFilter(io.TextIOBase):
    """A stderr wrapper that drops ExecuTorch's native log lines and passes everything else.

    The bindings print a log line in pieces (``[``, ``file.cpp``, ``:``, ``71``, ``] ``, text,
    newline), so text is held until a newline completes the line."""

    def __init__(self, inner):
        self.inner = inner
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if not NATIVE_LOG_LINE.match(line):
                self.inner.write(line + "\n")
        if self._pending and not "[".startswith(self._pending[:1]):
            # not the start of a native log line: no need to hold it back
            self.inner.write(self._pending)
            self._pending = ""
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def close_pending(self) -> bool:
        """Write out an unfinished line (unless it is native log); True if something was written."""
        wrote = bool(self._pending) and not NATIVE_LOG_LINE.match(self._pending)
        if wrote:
            self.inner.write(self._pending)
        self._pending = ""
        self.inner.flush()
        return wrote

    def fileno(self) -> int:
        return self.inner.fileno()

    def isatty(self) -> bool:
        return self.inner.isatty()

    @property
    def encoding(self):
        return getattr(self.inner, "encoding", "utf-8")


def one_line(text: str) -> str:
    """``text`` with every character that could break the line or garble the terminal (control
    characters, Unicode line separators, lone surrogates) written as an escape, e.g. ``\\x85``:
    a path or a prompt can hold any of them."""
    out = []
    for ch in text:
        if ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
    return "".join(out)


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``harness: error:`` line (exit 2), not usage + error."""

    def error(self, message: str):
        self.exit(2, f"harness: error: {one_line(message)}; see: {self.prog} --help\n")


def at_least(minimum: int):
    """An argparse type: a whole number >= ``minimum`` (a usage error, one line, otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    parse.__name__ = f"whole number >= {minimum}"
    return parse


def check_prompt(prompt: str) -> str:
    """A prompt the tokenizer can take: valid Unicode (bytes that were not UTF-8 reach Python as
    lone surrogates, on which the tokenizer raises a TypeError) and not blank."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise HarnessError(
            f"the prompt is not valid UTF-8 text (undecodable character at position {e.start})",
            "pass the prompt as UTF-8 (check the terminal's or the file's encoding)",
        ) from None
    if not prompt.strip():
        raise HarnessError("empty prompt", "pass a non-empty --prompt")
    return prompt


def check_pte_path(text: str) -> Path:
    """A --pte that names a directory gets said so (the loader would call it missing)."""
    path = Path(text)
    if path.is_dir():
        raise HarnessError(f"--pte {path} is a directory", "pass the .pte file itself")
    return path


_OS_FIXES = {
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EDQUOT: "free some space or write elsewhere",
    errno.EACCES: "choose a path you may write to",
    errno.EPERM: "choose a path you may write to",
    errno.EROFS: "choose a path on a writable file system",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EISDIR: "name a file, not a directory",
    errno.ENOTDIR: "check the path: a part of it is a file, not a directory",
    errno.ENOENT: "check the path",
}


def os_error_line(e: OSError) -> str:
    where = f" {e.filename}" if getattr(e, "filename", None) else ""
    what = e.strerror or type(e).__name__
    return f"{what}:{where}; {_OS_FIXES.get(e.errno, 'check the path, its permissions and free space')}"


def progress(msg: str) -> None:
    """A command's progress line, on stderr (stdout holds its result)."""
    print(f"[harness] {msg}", file=sys.stderr, flush=True)


def verdict(func):
    """Mark a command whose exit codes 0 and 1 are verdicts (``goldens diff``: 0 nothing changed,
    1 something did; ``goldens update``: 0 written, 1 refused; ``verify``: 0 all equal, 1 not):
    every error, internal ones included, then exits 2, so that a crash never reads as a verdict."""
    func.verdict = True
    return func


def run_guarded(func, args, debug: bool) -> int:
    """Run a subcommand: ``harness: error: ...`` (exit 2) for anything the user can fix, one line
    for anything else (exit 1, or 2 for a ``verdict`` command, whose 1 means a verdict); the
    traceback only with ``--debug``."""
    try:
        return func(args)
    except HarnessError as e:
        if debug:
            raise
        _say(f"harness: error: {e}")
        return 2
    except KeyboardInterrupt:
        _say("harness: interrupted; nothing was left half-written")
        return 130
    except OSError as e:
        if debug:
            raise
        _say(f"harness: error: {os_error_line(e)}")
        return 2
    except MemoryError:
        if debug:
            raise
        _say("harness: error: out of memory; close other programs, or run on a machine with more "
             "memory (harness doctor shows the estimate)")
        return 2
    except Exception as e:  # a bug: still one line, and how to see more
        if debug:
            raise
        first = (str(e).splitlines() or [""])[0][:200]
        _say(f"harness: internal error: {type(e).__name__}: {first}; rerun with --debug for the "
             "traceback and report it")
        return 2 if getattr(func, "verdict", False) else 1


def _say(line: str) -> None:
    line = one_line(line)
    err = sys.stderr
    if isinstance(err, NativeLogFilter) and err.close_pending():
        err.inner.write("\n")  # never glue the error onto an unfinished line
    print(line, file=err, flush=True)
