"""The compatibility matrix (``harness goldens matrix``): one environment per release, layered over
this one, ``goldens diff`` in each, one row each. The real releases take an hour (docs/upgrade-day.md); here a two-row list made of local wheels runs it end to end on the generated
checkpoint that is not the fixture (tests/conftest.py):

- ``harness-matrix-probe==1.0`` needs ``kernels>=0.19.1``, which the local index lacks (as this
  machine's registry lacks it for transformers 5.25): it installs only with ``--no-deps``, loads,
  and the diff runs to its verdict, which the row reports stage by stage;
- ``harness-matrix-probe==2.0`` needs another Python: it does not install, and is a row, not a crash.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.goldens.matrix import Row, env_dir, table, why_not
from harness.goldens.store import token_golden_path

pytestmark = pytest.mark.mac
RECIPE = "8da4w-fast"


def _wheel(where: Path, version: str, requires=(), requires_python: str | None = None) -> Path:
    """A real (tiny) wheel, written by hand: its metadata is what pip resolves on."""
    name = "harness_matrix_probe"
    dist = f"{name}-{version}.dist-info"
    meta = [f"Metadata-Version: 2.1", "Name: harness-matrix-probe", f"Version: {version}",
            *(f"Requires-Dist: {r}" for r in requires), *([f"Requires-Python: {requires_python}"] if requires_python else [])]
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n", f"{dist}/METADATA": "\n".join(meta) + "\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(t.encode())}" for p, t in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return path


def test_pip_reasons_read_as_a_few_words():
    assert why_not("ERROR: Could not find a version that satisfies the requirement kernels<0.20.0,>=0.19.1 "
                   "(from transformers) (from versions: none)\nERROR: No matching distribution found for "
                   "kernels<0.20.0,>=0.19.1\n") == "needs kernels<0.20.0,>=0.19.1 (not in the registry)"
    conflict = ("ERROR: Cannot install executorch==1.5.0 because these package versions have conflicting dependencies.\n"
                "The conflict is caused by:\n    The user requested torch==2.13.0\n"
                "    executorch 1.5.0 depends on torch==2.12.0\n")
    assert why_not(conflict) == "executorch 1.5.0 needs torch==2.12.0 (this stack pins torch==2.13.0)"
    assert why_not("ERROR: Ignored the following versions that require a different python version: 2.0 "
                   "Requires-Python <3\nERROR: No matching distribution found for x==2.0") == "requires Python <3"
    assert why_not("something else broke\n") == "something else broke"


def test_the_table_names_each_stage_and_marks_what_moved():
    rows = [Row("a==1", "yes", {"transformers": "5.23.0"}, "yes", "no golden changed", 0,
                {"fp32:eager": {"prompts": 4, "ids_changed": 0, "max_logprob": 0.0}}, 12.0),
            Row("b==2", "no: needs kernels>=0.19.1 (not in the registry)", seconds=3.0)]
    text = table(rows)
    assert "| a==1 | transformers 5.23.0 | yes | yes | no golden changed | = 0 | 12 s |" in text
    assert "| b==2 |  | no: needs kernels>=0.19.1 (not in the registry) | - | - |  | 3 s |" in text
    rows[0].stages["fp32:eager"]["ids_changed"] = 1
    assert "≠ 1/4 0" in table(rows)


def test_a_two_row_list_of_local_wheels_runs_to_its_rows(your_checkpoint, your_recorded, tmp_path, monkeypatch):
    root, computed, _ = your_recorded
    goldens = tmp_path / "goldens"
    shutil.copytree(root, goldens)
    key = computed.subject.key
    prompt = computed.subject.prompts[0]
    # the pte stage's golden of one prompt tampered: the row must say that stage, and only it, moved
    monkeypatch.setenv("HARNESS_GOLDENS_DIR", str(goldens))
    target = token_golden_path(RECIPE, "pte", prompt, key)
    assert goldens in target.parents
    record = json.loads(target.read_text())
    record["ids"][0] = (record["ids"][0] + 1) % 256
    target.write_text(json.dumps(record))

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "1.0", requires=["kernels>=0.19.1"])
    _wheel(wheels, "2.0", requires_python="<3")
    envs, out = tmp_path / "envs", tmp_path / "matrix.md"
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_GOLDENS_DIR"}
    done = subprocess.run([sys.executable, "-m", "harness", "goldens", "matrix", "harness-matrix-probe==1.0",
                           "harness-matrix-probe==2.0", "--find-links", str(wheels), "--no-index", "--envs", str(envs),
                           "--model", str(your_checkpoint), "--goldens", str(goldens), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=900, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    first, second = rows
    assert first["installs"] == "only with --no-deps (needs kernels>=0.19.1 (not in the registry))", first
    assert first["loads"] == "yes" and first["exit"] == 1 and "change(s)" in first["verdict"], first
    assert first["stages"][f"{RECIPE}:pte"]["ids_changed"] == 1, first["stages"]
    assert all(m["ids_changed"] == 0 for s, m in first["stages"].items() if s != f"{RECIPE}:pte"), first["stages"]
    assert second["installs"] == "no: requires Python <3" and second["exit"] is None, second
    # the probe really ran in the layer: the release is installed there, and not here
    probe = env_dir("harness-matrix-probe==1.0", envs, ["--find-links", str(wheels.resolve()), "--no-index"]) / "bin" / "python"
    assert subprocess.run([str(probe), "-c", "import harness_matrix_probe as p; assert p.VERSION == '1.0'"]).returncode == 0
    assert subprocess.run([sys.executable, "-c", "import harness_matrix_probe"], capture_output=True).returncode != 0
    text = out.read_text()
    assert "| harness-matrix-probe==2.0 |" in text and f"{RECIPE}:pte" in text and "≠ 1/" in text
