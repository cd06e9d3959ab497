"""The device bundle and an emulated dry run of the whole ``pi5`` tier, in CI.

``harness bench bundle DIR`` builds for aarch64: the native runner cross-compiled against the
pinned aarch64 executorch wheel, its libraries, the fixture's ``.pte`` files, token and logit
goldens, and a manifest that records where its goldens were checked. On the device the tier needs
pytest and pytest-benchmark and nothing else, so here it runs in a child with torch, numpy,
executorch, transformers, hypothesis and llama_cpp made unimportable, and the bundle's runner
under qemu-user as a Cortex-A76: a module that reaches for any of them fails this test.

Needs the cross compiler and qemu (tests/test_arm.py: fail in CI, skip elsewhere).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import HarnessError
from support import require_arm_tools, run_cli

pytestmark = pytest.mark.mac
ROOT = Path(__file__).resolve().parents[1]
# what the device does not have: an import of any of these from the pi5 tier fails the child
NOT_ON_THE_DEVICE = ("torch", "numpy", "executorch", "transformers", "torchao", "tokenizers", "safetensors",
                     "hypothesis", "llama_cpp", "syrupy", "matplotlib", "jinja2")
BLOCKER = f"""
import sys
BLOCKED = {NOT_ON_THE_DEVICE!r}
class NotOnTheDevice:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not installed on the device (blocked by test_pi5_emulated)")
        return None
sys.meta_path.insert(0, NotOnTheDevice())
"""


@pytest.fixture(scope="module")
def fixture_bundle(tmp_path_factory):
    require_arm_tools()
    out = tmp_path_factory.mktemp("pi5") / "bundle"
    rc, stdout, stderr = run_cli(["bench", "bundle", str(out), "--fixture-only"])
    assert rc == 0, stderr
    assert "checked on aarch64 cortex-a76 (emulated)" in stdout, stdout
    return out


def device_pytest(tmp_path: Path, bundle: Path, *args: str) -> subprocess.CompletedProcess:
    """``pytest -m pi5 tests/test_pi5.py --pi5-force --pi5-emulate cortex-a76`` as the device runs
    it: no plugin but pytest-benchmark, and none of NOT_ON_THE_DEVICE importable."""
    site = tmp_path / "device-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("HARNESS_PI5_BUNDLE", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "pytest_benchmark.plugin", "-m", "pi5", "tests/test_pi5.py",
           "--pi5-force", "--pi5-emulate", "cortex-a76", "--pi5-bundle", str(bundle), "-rA", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_the_bundle_runner_is_aarch64_and_its_goldens_were_checked_there(fixture_bundle):
    from harness.bench.bundle import read_manifest
    from harness.runtimes.arm import EM_AARCH64, elf_machine, needed_libraries

    manifest = read_manifest(fixture_bundle)
    runner = fixture_bundle / manifest["runner"]["path"]
    assert manifest["runner"]["arch"] == "aarch64" and elf_machine(runner) == EM_AARCH64
    for lib in [runner, *(runner.parent / "lib").iterdir()]:
        banned = [n for n in needed_libraries(lib) if n.startswith(("libtorch", "libc10", "libpython"))]
        assert not banned, f"{lib.name} links {banned}"
    [check] = manifest["checked"]
    assert check["checked"] and check["cpu"] == "cortex-a76" and check["emulated"], check
    assert set(check["logits_max_abs_diff"]) == set(manifest["fixture"]["pte"])


def test_the_pi5_tier_runs_torch_free_under_emulation(fixture_bundle, tmp_path):
    """The issue's command, from a device-like interpreter: goldens and logits pass on the
    emulated Cortex-A76, the benchmark protocol runs on the fixture, and every rate says emulated."""
    out = tmp_path / "pi5.json"
    run = device_pytest(tmp_path, fixture_bundle, "--benchmark-json", str(out))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    for test in ("test_pi5_goldens_native_runner", "test_pi5_logits_native_runner"):
        assert f"PASSED tests/test_pi5.py::{test}" in run.stdout, run.stdout[-3000:]
    data = json.loads(out.read_text())
    rows = [b["extra_info"] for b in data["benchmarks"]]
    assert sorted(r["recipe"] for r in rows) == sorted(["fp32", "8da4w", "8da4w-fast"])
    assert all(r["emulated"] == "qemu cortex-a76" and r["model"] == "fixture" and r["decode_tok_s"] > 0 for r in rows)
    assert data["harness"]["emulated"] == "qemu cortex-a76"
    assert data["harness"]["bundle"]["runner"]["arch"] == "aarch64"
    assert data["harness"]["host"]["machine"] == platform.machine() and data["harness"]["host"]["caches"]
    report = tmp_path / "pi5.json"
    rc, text, err = run_cli(["bench", "report", str(report), "--no-chart"])
    assert rc == 0, err
    assert "EMULATED: every rate here was measured under qemu cortex-a76" in text
    assert all("EMULATED" in line for line in text.splitlines() if "executorch-native" in line and "|" in line)


def test_a_wrong_golden_fails_the_emulated_tier(fixture_bundle, tmp_path):
    """The regression it names: the device runner saying something else than the golden. A
    bundle whose golden for one prompt is off by one token fails the tier, naming the recipe."""
    bad = tmp_path / "bad-bundle"
    shutil.copytree(fixture_bundle, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    golden = manifest["fixture"]["prompts"][0]["goldens"]["8da4w"]
    golden[1] = (golden[1] + 1) % 1024
    (bad / "manifest.json").write_text(json.dumps(manifest))
    run = device_pytest(tmp_path, bad, "-k", "goldens_native_runner")
    assert run.returncode == 1, run.stdout[-3000:]
    assert "8da4w" in run.stdout and "!= golden" in run.stdout, run.stdout[-3000:]


def test_a_bundle_whose_runner_disagrees_is_not_written(fixture_bundle):
    from harness.bench.bundle import check_bundle, read_manifest

    manifest = read_manifest(fixture_bundle)
    logits = json.loads((fixture_bundle / manifest["fixture"]["logits"]).read_text())
    manifest["fixture"]["pte"] = {"fp32": manifest["fixture"]["pte"]["fp32"]}
    logits["recipes"]["fp32"][0][3][5] += 0.01  # a host logit 100x the tolerance away
    with pytest.raises(HarnessError, match="row 3") as e:
        check_bundle(fixture_bundle, manifest, logits, "cortex-a76", progress=lambda m: None)
    assert "not written" in str(e.value)


def test_an_aarch64_bundle_here_asks_for_emulation_in_one_line(fixture_bundle):
    from harness.runtimes.arm import runner_prefix

    if platform.machine() == "aarch64":
        pytest.skip("this machine runs the aarch64 runner itself")
    with pytest.raises(HarnessError, match="--pi5-emulate cortex-a76") as e:
        runner_prefix("aarch64", fixture_bundle / "runner/et_native")
    assert "\n" not in str(e.value)
    with pytest.raises(HarnessError, match="--arch"):
        runner_prefix("x86_64" if platform.machine() != "x86_64" else "riscv64", fixture_bundle / "x")


def test_a_missing_qemu_named_by_option_says_so(fixture_bundle):
    from harness.runtimes.arm import runner_prefix

    with pytest.raises(HarnessError, match="no-such-qemu"):
        runner_prefix("aarch64", fixture_bundle / "runner/et_native", "cortex-a76", "no-such-qemu")


def test_a_bundle_that_cannot_be_built_leaves_nothing_and_says_why(tmp_path, monkeypatch):
    """No cross compiler: one line naming it and the apt command, and neither DIR nor DIR.partial
    (a half-built bundle copied to a device would be refused there, but should not exist)."""
    import shutil as sh

    monkeypatch.delenv("HARNESS_CROSS_CXX", raising=False)
    real_which = sh.which
    monkeypatch.setattr(sh, "which", lambda name, *a, **k: None if "aarch64" in name else real_which(name, *a, **k))
    rc, _, err = run_cli(["bench", "bundle", str(tmp_path / "bundle"), "--fixture-only"])
    assert rc != 0 and "aarch64-linux-gnu-g++" in err and "apt-get install" in err
    said = [line for line in err.splitlines() if not line.startswith("[harness]")]  # progress lines aside
    assert len(said) == 1 and said[0].startswith("harness: error:"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
