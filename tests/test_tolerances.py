"""The tolerance table's own rules: every entry states what it was measured at, allows at most 10x
headroom over it, and belongs to one comparison; no test file keeps a tolerance of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from harness.tolerances import TOLERANCES, Tolerance

pytestmark = pytest.mark.mac
ROOT = Path(__file__).resolve().parent.parent
# Files and functions that call a comparison to show that it can fail, or apply it at a multiple
# (the refresh gate): they use the same comparison as the code that owns it, not a second one.
SAME_COMPARISON = {
    "tests/test_golden_teeth.py", "tests/test_tolerance_calibration.py", "tests/test_tolerances.py",
    "tests/test_golden_refresh.py", "harness/tolerances.py", "tests/test_bench_diff.py",
    "tests/test_llamacpp.py::test_agreement_reports_a_perturbed_position",
    "tests/test_llamacpp.py::test_the_near_tie_rule",
    "tests/test_numerics.py::test_size_budget_catches_an_unquantized_per_layer_embedding",
}
HEADROOM = 10.0


def headroom_problems(name: str, tol: Tolerance) -> list[str]:
    out = []
    if tol.measured is None:
        return [f"{name}: no measured value"]
    if "PROVISIONAL" in tol.reason:
        out.append(f"{name}: its reason is still provisional")
    pairs = [("atol", tol.atol, tol.measured)]
    if tol.mean is not None:
        pairs.append(("mean", tol.mean, tol.measured_mean))
    for field, bound, measured in pairs:
        if measured is None:
            out.append(f"{name}: {field} {bound} has no measured value")
        elif name.startswith("ablation/"):  # lower bounds: the effect must clear the bar
            if measured < bound:
                out.append(f"{name}: measured {measured} is below its bar {bound}")
        elif measured == 0 and bound != 0:
            out.append(f"{name}: {field} {bound} over a measured 0 (bit-exact comparisons get 0)")
        elif measured and bound > HEADROOM * measured * (1 + 1e-9):
            out.append(f"{name}: {field} {bound} is {bound / measured:.0f}x its measured {measured} (at most {HEADROOM:g}x)")
        elif measured and bound < measured and not name.startswith("preflight/"):
            out.append(f"{name}: {field} {bound} is below its measured {measured}")
    return out


def test_every_tolerance_states_its_measurement_within_ten_times():
    problems = [p for name, tol in TOLERANCES.items() for p in headroom_problems(name, tol)]
    assert not problems, "\n".join(problems)


def test_the_headroom_rule_can_fail():
    assert headroom_problems("x", Tolerance(1.0, "r", measured=0.01))
    assert headroom_problems("x", Tolerance(1.0, "r"))
    assert headroom_problems("x", Tolerance(0.5, "r", measured=0.1, mean=1.0, measured_mean=0.01))
    assert not headroom_problems("x", Tolerance(0.5, "r", measured=0.1, mean=0.05, measured_mean=0.01))


def _names_in(node: ast.AST) -> set[str]:
    """Tolerance names a function mentions: string literals, and f-strings read as patterns."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value in TOLERANCES:
            found.add(sub.value)
        elif (isinstance(sub, ast.JoinedStr) and sub.values and isinstance(sub.values[0], ast.Constant)
              and "/" in sub.values[0].value):  # f"family/{recipe}"
            pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in sub.values)
            found |= {name for name in TOLERANCES if re.fullmatch(pattern, name)}
    return found


def uses() -> dict[str, set[str]]:
    """Each tolerance name -> the functions (file::name) that compare with it."""
    out: dict[str, set[str]] = {name: set() for name in TOLERANCES}
    for path in sorted(list((ROOT / "harness").rglob("*.py")) + list((ROOT / "tests").glob("*.py")) + [ROOT / "conftest.py"]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in SAME_COMPARISON:
            continue
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            inner = {id(n) for child in fn.body for n in ast.walk(child)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not fn}
            names = {name for stmt in fn.body if id(stmt) not in inner for name in _names_in(stmt)}
            if f"{rel}::{fn.name}" in SAME_COMPARISON:
                continue
            for name in names:
                out[name].add(f"{rel}::{fn.name}")
    return out


def test_each_tolerance_belongs_to_one_comparison():
    found = uses()
    unused = sorted(name for name, where in found.items() if not where)
    shared = {name: sorted(where) for name, where in found.items() if len(where) > 1}
    assert not unused, f"tolerances no comparison uses: {unused}"
    assert not shared, "tolerances used by more than one comparison: " + "; ".join(
        f"{name}: {', '.join(where)}" for name, where in shared.items())


NUMBER = re.compile(r"(?<![\w.])(?:\d+\.\d*|\.\d+|\d+)(?:e-?\d+)?(?![\w.])")


def test_no_test_keeps_a_tolerance_of_its_own():
    """No comparison in a test file against a float literal (an error below 1e-5, an atol set to
    0.01): thresholds live in harness/tolerances.py."""
    bad = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\b(atol|rtol|tol|TOL|TOLERANCE|margin)\s*=\s*[\d.]+(?:e-?\d+)?\b", code) or \
                    re.search(r"(?:diff|err|error|margin|excess)\w*\s*(?:<=|<|>=|>)\s*[\d.]+e-\d+", code):
                bad.append(f"{path.name}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)
