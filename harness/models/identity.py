"""A checkpoint directory's stable id: its name plus a hash of its content, computed without
reading 10 GB on every run.

The content hash is sha256 over every top-level file's name and the sha256 of its bytes: exact (a
fine-tune that keeps every shape and changes one weight gets a new id). Each file's sha256 is
read once and kept in the artifact cache (``file-hashes.json``), keyed by the file's absolute path,
size, inode, mtime and ctime; a later run stats the files (microseconds) and re-reads only one
whose stat changed. The ctime cannot be set back by a tool that rewrites a file in place (``rsync``
or ``cp --preserve`` can restore the mtime, not the ctime), so a stale hash is not reused.
The first run over E2B's 10 GB takes about 10 s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from harness.cache import cache_root, sha256_file

HASHES_FILE = "file-hashes.json"


def _stat_key(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def _read_table(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def file_sha256(path: Path, table: dict | None = None) -> str:
    """sha256 of a file's bytes, from ``table`` when its stat is unchanged (updated otherwise)."""
    path = Path(path).resolve()
    key = _stat_key(path)
    entry = (table or {}).get(str(path))
    if isinstance(entry, dict) and entry.get("stat") == key and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = sha256_file(path)
    if table is not None:
        table[str(path)] = {"stat": key, "sha256": digest}
    return digest


def content_hash(directory: Path) -> str:
    """sha256 over every top-level file's name and content hash (the artifact cache's model key)."""
    from harness.atomic import write_bytes_atomic

    directory = Path(directory)
    store = cache_root() / HASHES_FILE
    table = _read_table(store)
    before = json.dumps(table, sort_keys=True)
    h = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(file_sha256(path, table).encode())
    after = json.dumps(table, sort_keys=True)
    if after != before:
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(store, after.encode())
        except OSError:
            pass  # a read-only cache only costs the next run the reading
    return h.hexdigest()


def model_name(directory: Path) -> str:
    """The checkpoint's name in the id: the directory's name (a Hugging Face snapshot's is its
    commit hash, so then the repository's, from ``models--ORG--NAME/snapshots/REV``)."""
    directory = Path(directory).resolve()
    parts = directory.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        name = parts[-3][len("models--"):].split("--")[-1]
    else:
        name = directory.name
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "model"


def model_id(directory: Path) -> str:
    """``NAME-HASH12``: what the goldens of a checkpoint are keyed by."""
    return f"{model_name(directory)}-{content_hash(directory)[:12]}"
