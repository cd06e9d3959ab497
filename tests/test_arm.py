"""The Pi 5's side of the fixture, in CI: the native runner cross-compiled for aarch64 against the
aarch64 executorch wheel (harness/runtimes/arm.py), run under qemu-user as a Cortex-A76 (the Pi 5's
CPU: XNNPACK's dot-product kernels) and as a Cortex-A72 (NEON without dot-product). It must be an
aarch64 program linking no libtorch, say every fixture token golden for every recipe, and give the
x86 runner's logits within the tolerance ``tolerances.py`` states for another ISA's kernels.

Where the cross compiler or qemu is missing these tests skip with the reason, and fail in CI
(``CI`` set): ``.ci/run`` installs both from Debian."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import FIXTURE_PROMPTS, require_arm_tools

pytestmark = pytest.mark.mac
RECIPES = ("fp32", "8da4w", "8da4w-fast")
CPUS = ("cortex-a76", "cortex-a72")


@pytest.fixture(scope="module")
def aarch64():
    require_arm_tools()
    from harness.runtimes.arm import aarch64_runner

    return aarch64_runner()


def long_prompt(p) -> list[int]:
    """Longer than the fixture's 16-slot sliding window."""
    ids = p.prompt_ids(FIXTURE_PROMPTS[0]) + p.prompt_ids(FIXTURE_PROMPTS[1])[1:] + p.prompt_ids(FIXTURE_PROMPTS[2])[1:]
    assert len(ids) > p.loaded.config.sliding_window
    return ids


def logits(runner: list[str], pte, ids):
    import torch

    cmd = [*runner, str(pte), "2", "--logits", json.dumps(ids)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return torch.tensor(got["logits"]).reshape(got["shape"])


def test_the_aarch64_runner_is_an_aarch64_program_linking_no_torch(aarch64):
    from harness.runtimes.arm import EM_AARCH64, elf_machine, needed_libraries

    assert elf_machine(aarch64) == EM_AARCH64
    needed = needed_libraries(aarch64)
    assert "libexecutorch.so" in needed, needed
    for lib in [aarch64, *(aarch64.parent / "lib").iterdir()]:  # what goes to the device with it
        assert elf_machine(lib) == EM_AARCH64, lib
        banned = [n for n in needed_libraries(lib) if n.startswith(("libtorch", "libc10", "libpython", "libcustom_ops"))]
        assert not banned, f"{lib.name} links {banned}"


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_aarch64_says_the_goldens(aarch64, pipeline, golden_tokens_for, recipe, cpu):
    """Every fixture prompt, greedy on the emulated CPU, equals the .pte goldens (no EOS stop: the
    golden's EOS must come where the golden has it)."""
    from harness.runtimes.native import NativeRuntime

    p = pipeline(recipe)
    runtime = NativeRuntime(p.pte_path, 2, runner=[*require_arm_tools(cpu), str(aarch64)])
    try:
        for prompt in FIXTURE_PROMPTS:
            golden = golden_tokens_for("8da4w" if recipe == "8da4w-fast" else recipe, "pte", prompt)
            ids = runtime.generate(p.prompt_ids(prompt), len(golden)).ids
            assert ids == golden, f"{recipe} on {cpu}: {ids} vs golden {golden} for {prompt!r}"
    finally:
        runtime.close()


_X86: dict = {}


def x86_logits(p, recipe):
    from harness.runtimes.native import native_runner

    if recipe not in _X86:
        _X86[recipe] = logits([str(native_runner())], p.pte_path, long_prompt(p))
    return _X86[recipe]


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_aarch64_logits_are_x86s_within_tolerance(aarch64, pipeline, recipe, cpu):
    """A prefill longer than the sliding window, every position's logits, against the x86 native
    runner on the same .pte: the same program, another ISA's XNNPACK kernels."""
    p = pipeline(recipe)
    arm = logits([*require_arm_tools(cpu), str(aarch64)], p.pte_path, long_prompt(p))
    problem = arm_problem(x86_logits(p, recipe), arm, recipe, cpu)
    assert problem is None, problem


def arm_problem(x86, arm, recipe: str, cpu: str) -> str | None:
    from harness.runtimes.arm import arm_logits_problem

    return arm_logits_problem(x86, arm, recipe, f"{recipe} x86_64 native", f"{recipe} aarch64 ({cpu}, qemu)",
                              f"a {arm.shape[1]}-token prefill")


def test_the_arm_comparison_catches_a_kernel_that_drifts(pipeline):
    """The regression it names: aarch64 logits off at one position by a whole logit (a kernel that
    rounds or accumulates differently) fail the comparison, and the message says where."""
    p = pipeline("8da4w")
    x86 = x86_logits(p, "8da4w")
    drifted = x86.clone()
    drifted[0, 7, 3] += 1.0
    problem = arm_problem(x86, drifted, "8da4w", "cortex-a76")
    assert problem is not None and "x86_64" in problem and "cortex-a76" in problem, problem
    assert arm_problem(x86, x86.clone(), "8da4w", "cortex-a76") is None


@pytest.mark.parametrize("ci, outcome", [("1", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_missing_arm_tools_fail_in_ci_and_skip_elsewhere(monkeypatch, ci, outcome):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("HARNESS_CROSS_CXX", raising=False)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="aarch64-linux-gnu-g\\+\\+"):
        require_arm_tools()
