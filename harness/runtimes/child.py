"""A child process that speaks JSON lines: the transport under ``ProcessRuntime`` and the native
runner, and ``run_json`` for a child that answers once."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

from harness.errors import HarnessError


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([repo_root(), os.environ.get("PYTHONPATH", "")]))


def run_json(cmd: list[str], what: str, stdin: str | None = None, timeout: float = 900) -> dict:
    """Run ``cmd``; its last stdout line as JSON, or one line naming ``what`` failed and the
    child's last error line."""
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=child_env())
    if out.returncode != 0:
        last = next((l for l in reversed(out.stderr.strip().splitlines()) if l.strip()), "no output")
        raise HarnessError(f"{what} failed ({last.strip()})", "run the same command by hand: " + " ".join(cmd[:5]) + " ...")
    return json.loads(out.stdout.strip().splitlines()[-1])


class LineProcess:
    """A child that says hello (one JSON line), then answers one JSON line per JSON line."""

    def __init__(self, cmd: list[str], label: str, timeout: float = 900):
        self.cmd, self.label, self.timeout = cmd, label, timeout
        # stderr to a file, not a pipe: a child that logs more than a pipe holds (ExecuTorch logs
        # to stderr) would block on a pipe nobody reads
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      text=True, bufsize=1, env=child_env())
        self.pid = self._proc.pid
        self.returncode = None
        self.hello = self.reply()

    def reply(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(timeout=self.timeout)
            self.returncode = self._proc.returncode
            self._stderr.seek(0)
            err = self._stderr.read().strip().splitlines()
            last = next((l for l in reversed(err) if l.strip()), "no output")
            raise HarnessError(f"{self.label}: its process ended (exit {self.returncode}: {last.strip()})",
                               "run it by hand: " + " ".join(self.cmd))
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return self.reply()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self.returncode = self._proc.returncode
        self._proc.stdout.close()
        self._stderr.close()

    def __del__(self):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()


class ChildRuntime:
    """What a runtime that lives in a child process shares (mixed into a ``Runtime``): the child
    started on ``cmd`` and its hello (``load_s``), its pid and return code, closing it, and the
    refusal of logits, which only cross the pipe as ids and timings."""

    owns_loop = True
    logits_fix = "open the runtime in this process for logits"

    def _start(self, cmd: list[str], label: str, timeout: float) -> None:
        self._child = LineProcess(cmd, label, timeout)
        self.pid = self._child.pid
        self.load_s = self._child.hello["load_s"]

    @property
    def returncode(self):
        return self._child.returncode

    def _no_logits(self, keep_prefill_logits: bool, keep_logits: bool) -> None:
        if keep_prefill_logits or keep_logits:
            raise HarnessError(f"{self.kind} in a process of its own returns ids and timings, not logits",
                               self.logits_fix)

    def close(self) -> None:
        self._child.close()
