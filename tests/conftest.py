"""Fixtures the test modules share: a copy of the committed goldens to tamper with, and a generated
checkpoint that is not the fixture with its goldens recorded once per session (tests/test_your_model.py,
tests/test_matrix.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import run_cli


@pytest.fixture
def goldens_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the committed goldens, pointed at (HARNESS_GOLDENS_DIR), for a test that tampers."""
    import shutil

    from harness.goldens.store import goldens_dir

    root = tmp_path / "goldens"
    shutil.copytree(goldens_dir(), root)
    monkeypatch.setenv("HARNESS_GOLDENS_DIR", str(root))
    return root


@pytest.fixture(scope="session")
def your_checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("yours") / "my-gemma4"
    rc, stdout, stderr = run_cli(["make-checkpoint", "--shape", "small", str(out), "--shard-gb", "0.0005"])
    assert rc == 0, stdout + stderr
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1, "not the sharded layout"
    return out


@pytest.fixture(scope="session")
def your_recorded(your_checkpoint, tmp_path_factory):
    """The first ``goldens update --model DIR --goldens DIR``: (goldens dir, Computed, its output)."""
    from harness.goldens.refresh import compute, update_main
    from harness.goldens.subject import subject_for

    root = tmp_path_factory.mktemp("theirs") / "goldens"
    mp = pytest.MonkeyPatch()
    mp.setenv("HARNESS_GOLDENS_DIR", str(root))
    try:
        subject = subject_for(str(your_checkpoint))
        lines: list[str] = []
        computed = compute(subject=subject, progress=lines.append)
        assert update_main(computed=computed, say=lines.append) == 0, "\n".join(lines)
    finally:
        mp.undo()
    return root, computed, "\n".join(lines)
