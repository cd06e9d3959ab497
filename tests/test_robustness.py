"""Nothing lost: a write killed at any moment leaves the old file or none; a damaged .pte of any
shape gets a clear error, never a crashed interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import examples
from harness.atomic import write_bytes_atomic

pytestmark = pytest.mark.mac

SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from harness.atomic import atomic_path
    target = Path(sys.argv[1])
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            print("writing", flush=True)
            for i in range(200):
                f.write(bytes([i % 251]) * (256 * 1024))
                f.flush()
                time.sleep(0.005)
    print("done", flush=True)
""")


@pytest.mark.parametrize("kill_after", [0.0, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("had_old", [True, False], ids=["over-old-file", "no-old-file"])
def test_a_killed_write_leaves_the_old_file_or_none(tmp_path, kill_after, had_old):
    target = tmp_path / "model.pte"
    if had_old:
        target.write_bytes(b"old artifact")
    child = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"  # the kill lands inside the write
    time.sleep(kill_after)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    partials = list(tmp_path.glob(".model.pte.*.partial"))
    if kill_after < 0.9:  # the write takes at least 1 s (200 x 5 ms sleeps)
        assert partials, "the writer should have been killed mid-write (no partial temp file found)"
    if target.exists():
        data = target.read_bytes()
        assert data == b"old artifact" or len(data) == 200 * 256 * 1024, f"partial target: {len(data)} bytes"
    else:
        assert not had_old, "the old file was lost"
    # the next write sweeps what the killed writer left behind
    write_bytes_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte"]


FUZZ_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from harness.errors import HarnessError
    from harness.export.pte import load_program
    outcomes = []
    for path in sys.argv[1:]:
        try:
            program, method = load_program(Path(path))
            outcomes.append("loaded")
        except HarnessError as e:
            assert "\\n" not in str(e)
            outcomes.append("clear error")
        except Exception as e:
            outcomes.append(f"UNCLEAR {type(e).__name__}: {e}")
    print(json.dumps(outcomes))
""")


@settings(max_examples=examples(3))
@given(cases=st.lists(
    st.one_of(
        st.tuples(st.just("truncate"), st.floats(0, 0.999)),
        st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 0.999), st.integers(1, 255)), min_size=1,
                                            max_size=8)),
        st.tuples(st.just("random"), st.binary(min_size=0, max_size=4096)),
        st.tuples(st.just("header"), st.binary(min_size=8, max_size=64)),
    ),
    min_size=6, max_size=10,
))
def test_pte_loader_survives_damaged_files(pipeline, tmp_path_factory, cases):
    good = pipeline("8da4w").pte_path.read_bytes()
    folder = tmp_path_factory.mktemp("fuzz")
    paths = []
    for i, (kind, arg) in enumerate(cases):
        if kind == "truncate":
            data = good[: int(len(good) * arg)]
        elif kind == "flip":
            data = bytearray(good)
            for where, xor in arg:
                data[int(len(good) * where)] ^= xor
            data = bytes(data)
        elif kind == "header":
            data = good[:4] + b"ET12" + arg[8:] + good[len(arg):]
        else:
            data = arg
        path = folder / f"case{i}.pte"
        path.write_bytes(data)
        paths.append(str(path))
    res = subprocess.run([sys.executable, "-c", FUZZ_CHILD, *paths], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0, f"the interpreter died (exit {res.returncode}) on {cases}: {res.stderr[-500:]}"
    outcomes = json.loads(res.stdout.strip().splitlines()[-1])
    unclear = [(c, o) for c, o in zip(cases, outcomes) if o.startswith("UNCLEAR")]
    assert not unclear, unclear
