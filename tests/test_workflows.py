"""The CI definitions users take (.github/workflows/): valid against GitHub's workflow schema (the
copy check-jsonschema vendors, so no network), and saying what the docs say: the mac job runs the
README's test command with the cross compiler and qemu and the artifact cache keyed by the build
code; the pi5 job runs on a self-hosted `pi5` runner with only pytest and pytest-benchmark."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.mac
ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
TEST_COMMAND = "python3 -m pip install --quiet tox && tox -e mac"


def schema_problems(paths) -> str | None:
    """check-jsonschema's output where a workflow breaks GitHub's schema, else None."""
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
    if exe is None:
        pytest.fail("check-jsonschema is not installed (the dev extra): pip install -e '.[dev]'")
    done = subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else done.stdout + done.stderr


def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def test_every_workflow_is_valid():
    assert WORKFLOWS, "no workflows"
    assert schema_problems(WORKFLOWS) is None, schema_problems(WORKFLOWS)


def test_the_schema_check_fails_on_a_broken_workflow(tmp_path):
    text = (ROOT / ".github" / "workflows" / "mac.yml").read_text().replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest")
    broken = tmp_path / "broken.yml"
    broken.write_text(text)
    assert schema_problems([broken]) is not None, "a job without runs-on passed the schema"


def test_the_mac_job_runs_the_readme_command_as_ci_does():
    readme = (ROOT / "README.md").read_text()
    assert TEST_COMMAND in readme and TEST_COMMAND in (ROOT / ".ci" / "run").read_text()
    steps = _load("mac.yml")["jobs"]["mac"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert runs[-1] == TEST_COMMAND
    assert any("g++-aarch64-linux-gnu" in r and "qemu-user-static" in r for r in runs)
    cache = next(s for s in steps if str(s.get("uses", "")).startswith("actions/cache"))
    assert cache["with"]["path"] == "~/.cache/gemma-edge-harness" and "steps.key.outputs.build" in cache["with"]["key"]
    assert any("source_hash" in r for r in runs), "the cache key is not the build code's hash"
    setup = next(s for s in steps if str(s.get("uses", "")).startswith("actions/setup-python"))
    assert str(setup["with"]["python-version"]) == "3.11" and setup["with"]["cache"] == "pip"


def test_the_source_hash_the_cache_key_uses_needs_no_torch():
    code = ("import sys; from harness.versions import source_hash; print(source_hash()[:16]); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and len(done.stdout.strip()) == 16, done.stderr


def test_the_pi5_job_takes_the_bundle_and_installs_only_pytest():
    device = _load("device.yml")
    bundle, pi5 = device["jobs"]["bundle"], device["jobs"]["pi5"]
    assert any("harness bench bundle" in s.get("run", "") for s in bundle["steps"])
    assert any(str(s.get("uses", "")).startswith("actions/upload-artifact") for s in bundle["steps"])
    assert pi5["runs-on"] == ["self-hosted", "pi5"] and pi5["needs"] == "bundle"
    runs = "\n".join(s.get("run", "") for s in pi5["steps"])
    installs = [l for l in runs.splitlines() if "pip" in l and "install" in l]
    assert installs and all(l.split("install", 1)[1].split() == ["--quiet", "pytest", "pytest-benchmark"] for l in installs), installs
    assert "-m pi5" in runs and "--benchmark-json pi5.json" in runs
    uploads = [s for s in pi5["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and "pi5.json" in uploads[0]["with"]["path"] and "pi5.md" in uploads[0]["with"]["path"]
