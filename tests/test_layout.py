"""The shape of the code, held: harness/ has no import circles (every ``harness.*`` import counts,
also those inside functions), no module much past 400 lines without a stated reason, one greedy
loop, runtimes registered by kind, and a build hash that covers every file of the packages that
build artifacts, and nothing else; no package under a name that tools take for generated output, and no
harness file that .gitignore hides."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.mac

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "harness"
MAX_LINES = 420  # "about 400"
LONGER = {  # "harness/x.py": "why it is longer"
    "harness/tolerances.py": "one table: every tolerance beside its measured value and reason, read as a whole by "
                             "tests/test_tolerances.py; split, a name could be defined twice",
}


def modules(root: Path = HARNESS) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in mods else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.split(".")[0] == "harness")
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_harness_has_no_import_circles():
    found = cycles(import_graph(modules()))
    assert not found, f"import circles in harness/: {found}"


def test_the_circle_finder_finds_the_circles_this_layout_removed():
    # benchmodel <-> load and export <-> fast, as they were before the packages
    graph = {"load": {"benchmodel", "cache"}, "benchmodel": {"load"}, "export": {"fast"}, "fast": {"export"},
             "cache": set()}
    assert cycles(graph) == [["benchmodel", "load"], ["export", "fast"]]


def test_no_module_is_much_longer_than_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in HARNESS.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES and str(p.relative_to(ROOT)) not in LONGER}
    assert not long, f"modules past {MAX_LINES} lines (split them by concern, or give the reason in LONGER): {long}"


def test_every_package_says_what_it_is_for():
    for init in HARNESS.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(ROOT)} has no docstring saying what the package holds"


FEEDS = ("step(", "_eval(", ".eval(", "execute(", "forward(", "model(")


def greedy_loops(source: str) -> list[int]:
    """Lines of loops that pick a token with argmax and feed a model in the same loop."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.For, ast.While))
            and "argmax" in (body := ast.unparse(node)) and any(f in body for f in FEEDS)]


def test_there_is_one_greedy_loop():
    """Only harness/runtimes/base.py decodes greedily; every runtime, benchmark and check calls it."""
    loops = [f"{p.relative_to(ROOT)}:{n}" for p in HARNESS.rglob("*.py") for n in greedy_loops(p.read_text())]
    assert [l.split(":")[0] for l in loops] == ["harness/runtimes/base.py"], loops


def test_the_loop_finder_finds_a_second_loop():
    # the benchmark's own timed loop, as it was (harness/benchrun.py: timed_greedy)
    second = """
for pos in range(n, n + new_tokens - 1):
    logits = step(torch.tensor([[nxt]]), torch.tensor([pos]))
    nxt = int(logits[0, -1].argmax())
"""
    assert greedy_loops(second) == [2]
    assert greedy_loops("for row in rows:\n    worst = int(abs(row).argmax())\n") == []


def test_every_runtime_kind_is_registered_by_its_module():
    from harness.runtimes.base import MODULES, REGISTRY, runtime_class

    for kind in MODULES:
        if kind == "llama.cpp":
            pytest.importorskip("llama_cpp")
        assert runtime_class(kind).kind == kind
    assert set(REGISTRY) <= set(MODULES)


def test_a_runtime_spec_is_parsed_in_one_place():
    from harness.errors import HarnessError
    from harness.runtimes.base import RuntimeSpec

    assert tuple(RuntimeSpec.parse("executorch-native:8da4w-fast")) == ("executorch-native", "8da4w-fast")
    assert RuntimeSpec.parse("llama.cpp:q4_0").label == "llama.cpp:q4_0"
    for bad in ("executorch", "tflite:fp32", "eager:"):
        with pytest.raises(HarnessError):
            RuntimeSpec.parse(bad)
    parsers = [f"{p.relative_to(ROOT)}" for p in HARNESS.rglob("*.py")
               if 'partition(":")' in p.read_text() and p.name != "base.py" and "goldens" not in p.parts]
    assert not parsers, f"a runtime string parsed outside RuntimeSpec: {parsers}"


def test_the_build_hash_covers_the_build_packages_and_only_them(tmp_path):
    from harness.versions import BUILD_SOURCES, build_files, hash_files

    root = tmp_path / "harness"
    shutil.copytree(HARNESS, root, ignore=shutil.ignore_patterns("__pycache__"))
    before = hash_files(root)
    assert {p.relative_to(root).parts[0] for p in build_files(root)} == set(BUILD_SOURCES)
    (root / "runtimes" / "base.py").write_text((root / "runtimes" / "base.py").read_text() + "\n# a comment\n")
    (root / "goldens" / "new.py").write_text("x = 1\n")
    assert hash_files(root) == before, "editing a runtime or the goldens must not invalidate cached artifacts"
    (root / "export" / "new_pass.py").write_text("x = 1\n")  # a module nobody listed
    assert hash_files(root) != before
    (root / "export" / "new_pass.py").unlink()
    (root / "models" / "configs" / "bench.json").write_text("{}")
    assert hash_files(root) != before


# Directory names that .gitignore files, packagers and structure or coverage tools take for generated
# output: a package under one of them once fell out of git (``build/`` in .gitignore).
OUTPUT_NAMES = {"build", "dist", "out", "target", "output", "_build", "site"}


def output_named_dirs(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root.parent)) for p in root.rglob("*")
                  if p.is_dir() and p.name in OUTPUT_NAMES)


def test_no_package_has_a_name_tools_take_for_output(tmp_path):
    assert not output_named_dirs(HARNESS), "rename these packages: tools skip them as generated output"
    (tmp_path / "harness" / "build").mkdir(parents=True)  # the name this layout removed is found
    assert output_named_dirs(tmp_path / "harness") == ["harness/build"]


def test_no_harness_file_is_ignored_by_git():
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = [str(p.relative_to(ROOT)) for p in HARNESS.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *files], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert not ignored, f".gitignore keeps harness source out of git: {ignored[:5]}"
