"""``pytest --snapshot-update`` runs the gate of ``harness goldens update`` (syrupy is the token
goldens' snapshot engine, tests/support/snapshots.py): a real pytest session on a copy of the
goldens, selecting one token golden with ``-k``, both ways:

- a token golden missing: the gate accepts (a new golden is not a change), writes the whole set (not
  the one ``-k`` selected) and the missing file comes back byte for byte as committed;
- a clear-margin token tampered: the session fails with the gate's lines and no file changes;
- nothing differs: nothing is written, not even the provenance;
- ``--snapshot-update-new-only``, which would write a part of the set, is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import tree_bytes

from harness.goldens.store import GOLDEN_PROMPTS, slug, token_golden_path

pytestmark = pytest.mark.mac
ROOT = Path(__file__).resolve().parent.parent
FRANCE = GOLDEN_PROMPTS[0]
SELECT = f"test_token_golden and fp32 and pte and {slug(FRANCE)}"


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/test_goldens.py",
                           "-k", SELECT, *args], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ),
                          timeout=900, stdin=subprocess.DEVNULL)


def test_a_missing_golden_is_written_back_by_the_gate_with_the_whole_set(goldens_copy):
    target = token_golden_path("fp32", "pte", FRANCE)
    committed = target.read_bytes()
    target.unlink()
    tokens_before = {p: b for p, b in tree_bytes(goldens_copy).items() if p.parts[0] == "tokens"}
    t0 = time.time_ns()
    done = _pytest("--snapshot-update")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "the gate of `harness goldens update`" in out and "goldens of fixture updated" in out, out[-3000:]
    assert target.read_bytes() == committed, "the golden came back other than committed"
    after = tree_bytes(goldens_copy)
    assert all(after[p] == b for p, b in tokens_before.items()), "a token golden the gate did not change moved"
    # the whole set was written, not the one golden -k selected
    rewritten = [p for p in goldens_copy.rglob("*.json") if p.stat().st_mtime_ns >= t0]
    assert len(rewritten) == len(list(goldens_copy.rglob("*.json"))), "only a part of the set was written"


def test_a_clear_margin_change_fails_the_session_and_writes_nothing(goldens_copy, computed_goldens):
    gen = computed_goldens.runs[("fp32", "pte", FRANCE)]
    top = gen.step_logits[3].topk(2)
    assert float(top.values[0] - top.values[1]) > 4
    path = token_golden_path("fp32", "pte", FRANCE)
    record = json.loads(path.read_text())
    record["ids"][3] = int(top.indices[1])
    path.write_text(json.dumps(record))
    before = tree_bytes(goldens_copy)
    done = _pytest("--snapshot-update")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    assert "BLOCKS the refresh" in out and "REFUSED; no golden was written" in out, out[-3000:]
    assert tree_bytes(goldens_copy) == before, "a refused update wrote"
    plain = _pytest()  # and without --snapshot-update it is an ordinary, localized failure
    assert plain.returncode == 1 and "changed its answer" in plain.stdout, plain.stdout[-3000:]


def test_nothing_differs_nothing_is_written(goldens_copy):
    before = tree_bytes(goldens_copy)
    done = _pytest("--snapshot-update")
    assert done.returncode == 0 and "nothing to update" in done.stdout, done.stdout[-3000:]
    assert tree_bytes(goldens_copy) == before


def test_updating_only_new_snapshots_is_refused():
    done = subprocess.run([sys.executable, "-m", "pytest", "--snapshot-update-new-only", "--collect-only", "-q",
                           "tests/test_cache.py"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0 and "a part of the golden set" in done.stdout + done.stderr
