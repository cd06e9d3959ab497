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


def current_provenance(fixture_sha256_: str | None = None, subject=None) -> dict:
    """The stack now; for a user's checkpoint (``subject``), its id, directory and content hash in
    place of the fixture's weights."""
    import platform

    from harness.versions import library_versions, source_hash

    libs = library_versions(NUMERIC_LIBRARIES)
    out = {
        **libs,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_features": " ".join(cpu_features()),
        "harness_build_sha256": source_hash(),
        **hub_kernels(),
    }
    if subject is None or subject.is_fixture:
        out["fixture_weights_sha256"] = fixture_sha256_ or fixture_sha256()
    else:
        out["model_id"] = subject.key
    return out


def hub_kernels() -> dict:
    """How transformers' hub kernels were kept off: the process's USE_HUB_KERNELS and what every
    load passes as ``use_kernels`` (absent: a transformers without hub kernels)."""
    import os

    try:  # the Pi 5 bundle runs without transformers: nothing is loaded there, so nothing to say
        from harness.models.load import no_hub_kernels

        use = str(no_hub_kernels().get("use_kernels", "not supported"))
    except ImportError:
        use = "no transformers"
    return {"USE_HUB_KERNELS": os.environ.get("USE_HUB_KERNELS"), "use_kernels": use}


# Keys of provenance.json that describe the stack (the rest is the gate's record).
STACK_KEYS = NUMERIC_LIBRARIES + ("python", "machine", "cpu_features", "harness_build_sha256",
                                  "fixture_weights_sha256", "USE_HUB_KERNELS", "use_kernels")
# A user's checkpoint: its own id (name and content hash) in place of the fixture's weights.
MODEL_STACK_KEYS = tuple(k for k in STACK_KEYS if k != "fixture_weights_sha256") + ("model_id",)


def stack_keys(model: str = "fixture") -> tuple[str, ...]:
    return STACK_KEYS if model == "fixture" else MODEL_STACK_KEYS


def recorded_provenance(model: str = "fixture") -> dict:
    path = provenance_path(model)
    if not path.is_file():
        return {}
    data = read_json_golden(path)
    if not isinstance(data, dict):
        raise HarnessError(f"{path} is not a JSON object", "restore it from git")
    return data


def provenance_diff(recorded: dict, current: dict, model: str = "fixture") -> dict[str, tuple]:
    return {k: (recorded.get(k), current.get(k)) for k in stack_keys(model) if recorded.get(k) != current.get(k)}


REFRESH_HINT = ("to refresh: tox -e refresh (diffs every golden stage on the new stack), then "
                f"{UPDATE_COMMAND}, which rewrites them only if every change is numerics "
                "(docs/goldens.md)")


def stack_note(recorded: dict | None = None, now: dict | None = None, model: str = "fixture") -> str:
    """One line for a failed golden: "" when the goldens were recorded under this very stack,
    otherwise which parts differ (recorded → running) and how to refresh."""
    if recorded is None:
        path = provenance_path(model)
        if not path.is_file():
            return f"the goldens have no provenance record ({path} is missing); {REFRESH_HINT}"
        try:
            recorded = json.loads(path.read_text())
        except ValueError as e:
            return f"{path} is malformed JSON ({e}); restore it from git"
        if not isinstance(recorded, dict):
            return f"{path} is not a JSON object; restore it from git"
    if now is None:
        now = current_provenance() if model == "fixture" else {**current_provenance(subject=_Keyed(model))}
    diff = provenance_diff(recorded, now, model)
    if not diff:
        return ""
    parts = [f"{k} {_short(a)} -> {_short(b)}" for k, (a, b) in diff.items()]
    return (f"the goldens were recorded under another stack ({', '.join(parts)}; recorded -> running); "
            + REFRESH_HINT)


class _Keyed:
    """Enough of a Subject for ``current_provenance``: its key."""

    def __init__(self, key: str):
        self.key, self.is_fixture = key, key == "fixture"


def _short(value) -> str:
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{64}", text) else text


