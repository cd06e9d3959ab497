"""Lowering time with and without harness/export/lean.py, in one process, rounds alternating (these
machines are noisy: a ratio from one run, never a timed assert), and whether the programs are the
same bytes:

    python -m harness.bench.lowering [MODEL] [RECIPE] [ROUNDS]      # default: fixture 8da4w-fast 1

Prints one JSON line: seconds per round each way, the median ratio plain / lean, and the sha256 of
each program written (lean and plain must agree; tests/test_lower_memory.py asserts it)."""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import tempfile
import time


def compare(model: str = "fixture", recipe: str = "8da4w-fast", rounds: int = 1, lower=None) -> dict:
    from harness.export.pipeline import BuildPipeline
    from harness.cache import ArtifactCache
    from harness.program import runner_metadata

    if lower is None:
        from harness.export.lower import lower
    with tempfile.TemporaryDirectory(prefix="harness-lowering-") as cache_dir:
        pipe = BuildPipeline(model, recipe, cache=ArtifactCache(cache_dir))
        seconds: dict[str, list[float]] = {"plain": [], "lean": []}
        digests: set[str] = set()
        for _ in range(rounds):
            for mode in ("plain", "lean"):
                exported = [pipe.exported]  # a fresh reload of the .pt2 each time (lower() consumes it)
                pipe.__dict__.pop("exported", None)
                metadata = runner_metadata(pipe.loaded, pipe.settings, pipe.recipe)
                t0 = time.perf_counter()
                program, _ = lower(exported, pipe.recipe, metadata, lean=mode == "lean")
                seconds[mode].append(time.perf_counter() - t0)
                digests.add(hashlib.sha256(program.buffer).hexdigest())
    ratio = statistics.median(seconds["plain"]) / max(statistics.median(seconds["lean"]), 1e-9)
    return {"model": model, "recipe": recipe, "rounds": rounds,
            "plain_seconds": [round(s, 2) for s in seconds["plain"]],
            "lean_seconds": [round(s, 2) for s in seconds["lean"]],
            "plain_over_lean": round(ratio, 3), "same_bytes": len(digests) == 1}


def _main(argv: list[str]) -> int:
    model, recipe, rounds = (argv + ["fixture", "8da4w-fast", "1"][len(argv):])[:3]
    print(json.dumps(compare(model, recipe, int(rounds))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
