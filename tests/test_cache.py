"""The artifact cache: keyed by everything that determines an artifact, self-verifying."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.cache import ArtifactCache, cache_key, cache_root

pytestmark = pytest.mark.mac


def _builder(calls: list, content: bytes = b"artifact"):
    def build(path):
        calls.append(path)
        path.write_bytes(content)
        return {"note": "built"}
    return build


def test_key_depends_on_every_component():
    base = dict(model="w1", config="c1", recipe={"name": "fp32"}, settings={"max_context": 128})
    k = cache_key("pte", **base)
    assert k == cache_key("pte", **base)
    for field, other in [("model", "w2"), ("config", "c2"), ("recipe", {"name": "8da4w"}),
                         ("settings", {"max_context": 256})]:
        assert cache_key("pte", **{**base, field: other}) != k, field
    assert cache_key("pt2", **base) != k


def test_key_depends_on_library_versions_and_harness_source(monkeypatch):
    import harness.cache as c

    k = cache_key("pte", model="w")
    monkeypatch.setattr(c, "library_versions", lambda: {"torch": "9.9.9"})
    assert cache_key("pte", model="w") != k
    monkeypatch.undo()
    monkeypatch.setattr(c, "source_hash", lambda: "edited")
    assert cache_key("pte", model="w") != k


def test_hit_builds_nothing(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    a = cache.get_or_build("pte", "k", "model.pte", _builder(calls))
    b = cache.get_or_build("pte", "k", "model.pte", _builder(calls))
    assert a == b and len(calls) == 1
    assert [e[2] for e in cache.events] == ["build", "hit"]


def test_corrupt_entry_is_detected_by_hash_and_rebuilt(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    path = cache.get_or_build("pte", "k", "model.pte", _builder(calls))
    path.write_bytes(b"artifacT")  # one flipped byte
    again = cache.get_or_build("pte", "k", "model.pte", _builder(calls))
    assert len(calls) == 2 and again.read_bytes() == b"artifact"
    assert [e[2] for e in cache.events] == ["build", "corrupt", "build"]


def test_failed_build_leaves_no_entry(tmp_path):
    cache = ArtifactCache(tmp_path)

    def boom(path):
        path.write_bytes(b"half")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError):
        cache.get_or_build("pte", "k", "model.pte", boom)
    assert cache.lookup("pte", "k", "model.pte") is None
    assert not any(p.name.startswith("pte-k") for p in tmp_path.iterdir())


def test_location_from_env_and_off_switch(monkeypatch, tmp_path):
    monkeypatch.delenv("HARNESS_NO_CACHE", raising=False)
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("HARNESS_CACHE_DIR")
    assert ".cache" in str(cache_root())
    monkeypatch.setenv("HARNESS_NO_CACHE", "1")
    root = cache_root()
    assert root != tmp_path / "c" and "nocache" in root.name


def _build_in_a_process(root: str, log: str, go, out: str) -> None:
    """One of two processes asking for the same entry at once (the tier's xdist workers)."""
    import time

    def build(path):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # long enough that the other process asks while this one builds
        path.write_bytes(b"artifact")

    go.wait()
    Path(out).write_text(str(ArtifactCache(Path(root)).get_or_build("pte", "k", "model.pte", build)))
    os._exit(0)


def _race(tmp_path, check_exit: bool = True) -> tuple[list[str], set[str]]:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    go = ctx.Event()
    log = tmp_path / "builds.log"
    log.touch()
    outs = [tmp_path / f"out{i}" for i in range(2)]
    procs = [ctx.Process(target=_build_in_a_process, args=(str(tmp_path / "cache"), str(log), go, str(o))) for o in outs]
    for proc in procs:
        proc.start()
    go.set()
    for proc in procs:
        proc.join(60)
        # unlocked, the second to finish may find the first's entry in its place (os.replace onto a
        # directory that is not empty): only the count of builds is the unlocked race's answer
        assert proc.exitcode == 0 or not check_exit
    return log.read_text().split(), {o.read_text() for o in outs if o.is_file()}


def test_two_processes_asking_at_once_build_the_entry_once(tmp_path):
    builds, paths = _race(tmp_path)
    assert len(builds) == 1, f"built {len(builds)} times"
    assert len(paths) == 1 and (Path(next(iter(paths)))).read_bytes() == b"artifact"


def test_without_the_lock_both_processes_build(tmp_path, monkeypatch):
    """The regression the lock names: two workers lowering the same program side by side."""
    from contextlib import contextmanager

    @contextmanager
    def no_lock(self, stage, key, wait=True):
        yield True

    monkeypatch.setattr(ArtifactCache, "claim", no_lock)
    builds, _ = _race(tmp_path, check_exit=False)
    assert len(builds) == 2


def test_a_claim_held_elsewhere_is_reported_not_waited_for(tmp_path):
    import multiprocessing as mp

    cache = ArtifactCache(tmp_path)
    ctx = mp.get_context("fork")
    with cache.claim("pte", "k") as mine:
        assert mine
        child = ctx.Process(target=lambda: os._exit(0 if not ArtifactCache(tmp_path).claim("pte", "k", wait=False).__enter__() else 1))
        child.start()
        child.join(30)
        assert child.exitcode == 0, "a second process took a claim this one holds"
