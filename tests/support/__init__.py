"""What the tests share, imported as ``support`` (pytest.ini puts tests/ on the path): the
hypothesis profile's example scale, the golden prompts and recipes, the fixture's corpus, the
in-process CLI runner, and the bench tier's session state. Probes and reference loops that only
tests use live beside it (``support.attention_probe``, ``support.hf_loop``)."""

from __future__ import annotations

import contextlib
import io
import os

from harness.goldens.store import GOLDEN_PROMPTS
from harness.models.load import FIXTURE_DIR  # noqa: F401  (re-exported for the tests)
from harness.recipes import GOLDEN_RECIPES
from harness.training.fixture import read_corpus

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
# Tests size their example counts for the ci profile; dev runs 4x more, debug a quarter.
EXAMPLE_SCALE = {"ci": 1.0, "dev": 4.0, "debug": 0.25}.get(PROFILE, 1.0)
FIXTURE_PROMPTS = list(GOLDEN_PROMPTS)
RECIPE_NAMES = list(GOLDEN_RECIPES)  # recipes with goldens of their own
# the bench tiers' session state: runtimes that failed to build, bandwidth, idle power, throttling
BENCH_STATE: dict = {"failures": {}}


XDIST_NAMES = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def forget_inherited_worker(environ, pid: int) -> bool:
    """An xdist worker's environment names it (PYTEST_XDIST_WORKER), and every process it starts
    inherits that: a test's own pytest session (tests/test_snapshot_update.py) would take itself for
    a worker (syrupy publishes its report to a controller that is not there and prints no summary;
    the tolerance report and the fixture lowerings act as on a worker). The worker notes its pid in
    HARNESS_XDIST_WORKER_PID; a process that finds another pid there drops the names. True if it did."""
    if "PYTEST_XDIST_WORKER" not in environ:
        return False
    if environ.setdefault("HARNESS_XDIST_WORKER_PID", str(pid)) == str(pid):
        return False
    for name in XDIST_NAMES + ("HARNESS_XDIST_WORKER_PID",):
        environ.pop(name, None)
    return True


def tree_bytes(root) -> dict:
    """Every file below ``root`` (relative path -> bytes): to show that a command wrote nothing there."""
    from pathlib import Path

    root = Path(root)
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def skip_without_llama_cpp() -> None:
    """Skip, with the one-line reason and its fix, where llama-cpp-python is missing or is a build
    the harness refuses (tests/test_llamacpp.py's gate fails for it in CI)."""
    import pytest

    from harness.runtimes.llamacpp_setup import llama_cpp_import_problem

    if (problem := llama_cpp_import_problem()) is not None:
        pytest.skip(f"{problem} (with CI set, tests/test_llamacpp.py::test_llama_cpp_is_installed fails)")


def examples(n: int) -> int:
    return max(1, int(n * EXAMPLE_SCALE))


def corpus() -> list[dict]:
    return read_corpus()


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``harness.cli.main.main(argv)`` in this process: (exit code, stdout, stderr). The process's
    environment is restored afterwards: ``--goldens DIR`` sets HARNESS_GOLDENS_DIR for the command
    it runs, and it must not outlive it (it once pointed every later test at a missing directory)."""
    import os

    from harness.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse: usage errors and --help
            rc = e.code if isinstance(e.code, int) else 1
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return rc, out.getvalue(), err.getvalue()


def require_arm_tools(cpu: str = "cortex-a76") -> list[str]:
    """qemu's prefix for ``cpu``, after checking the aarch64 cross compiler is there too; where
    either is missing, fail in CI (``.ci/run`` installs both) and skip with the reason elsewhere."""
    import pytest

    from harness.errors import HarnessError
    from harness.runtimes.arm import cross_compiler, emulator

    try:
        cross_compiler()
        return emulator(cpu)
    except HarnessError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e}: CI must run the aarch64 checks (.ci/run installs the tools)")
        pytest.skip(str(e))
