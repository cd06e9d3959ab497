"""Library versions and the harness's own source hash: parts of every cache key and provenance."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import metadata
from pathlib import Path

LIBRARIES = ("torch", "transformers", "torchao", "executorch", "tokenizers")


@lru_cache(maxsize=None)
def library_versions() -> dict[str, str]:
    out = {}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = "absent"
    return out


# The modules whose code decides what an artifact contains. Editing the CLI, the goldens or
# the tests does not invalidate cached .pt2/.pte files; editing any of these does.
ARTIFACT_MODULES = (
    "load.py", "recipes.py", "quantize.py", "export.py", "pt2.py", "lower.py", "pte.py",
    "pipeline.py", "atomic.py", "cache.py", "versions.py", "benchmodel.py", "configs/bench.json",
    "fast.py",
)


@lru_cache(maxsize=None)
def source_hash() -> str:
    """sha256 over the harness modules that build artifacts."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root / name for name in ARTIFACT_MODULES):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()
