"""Speed across an upgrade: ``harness bench diff OLD NEW`` and the performance goldens.

A rate alone does not survive a noisy machine; the bench tier's paired ratios do: each of our
runtimes against its llama.cpp counterpart, timed in alternating rounds in the same run on the same
host (``paired_ratio_decode`` / ``paired_ratio_prefill``, harness/bench/suite.py). llama.cpp is not
upgraded with our stack, so its speed is the yardstick that cancels the host's drift, and a ratio
that drops after an upgrade is our stack getting slower. Ratios are compared only within one host
class (machine, the ISA features the kernels choose between, the thread count): another CPU is
another ratio (docs/benchmarks.md: 1.07x and 1.73x on two hosts "of the same kind").

``OLD`` and ``NEW`` are pytest-benchmark JSONs of the bench tier (the rows paired with llama.cpp), or a performance golden
(``goldens/perf/<host class>.json``, written by ``harness bench record RUN.json ...``: the
median ratio over the runs given). A drop beyond ``bench/paired_drop/<decode|prefill>`` (the spread
measured between runs of one stack, harness/tolerances.py) is flagged: exit 1. Exit 0: no drop
beyond it; 2: the two cannot be compared (another host class, no paired ratios).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

from harness.errors import HarnessError

METRICS = ("decode", "prefill")
PERF_DIR = "perf"


def host_class(host: dict) -> dict:
    """What makes two hosts' ratios comparable: the machine, its kernels' ISA features, the threads."""
    return {"machine": host.get("machine"), "isa": sorted(host.get("isa") or []), "threads": host.get("threads")}


def class_key(cls: dict) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", f"{cls['machine']}-{'+'.join(cls['isa']) or 'noisa'}-{cls['threads']}t")


def read_side(path: Path) -> dict:
    """{"label", "host_class", "ratios": {runtime: {"decode", "prefill"}}} from a benchmark JSON or
    a performance golden."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise HarnessError(f"{path}: not a readable JSON ({e})", "pass pytest --benchmark-json output or a "
                           "goldens/perf/*.json file") from None
    if isinstance(data, dict) and "ratios" in data and "host_class" in data:
        return {"label": f"{path} (golden of {data.get('runs', '?')} runs)", **data}
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise HarnessError(f"{path} is neither a benchmark JSON nor a performance golden",
                           "pass pytest --benchmark-json output or a goldens/perf/*.json file")
    host = (data.get("harness") or {}).get("host")
    if not host:
        raise HarnessError(f"{path} does not say which host measured it (no harness.host)",
                           "rerun the benchmark with this harness's conftest.py")
    ratios = {}
    for b in data["benchmarks"]:
        info = b.get("extra_info") or {}
        if info.get("paired_ratio_decode") is not None:
            ratios[info.get("runtime", b.get("name"))] = {"decode": info["paired_ratio_decode"],
                                                          "prefill": info["paired_ratio_prefill"]}
    if not ratios:
        raise HarnessError(f"{path} holds no paired ratio (no runtime ran beside its llama.cpp counterpart)",
                           "run the bench tier with llama-cpp-python installed")
    return {"label": str(path), "host_class": host_class(host), "ratios": ratios}


def median_side(sides: list[dict]) -> dict:
    """The median ratio of each runtime over runs of one stack on one host class."""
    classes = {class_key(s["host_class"]) for s in sides}
    if len(classes) != 1:
        raise HarnessError(f"the runs come from {len(classes)} host classes ({', '.join(sorted(classes))})",
                           "record a golden from runs of one host class")
    runtimes = set.intersection(*(set(s["ratios"]) for s in sides))
    return {"host_class": sides[0]["host_class"], "runs": len(sides),
            "ratios": {rt: {m: statistics.median(s["ratios"][rt][m] for s in sides) for m in METRICS}
                       for rt in sorted(runtimes)}}


def spread(sides: list[dict]) -> dict[str, float]:
    """Per metric, the largest relative distance of any run's ratio from its runtime's median: the
    noise between runs of one stack that a drop must exceed (what ``bench/paired_drop/*`` is set on)."""
    med = median_side(sides)["ratios"]
    return {m: max(abs(s["ratios"][rt][m] / med[rt][m] - 1) for s in sides for rt in med) for m in METRICS}


def decode_bar() -> float:
    from harness.tolerances import tolerance

    return tolerance("bench/paired_drop/decode").atol


def prefill_bar() -> float:
    from harness.tolerances import tolerance

    return tolerance("bench/paired_drop/prefill").atol


BARS = {"decode": decode_bar, "prefill": prefill_bar}




def bench_diff(old: dict, new: dict, say=print) -> int:
    if class_key(old["host_class"]) != class_key(new["host_class"]):
        raise HarnessError(f"{old['label']} was measured on host class {class_key(old['host_class'])}, "
                           f"{new['label']} on {class_key(new['host_class'])}",
                           "compare runs of one host class (machine, ISA features, threads)")
    say(f"paired ratios against llama.cpp (ours / theirs), host class {class_key(new['host_class'])}:")
    flagged = []
    for rt in sorted(set(old["ratios"]) | set(new["ratios"])):
        if rt not in new["ratios"]:
            flagged.append(rt)
            say(f"  {rt}: measured in {old['label']} but not in {new['label']} -> FLAGGED (it did not run)")
            continue
        if rt not in old["ratios"]:
            say(f"  {rt}: new, nothing to compare with")
            continue
        parts = []
        for m in METRICS:
            a, b = old["ratios"][rt][m], new["ratios"][rt][m]
            drop = b / a < 1 - BARS[m]()
            parts.append(f"{m} {a:.3f} -> {b:.3f} ({(b / a - 1) * 100:+.1f}%)" + (" DROP" if drop else ""))
            if drop:
                flagged.append(f"{rt} {m}")
        say(f"  {rt}: " + "; ".join(parts))
    bars = ", ".join(f"{m} {BARS[m]() * 100:.0f}%" for m in METRICS)
    if flagged:
        say(f"\n{len(flagged)} slower beyond the spread between runs ({bars}): {', '.join(flagged)}")
        return 1
    say(f"\nno drop beyond the spread between runs ({bars})")
    return 0


def perf_golden_path(cls: dict) -> Path:
    from harness.goldens.store import goldens_dir

    return goldens_dir() / PERF_DIR / f"{class_key(cls)}.json"


def recorded_side(cls: dict) -> dict:
    path = perf_golden_path(cls)
    if not path.is_file():
        raise HarnessError(f"no performance golden for host class {class_key(cls)} in {path.parent}",
                           "record one from runs of the stack you trust: harness bench record RUN.json ...")
    return read_side(path)


def record(runs: list[Path], allow: str | None = None, say=print) -> int:
    """The performance golden of this host class: the median ratios over ``runs`` (one stack).
    Gated like the token goldens: where one is recorded and the new median drops beyond the spread,
    nothing is written (exit 1) unless ``allow`` gives the reason, which the golden keeps."""
    from harness.atomic import write_bytes_atomic

    sides = [read_side(p) for p in runs]
    golden = {**median_side(sides), "recorded": time.strftime("%Y-%m-%d"),
              "spread": spread(sides) if len(sides) > 1 else None, "from": [str(p) for p in runs]}
    path = perf_golden_path(golden["host_class"])
    if path.is_file():
        old = read_side(path)
        golden["allowed"] = list(old.get("allowed", []))  # every reason recorded so far is kept
        if bench_diff(old, {**golden, "label": "the new runs"}, say) == 1:
            if not allow:
                say("not recorded: the new runs are slower than the golden (above); nothing was written. "
                    "`--allow REASON` records them anyway, with the reason.")
                return 1
            golden["allowed"].append({"date": golden["recorded"], "reason": allow})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(golden, indent=1, sort_keys=True) + "\n").encode(),
                       verify=lambda p: json.loads(p.read_text()))
    say(f"performance golden of host class {class_key(golden['host_class'])} ({len(sides)} runs) -> {path}")
    return 0
