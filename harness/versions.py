"""Library versions and the harness's own source hash: parts of every cache key and provenance."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import metadata
from pathlib import Path

LIBRARIES = ("torch", "transformers", "torchao", "executorch", "tokenizers")


@lru_cache(maxsize=None)
def library_versions(libraries=None) -> dict[str, str]:
    """Each library's installed version, or "absent" (default: LIBRARIES)."""
    out = {}
    for lib in libraries or LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = "absent"
    return out


# What decides an artifact's content: the packages that make models and build artifacts, and the
# two top-level modules they read (the recipe table and the program contract). Everything else
# (runtimes, goldens, benchmarks, the CLI, the tests) can change without invalidating a cached
# .pt2 or .pte. A new module inside these packages is hashed without being listed anywhere.
BUILD_SOURCES = ("models", "export", "recipes.py", "program.py")
_HASHED_SUFFIXES = (".py", ".json")


def build_files(root: Path | None = None) -> list[Path]:
    """Every file whose bytes go into the build hash, in a stable order (``root``: a harness/ tree)."""
    root = Path(root) if root else Path(__file__).resolve().parent
    out = []
    for name in BUILD_SOURCES:
        path = root / name
        if path.is_dir():
            out += [p for p in path.rglob("*") if p.is_file() and p.suffix in _HASHED_SUFFIXES
                    and "__pycache__" not in p.parts and "fixture" not in p.relative_to(path).parts]
        else:
            out.append(path)
    return sorted(out)


def hash_files(root: Path) -> str:
    h = hashlib.sha256()
    for path in build_files(root):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@lru_cache(maxsize=None)
def source_hash() -> str:
    """sha256 over the harness code that builds artifacts (``BUILD_SOURCES``). The fixture's
    weights are not in it: the cache key carries their own hash."""
    return hash_files(Path(__file__).resolve().parent)
