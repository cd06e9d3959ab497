"""The stack the goldens were recorded under (library versions, Python, machine, CPU features, the
harness build's hash, the fixture's), and the note a failing golden starts with when the stack moved."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.errors import HarnessError
from harness.goldens.store import UPDATE_COMMAND, provenance_path, read_json_golden

# ---- provenance -------------------------------------------------------------------------------
NUMERIC_LIBRARIES = ("torch", "torchao", "executorch", "transformers", "tokenizers", "llama-cpp-python")
# The CPU features XNNPACK, ExecuTorch's kernels and llama.cpp pick their kernels by.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx_vnni", "avx512_bf16", "amx_int8", "asimd", "asimddp", "fphp", "asimdhp", "i8mm", "sve",
             "sve2", "sme", "bf16")


def cpu_features() -> list[str]:
    """The relevant ISA features of this CPU, from /proc/cpuinfo (x86 'flags', ARM 'Features')."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    have: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            have.update(value.split())
    return [f for f in ISA_FLAGS if f in have]


def fixture_sha256() -> str:
    from harness.cache import sha256_file
    from harness.models.load import FIXTURE_DIR

    return sha256_file(FIXTURE_DIR / "model.safetensors")


def current_provenance(fixture_sha256_: str | None = None) -> dict:
    import platform

    from harness.versions import library_versions, source_hash

    libs = library_versions(NUMERIC_LIBRARIES)
    return {
        **libs,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_features": " ".join(cpu_features()),
        "harness_build_sha256": source_hash(),
        "fixture_weights_sha256": fixture_sha256_ or fixture_sha256(),
    }


# Keys of provenance.json that describe the stack (the rest is the gate's record).
STACK_KEYS = NUMERIC_LIBRARIES + ("python", "machine", "cpu_features", "harness_build_sha256",
                                  "fixture_weights_sha256")


def recorded_provenance() -> dict:
    path = provenance_path()
    if not path.is_file():
        return {}
    data = read_json_golden(path)
    if not isinstance(data, dict):
        raise HarnessError(f"{path} is not a JSON object", "restore it from git")
    return data


def provenance_diff(recorded: dict, current: dict) -> dict[str, tuple]:
    return {k: (recorded.get(k), current.get(k)) for k in STACK_KEYS if recorded.get(k) != current.get(k)}


REFRESH_HINT = ("to refresh: tox -e refresh (diffs every golden stage on the new stack), then "
                f"{UPDATE_COMMAND}, which rewrites them only if every change is numerics (README, "
                "'Goldens and the refresh flow')")


def stack_note(recorded: dict | None = None, now: dict | None = None) -> str:
    """One line for a failed golden: "" when the goldens were recorded under this very stack,
    otherwise which parts differ (recorded → running) and how to refresh."""
    if recorded is None:
        path = provenance_path()
        if not path.is_file():
            return f"the goldens have no provenance record ({path} is missing); {REFRESH_HINT}"
        try:
            recorded = json.loads(path.read_text())
        except ValueError as e:
            return f"{path} is malformed JSON ({e}); restore it from git"
        if not isinstance(recorded, dict):
            return f"{path} is not a JSON object; restore it from git"
    if now is None:
        now = current_provenance()
    diff = provenance_diff(recorded, now)
    if not diff:
        return ""
    parts = [f"{k} {_short(a)} -> {_short(b)}" for k, (a, b) in diff.items()]
    return (f"the goldens were recorded under another stack ({', '.join(parts)}; recorded -> running); "
            + REFRESH_HINT)


def _short(value) -> str:
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{64}", text) else text


