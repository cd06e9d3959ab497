"""Artifact cache: keyed by everything that determines an artifact.

Key = sha256 of (stage, model identity (weights hash), model config, recipe, export settings,
the harness's own source, library versions). Location: ``HARNESS_CACHE_DIR``, default
``~/.cache/gemma-edge-harness`` (outside the repo). ``HARNESS_NO_CACHE=1`` turns it off (artifacts
go to a per-process temp dir). Each entry stores the artifact and ``meta.json`` with the
artifact's sha256; an entry whose hash does not match is deleted and rebuilt. Processes that share
the cache (the test tier's workers, two shells) build an entry once: a builder holds the entry's
lock (``.locks/STAGE-KEY.lock``, ``flock``), and one that finds it held waits, then takes the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from harness.versions import library_versions, source_hash

_TEMP_ROOT: Path | None = None


def cache_root() -> Path:
    global _TEMP_ROOT
    if os.environ.get("HARNESS_NO_CACHE") == "1":
        if _TEMP_ROOT is None:
            _TEMP_ROOT = Path(tempfile.mkdtemp(prefix="harness-nocache-"))
        return _TEMP_ROOT
    env = os.environ.get("HARNESS_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gemma-edge-harness"


def cache_key(stage: str, **parts) -> str:
    blob = {"stage": stage, "harness_source": source_hash(), "libraries": library_versions(), **parts}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:24]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class ArtifactCache:
    """``get_or_build(stage, key, filename, build)``: build(path) writes the artifact to path."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else cache_root()
        self.events: list[tuple[str, str, str]] = []  # (stage, key, "hit"|"build"|"corrupt"): a corrupt entry is removed, then built again ("build")

    def entry(self, stage: str, key: str) -> Path:
        return self.root / f"{stage}-{key}"

    def lookup(self, stage: str, key: str, filename: str) -> Path | None:
        entry = self.entry(stage, key)
        path, meta = entry / filename, entry / "meta.json"
        if not (path.is_file() and meta.is_file()):
            return None
        try:
            want = json.loads(meta.read_text())["sha256"]
        except (ValueError, KeyError):
            want = None
        if want != sha256_file(path):
            shutil.rmtree(entry, ignore_errors=True)
            self.events.append((stage, key, "corrupt"))
            return None
        return path

    @contextmanager
    def claim(self, stage: str, key: str, wait: bool = True):
        """Hold the entry's lock; yields True, or False at once when ``wait`` is off and another
        process holds it (that one is building the entry)."""
        import fcntl

        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{stage}-{key}.lock", "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def get_or_build(self, stage: str, key: str, filename: str, build: Callable[[Path], dict | None]) -> Path:
        found = self.lookup(stage, key, filename)
        if found is not None:
            self.events.append((stage, key, "hit"))
            return found
        with self.claim(stage, key):
            found = self.lookup(stage, key, filename)  # another process may have built it meanwhile
            if found is not None:
                self.events.append((stage, key, "hit"))
                return found
            return self._build(stage, key, filename, build)

    def _build(self, stage: str, key: str, filename: str, build: Callable[[Path], dict | None]) -> Path:
        entry = self.entry(stage, key)
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{stage}-{key}.", dir=self.root))
        try:
            t0 = time.time()
            info = build(staging / filename) or {}
            meta = {"sha256": sha256_file(staging / filename), "stage": stage, "key": key,
                    "build_seconds": round(time.time() - t0, 2), **info}
            (staging / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
            shutil.rmtree(entry, ignore_errors=True)
            os.replace(staging, entry)  # atomic: readers see a whole entry or none
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.events.append((stage, key, "build"))
        return entry / filename

    def meta(self, stage: str, key: str) -> dict:
        path = self.entry(stage, key) / "meta.json"
        return json.loads(path.read_text()) if path.is_file() else {}
