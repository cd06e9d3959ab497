"""Pi 5 tier: the goldens and the benchmark protocol on the device, from a bundle built on a
workstation (``harness bench bundle DIR``). On the device it needs Python with pytest and
pytest-benchmark and nothing else: the bundle's own native runner runs every ``.pte`` (no torch, no
executorch, no transformers). The rows that need executorch's Python runtime, its C++ LLM runner
or llama-cpp-python skip with the reason where those are not installed.

    pytest -m pi5 tests/test_pi5.py --pi5-bundle ~/bundle --benchmark-json pi5.json

Elsewhere these tests skip with the reason; ``--pi5-force`` runs them anyway as a dry run, and
``--pi5-emulate cortex-a76`` runs the bundle's aarch64 runner under qemu-user on an x86 host: the
goldens exactly, the logits against the host's within ``arm_vs_x86/RECIPE``, and the benchmark
protocol on the fixture, every rate marked emulated (never a Pi figure).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

from harness.bench import device
from harness.runtimes.base import RuntimeSpec

pytestmark = pytest.mark.pi5
RECIPES = ("fp32", "8da4w", "8da4w-fast")
EMULATED_NEW_TOKENS = 16  # the fixture under qemu: 10-30 ms a token


@pytest.fixture(scope="module")
def bundle(request):
    from support import BENCH_STATE

    if not (device.is_pi5() or request.config.getoption("--pi5-force")):
        board = device.board_model() or "no /proc/device-tree/model"
        pytest.skip(f"not a Raspberry Pi 5 ({board}); run on the Pi, or pass --pi5-force for a dry run")
    where = request.config.getoption("--pi5-bundle")
    if not where:
        pytest.skip("no bundle: build one with `harness bench bundle DIR` on a workstation, copy it here, "
                    "and pass --pi5-bundle DIR (or set HARNESS_PI5_BUNDLE)")
    from harness.bench.bundle import read_manifest

    manifest = read_manifest(Path(where))
    BENCH_STATE["bundle"] = {"runner": {k: manifest["runner"].get(k) for k in ("arch", "sha256", "compiler", "linked")},
                             "checked": manifest.get("checked"), "created": manifest.get("created")}
    return Path(where), manifest


@pytest.fixture(scope="module")
def emulated(request) -> str | None:
    """The CPU qemu emulates (``--pi5-emulate CPU``), or None on the device."""
    from support import BENCH_STATE

    cpu = request.config.getoption("--pi5-emulate")
    BENCH_STATE["emulated"] = cpu
    return cpu


@pytest.fixture(scope="module")
def runner(bundle, emulated, request) -> list[str]:
    """How to start the bundle's native runner here: itself on the device, behind qemu's prefix
    under ``--pi5-emulate``."""
    from harness.errors import HarnessError
    from harness.runtimes.arm import runner_prefix

    from support import BENCH_STATE

    root, manifest = bundle
    try:
        prefix = runner_prefix(manifest["runner"]["arch"], root / manifest["runner"]["path"], emulated,
                               request.config.getoption("--pi5-qemu"))
    except HarnessError as e:  # the same for every test: say it once, and stop
        pytest.exit(f"error: {e}", returncode=4)
    if not emulated:
        BENCH_STATE["runner_command"] = prefix  # its read loop gives the roofline's bandwidth
    return prefix


def python_runtime_row(emulated: str | None, module: str, what: str) -> None:
    """Rows through executorch's Python package: optional on the device, and not emulated (they
    would run this host's kernels)."""
    if emulated:
        pytest.skip(f"{what}: under --pi5-emulate only the bundle's runner is emulated; executorch's Python "
                    "package would run this host's kernels")
    pytest.importorskip(module, reason=f"{what} needs executorch's Python package, not installed here "
                                       "(optional on the device: the native runner checks the same goldens)")


def test_pi5_goldens_native_runner(bundle, runner):
    """Every bundled fixture .pte says its goldens through the bundle's torch-free native runner
    (no EOS stop, so each golden's EOS must come where it is)."""
    from harness.bench.bundle import native_golden_problems

    root, manifest = bundle
    problems = native_golden_problems(root, manifest, runner)
    assert not problems, "\n".join(problems)


def test_pi5_logits_native_runner(bundle, runner, emulated):
    """A prefill longer than the sliding window: every position's logits against the workstation's
    x86 native runner on the same .pte, within ``arm_vs_x86/RECIPE`` (another ISA's kernels)."""
    import json

    from harness.runtimes.arm import arm_logits_problem
    from harness.runtimes.native import prompt_logits

    root, manifest = bundle
    fx = manifest.get("fixture")
    if not fx:
        pytest.skip(f"a model bundle ({manifest['model']['id']}): the prefill-logits check is the fixture's "
                    "(a 262,144-token vocabulary's logits over a long prefill would be gigabytes)")
    host = json.loads((root / fx["logits"]).read_text())
    where = emulated and f"qemu {emulated}" or device.board_model() or "this machine"
    for recipe, name in fx["pte"].items():
        got = prompt_logits(root / name, host["ids"], 2, runner)
        problem = arm_logits_problem(host["recipes"][recipe], got, recipe, f"{recipe} workstation x86_64",
                                     f"{recipe} {manifest['runner']['arch']} ({where})",
                                     f"a {len(host['ids'])}-token prefill")
        assert problem is None, problem


def test_pi5_goldens_python_runtime(bundle, emulated):
    """The same through ExecuTorch's Python runtime, where it is installed."""
    python_runtime_row(emulated, "executorch.runtime", "the Python-runtime goldens")
    from harness.runtimes.base import greedy
    from harness.runtimes.executorch import PteRuntime

    from harness.bench.bundle import golden_sets

    root, manifest = bundle
    for g in golden_sets(manifest):
        runtime = PteRuntime(root / g["pte"])
        for p in g["prompts"]:
            gen = greedy(runtime.step, p["ids"], g["max_new_tokens"], eos_ids=frozenset(g["eos_ids"]))
            assert gen.ids == p["golden"], f"{g['label']} {p['prompt']!r}: {gen.ids} != golden {p['golden']}"


def test_pi5_goldens_llm_runner(bundle, emulated):
    """The same through ExecuTorch's C++ LLM runner with its own tokenizer, where it is installed."""
    python_runtime_row(emulated, "executorch.extension.llm.runner", "the LLM-runner goldens")
    from harness.runtimes.llm_runner import TextLLMRuntime

    from harness.bench.bundle import golden_sets

    root, manifest = bundle
    for g in golden_sets(manifest):
        runtime = TextLLMRuntime(root / g["pte"], root / g["tokenizer"])
        for p in g["prompts"]:
            out = runtime.generate_text(p["templated"], g["max_new_tokens"])
            assert out.ids == p["golden"], f"{g['label']} {p['prompt']!r}: runner {out.ids} != golden"


@pytest.fixture(scope="module")
def board_state(bundle, emulated, request):
    """Governor and throttling before measuring; the idle draw as the energy baseline (not under
    emulation: the host's draw is not the board's)."""
    from support import BENCH_STATE

    governor = device.cpu_governor()
    if governor != "performance" and not emulated:
        warnings.warn(f"CPU governor is {governor!r}, not 'performance': figures will vary "
                      "(echo performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor)")
    BENCH_STATE["throttled_before"] = device.throttled()
    power = None if emulated else device.power_source(request.config.getoption("--power-meter-cmd"))
    if power:
        with device.PowerSampler(power) as idle:
            time.sleep(3.0)
        BENCH_STATE["idle_w"] = idle.mean_watts
    return {"governor": governor, "power": power}


def _bench_runtimes() -> list[str]:
    from harness.bench.protocol import NATIVE

    return ([f"{NATIVE}:{r}" for r in RECIPES] + [f"executorch:{r}" for r in RECIPES]
            + ["llama.cpp:f32", "llama.cpp:q4_0"])


def bench_case(root: Path, manifest: dict, runtime: str, emulated: str | None) -> tuple[str, Path, dict]:
    """(model, artifact, the model's section) for a benchmark row: the benchmark model on the
    device, the fixture under emulation (the benchmark model would take hours under qemu)."""
    kind, recipe = RuntimeSpec.parse(runtime)
    if kind == "llama.cpp":
        if emulated:
            pytest.skip("llama.cpp: under --pi5-emulate only the bundle's runner is emulated")
        pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed on this device "
                                                "(docs/device.md: 'llama.cpp on the device')")
    elif kind != "executorch-native":
        python_runtime_row(emulated, "executorch.runtime", f"{runtime}")
    m = manifest.get("model")
    if m:  # a model bundle: the user's own .pte, on the device and under emulation alike
        if kind == "llama.cpp" or recipe != m["recipe"]:
            pytest.skip(f"a model bundle ({m['id']}) holds only its {m['recipe']} .pte")
        section = {"prompts": [p["ids"] for p in m["prompts"]], "bytes_per_token": {}, "host_ids": {},
                   "new_tokens": EMULATED_NEW_TOKENS if emulated else m["max_new_tokens"]}
        return m["id"], root / m["pte"], section
    if emulated:
        fx = manifest["fixture"]
        section = {"prompts": [p["ids"] for p in fx["prompts"]], "new_tokens": EMULATED_NEW_TOKENS,
                   "bytes_per_token": {}, "host_ids": {}}
        if recipe not in fx["pte"]:
            pytest.skip(f"the bundle has no fixture {recipe} .pte (built with --recipe)")
        return "fixture", root / fx["pte"][recipe], section
    b = manifest.get("bench")
    if not b:
        pytest.skip("the bundle has no benchmark model (built with --fixture-only): rebuild it without")
    if kind == "llama.cpp":
        if recipe not in b["gguf"]:
            pytest.skip(f"the bundle has no {recipe} GGUF: {b['errors'].get(runtime, 'built with --no-gguf')}")
        return "bench", root / b["gguf"][recipe], b
    if recipe not in b["pte"]:
        pytest.skip(f"the bundle has no {recipe} .pte (built with --recipe)")
    return "bench", root / b["pte"][recipe], b


@pytest.mark.parametrize("runtime", _bench_runtimes())
def test_pi5_benchmark(benchmark, runtime, bundle, emulated, runner, board_state, request, bench_failures):
    from harness.bench.suite import (
        COUNTERPART, Protocol, check_deterministic, child_figures, matching_prefix, run_benchmark, runner_figures,
    )
    from harness.runtimes.process import isolated

    root, manifest = bundle
    kind, recipe = RuntimeSpec.parse(runtime)
    model, artifact, b = bench_case(root, manifest, runtime, emulated)
    protocol = Protocol(prompts=b["prompts"], new_tokens=b["new_tokens"],
                        threads=int(os.environ.get("HARNESS_BENCH_THREADS", 0) or os.cpu_count() or 1))
    native = runner if kind == "executorch-native" else None
    try:
        timed = isolated(kind, str(artifact), protocol.threads, runner=native)  # timed alone
    except Exception as e:
        bench_failures[runtime] = f"{type(e).__name__}: {e}"
        pytest.fail(f"{runtime}: could not load: {e}")
    try:
        passes = run_benchmark(benchmark, timed, protocol, power=board_state["power"])
    finally:
        timed.close()
    check_deterministic(passes, runtime)
    info = benchmark.extra_info
    info.update(runtime=runtime, model=model, recipe=recipe, kind=kind, counterpart=COUNTERPART.get(recipe, ""),
                governor_performance=float(board_state["governor"] == "performance"),
                board=device.board_model(), runner_sha256=manifest["runner"]["sha256"] if native else None,
                emulated=f"qemu {emulated}" if emulated else None)
    if emulated or manifest.get("model"):  # the goldens hold there: the timed runs must say them too
        from harness.bench.bundle import golden_sets

        [g] = [g for g in golden_sets(manifest) if g["model"] == model and g["recipe"] == recipe]
        for p, sample in zip(g["prompts"], passes[0]):
            golden = p["golden"][:min(len(sample.ids), p.get("exact_upto", len(p["golden"])))]
            assert sample.ids[:len(golden)] == golden, f"{runtime} {p['prompt']!r}: timed run {sample.ids} != golden"
    same_pte = f"executorch:{recipe}"  # a native row runs the .pte its executorch row runs
    host = b["host_ids"].get(runtime) or b["host_ids"].get(same_pte)
    if host:  # random weights: near-tie flips between ARM and x86 kernels are expected; recorded, not asserted
        info["host_prefix_tokens"] = sum(matching_prefix(h, s.ids) for h, s in zip(host, passes[0])) / len(host)
    info.update({k: v for k, v in child_figures(runtime, str(artifact), protocol, runner=native).items()
                 if k != "generation"})
    per_token = b["bytes_per_token"].get(runtime) or b["bytes_per_token"].get(same_pte)
    bandwidth = None if emulated else request.getfixturevalue("bench_bandwidth")
    if per_token and bandwidth:
        roof = bandwidth.read_gb_s * 1e9 / per_token
        info.update(bytes_per_token=per_token, bandwidth_gb_s=bandwidth.read_gb_s, roofline_tok_s=roof,
                    roofline_fraction=info["decode_tok_s"] / roof)
    if kind == "executorch":  # the C++ runner's own figures: the speed users get
        from harness.bench.bundle import golden_sets

        g = next(g for g in golden_sets(manifest) if g["model"] in (model, "fixture"))
        texts = [p["templated"] for p in g["prompts"][:5]]
        tokenizer = g["tokenizer"] if manifest.get("model") else "bench-tokenizer.json"
        info.update(runner_figures(str(artifact), str(root / tokenizer), texts,
                                   protocol.new_tokens, protocol.rounds))
