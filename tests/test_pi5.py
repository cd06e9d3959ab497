"""Pi 5 tier: the goldens and the benchmark protocol on the device, from a bundle built on a
workstation (``harness bench bundle DIR``). Needs only ExecuTorch's runtime, pytest and
pytest-benchmark (and llama-cpp-python for llama.cpp's side); no transformers.

    HARNESS_PI5_BUNDLE=~/bundle pytest -m pi5 --benchmark-json pi5.json && harness bench report pi5.json

Elsewhere these tests skip with the reason; ``--pi5-force`` runs them anyway as a dry run.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

from harness.runtimes.base import RuntimeSpec

from harness.bench import device

pytestmark = pytest.mark.pi5


@pytest.fixture(scope="module")
def bundle(request):
    if not (device.is_pi5() or request.config.getoption("--pi5-force")):
        board = device.board_model() or "no /proc/device-tree/model"
        pytest.skip(f"not a Raspberry Pi 5 ({board}); run on the Pi, or pass --pi5-force for a dry run")
    where = request.config.getoption("--pi5-bundle")
    if not where:
        pytest.skip("no bundle: build one with `harness bench bundle DIR` on a workstation, copy it here, "
                    "and pass --pi5-bundle DIR (or set HARNESS_PI5_BUNDLE)")
    from harness.bench.bundle import read_manifest

    manifest = read_manifest(Path(where))
    return Path(where), manifest


@pytest.fixture(scope="module")
def board_state(bundle, request):
    """Governor and throttling before measuring; the idle draw as the energy baseline."""
    from support import BENCH_STATE

    governor = device.cpu_governor()
    if governor != "performance":
        warnings.warn(f"CPU governor is {governor!r}, not 'performance': figures will vary "
                      "(echo performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor)")
    BENCH_STATE["throttled_before"] = device.throttled()
    power = device.power_source(request.config.getoption("--power-meter-cmd"))
    if power:
        with device.PowerSampler(power) as idle:
            time.sleep(3.0)
        BENCH_STATE["idle_w"] = idle.mean_watts
    return {"governor": governor, "power": power}


def _fixture_cases(manifest):
    return [(r, p) for r in manifest["fixture"]["pte"] for p in manifest["fixture"]["prompts"]]


def test_pi5_goldens_python_runtime(bundle):
    """Every bundled fixture .pte says the goldens on the device, through ExecuTorch's runtime."""
    from harness.runtimes.base import greedy
    from harness.runtimes.executorch import PteRuntime

    root, manifest = bundle
    fx = manifest["fixture"]
    for recipe, name in fx["pte"].items():
        runner = PteRuntime(root / name)
        for p in fx["prompts"]:
            gen = greedy(runner.step, p["ids"], fx["max_new_tokens"], eos_ids=frozenset(fx["eos_ids"]))
            assert gen.ids == p["goldens"][recipe], f"{recipe} {p['prompt']!r}: {gen.ids} != golden {p['goldens'][recipe]}"


def test_pi5_goldens_llm_runner(bundle):
    """The same through ExecuTorch's C++ LLM runner with its own tokenizer (what users deploy)."""
    from harness.runtimes.llm_runner import TextLLMRuntime

    root, manifest = bundle
    fx = manifest["fixture"]
    for recipe, name in fx["pte"].items():
        runner = TextLLMRuntime(root / name, root / "fixture-tokenizer.json")
        for p in fx["prompts"]:
            out = runner.generate_text(p["templated"], fx["max_new_tokens"])
            assert out.ids == p["goldens"][recipe], f"{recipe} {p['prompt']!r}: runner {out.ids} != golden"


def test_pi5_goldens_native_runner(bundle):
    """The same through the torch-free native runner (harness/native), built on the device against
    its executorch wheel's C++ runtime: no EOS stop, so each golden's EOS must come where it is."""
    from harness.bench.protocol import NATIVE
    from harness.runtimes.process import isolated

    root, manifest = bundle
    fx = manifest["fixture"]
    for recipe, name in fx["pte"].items():
        with isolated(NATIVE, str(root / name), 2) as child:
            for p in fx["prompts"]:
                golden = p["goldens"][recipe]
                ids = child.generate(p["ids"], len(golden)).ids
                assert ids == golden, f"{recipe} {p['prompt']!r}: native {ids} != golden {golden}"


def _bench_runtimes() -> list[str]:
    from harness.bench.protocol import NATIVE
    from harness.recipes import RECIPES

    return ([f"executorch:{r}" for r in RECIPES] + [f"{NATIVE}:{r}" for r in RECIPES]
            + ["llama.cpp:f32", "llama.cpp:q4_0"])


@pytest.mark.parametrize("runtime", _bench_runtimes())
def test_pi5_benchmark(benchmark, runtime, bundle, board_state, bench_bandwidth, bench_failures):
    from harness.runtimes.process import isolated
    from harness.bench.suite import (
        COUNTERPART, Protocol, check_deterministic, child_figures, matching_prefix, run_benchmark, runner_figures,
    )

    root, manifest = bundle
    b = manifest["bench"]
    kind, recipe = RuntimeSpec.parse(runtime)
    if kind == "llama.cpp":
        pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed on this device")
        if recipe not in b["gguf"]:
            pytest.skip(f"the bundle has no {recipe} GGUF: {b['errors'].get(runtime, 'built with --no-gguf')}")
        artifact = root / b["gguf"][recipe]
    else:
        if recipe not in b["pte"]:
            pytest.skip(f"the bundle has no {recipe} .pte (built with --recipe)")
        artifact = root / b["pte"][recipe]
    protocol = Protocol(prompts=b["prompts"], new_tokens=b["new_tokens"],
                        threads=int(os.environ.get("HARNESS_BENCH_THREADS", 0) or os.cpu_count() or 1))
    try:
        runner = isolated(RuntimeSpec.parse(runtime).kind, str(artifact), protocol.threads)  # timed alone
    except Exception as e:
        bench_failures[runtime] = f"{type(e).__name__}: {e}"
        pytest.fail(f"{runtime}: could not load: {e}")
    try:
        passes = run_benchmark(benchmark, runner, protocol, power=board_state["power"])
    finally:
        runner.close()
    check_deterministic(passes, runtime)
    info = benchmark.extra_info
    info.update(runtime=runtime, model="bench", recipe=recipe, kind=kind, counterpart=COUNTERPART.get(recipe, ""),
                governor_performance=float(board_state["governor"] == "performance"))
    same_pte = f"executorch:{recipe}"  # a native row runs the .pte its executorch row runs
    host = b["host_ids"].get(runtime) or b["host_ids"].get(same_pte)
    if host:  # random weights: near-tie flips between ARM and x86 kernels are expected; recorded, not asserted
        info["host_prefix_tokens"] = sum(matching_prefix(h, s.ids) for h, s in zip(host, passes[0])) / len(host)
    info.update({k: v for k, v in child_figures(runtime, str(artifact), protocol).items() if k != "generation"})
    per_token = b["bytes_per_token"].get(runtime) or b["bytes_per_token"].get(same_pte)
    if per_token:
        roof = bench_bandwidth.read_gb_s * 1e9 / per_token
        info.update(bytes_per_token=per_token, bandwidth_gb_s=bench_bandwidth.read_gb_s, roofline_tok_s=roof,
                    roofline_fraction=info["decode_tok_s"] / roof)
    if kind == "executorch":  # the C++ runner's own figures: the speed users get
        texts = [p["templated"] for p in manifest["fixture"]["prompts"][:5]]
        info.update(runner_figures(str(artifact), str(root / "bench-tokenizer.json"), texts,
                                   protocol.new_tokens, protocol.rounds))
