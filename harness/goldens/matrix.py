"""``harness goldens matrix``: a compatibility matrix of real releases.

For each release (a pip requirement such as ``transformers==5.23.0``) it makes an environment of its
own, installs the release there beside the pinned stack, checks that the model loads, runs
``harness goldens diff --json`` in it and writes one row: whether it installs (and if not, why, in
pip's words: "needs kernels>=0.19.1"), whether it loads, the verdict, each stage's move and the time.

An environment is the release alone, layered over this one: a venv whose ``site-packages`` comes
first on ``sys.path`` and which then adds this environment's ``site-packages`` (a ``.pth`` line), so
it holds only what the release changes and torch stays this environment's, pinned by a constraint
(``torch==2.13.0``): a release that needs another torch is a row that says so, never a multi-GB
download. Environments are cached under ``--envs`` (default: the artifact cache's ``matrix/``),
keyed by the release and this environment; a release that does not install is a row, not a crash.
The artifact cache is shared: it is keyed by the library versions, so a row reuses the artifacts of
an earlier row with the same stack and builds its own otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.errors import HarnessError

DEFAULT_RELEASES = (
    "transformers~=5.22.0", "transformers==5.23.0", "transformers==5.24.0", "transformers==5.25.0",
    "torchao==0.17.0", "torchao==0.18.0", "executorch==1.5.0", "executorch==1.5.1",
)
CONSTRAINTS = ("torch==2.13.0",)  # the CPU wheel this project pins; nothing in the matrix may replace it
WATCHED = ("transformers", "torch", "torchao", "executorch", "huggingface_hub", "tokenizers")
ROW_TIMEOUT_S = 3 * 3600


@dataclass
class Row:
    release: str
    installs: str  # "yes", "no: <why>", "only with --no-deps (<why>)"
    versions: dict = field(default_factory=dict)
    loads: str = ""
    verdict: str = ""
    exit: int | None = None
    stages: dict = field(default_factory=dict)  # "recipe:stage" -> {"prompts", "ids_changed", "max_logprob"}
    seconds: float = 0.0
    note: str = ""


# ---- the environment ---------------------------------------------------------------------------
def _this_site_packages() -> list[str]:
    paths = [p for p in site.getsitepackages() if Path(p).is_dir()]
    return paths or [sysconfig.get_paths()["purelib"]]


def env_dir(release: str, root: Path, pip_args=()) -> Path:
    """One directory per release, base environment and pip arguments (another base or index is
    another layer)."""
    base = hashlib.sha256(("\n".join([sys.prefix, *_this_site_packages(), *pip_args])).encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", release).strip("-")
    return root / f"{slug}-{base}"


def _env_python(env: Path) -> Path:
    return env / "bin" / "python"


def _make_layer(env: Path) -> None:
    """A venv without pip of its own (this environment's pip runs in it, through the layer)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
    purelib = subprocess.run([str(_env_python(env)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    lines = [f"import site; site.addsitedir({p!r})" for p in _this_site_packages()]
    (Path(purelib) / "zz_harness_matrix_base.pth").write_text("\n".join(lines) + "\n")


def why_not(pip_output: str) -> str:
    """pip's reason in a few words: 'needs kernels>=0.19.1', 'needs torch==2.12.0', or its last error."""
    missing = re.findall(r"No matching distribution found for ([^\s]+)", pip_output)
    python = re.findall(r"Requires-Python (\S+)", pip_output) or re.findall(r"requires a different Python: \S+ not in '([^']+)'", pip_output)
    # the Python reason only where the release itself was skipped for it (pip lists every skipped candidate)
    pinned = re.findall(r"==([^\s,;]+)", missing[-1]) if missing else []
    if python and (not missing or (pinned and re.search(rf"\b{re.escape(pinned[-1])} Requires-Python", pip_output))
                   or "requires a different Python" in pip_output):
        return f"requires Python {python[-1]}"
    if missing:
        return f"needs {missing[-1]} (not in the registry)"
    conflicts = re.findall(r"^\s*(\S+ \S+) depends on (\S+)", pip_output, flags=re.M)
    if conflicts:
        by, needs = conflicts[-1]
        return f"{by} needs {needs} (this stack pins {', '.join(CONSTRAINTS)})"
    errors = [l.strip() for l in pip_output.splitlines() if l.strip().startswith("ERROR")]
    return (errors or [l for l in pip_output.splitlines() if l.strip()] or ["pip failed"])[-1][:160]


def _pip(env: Path, release: str, no_deps: bool, pip_args: list[str], constraints: Path) -> tuple[int, str]:
    """pip of this environment, run by the layer's interpreter (so it installs into the layer)."""
    cmd = [str(_env_python(env)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "-c", str(constraints), *(["--no-deps"] if no_deps else []), *pip_args, release]
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr


def prepare(release: str, root: Path, pip_args: list[str], say=print, no_deps: bool = False) -> tuple[Path, str]:
    """The release's environment (cached) and how it installed: 'yes', 'only with --no-deps (...)',
    'with --no-deps, as asked', or 'no: ...' (then there is nothing to run)."""
    env = env_dir(release + (" --no-deps" if no_deps else ""), root, pip_args)
    record = env / "matrix-install.json"
    if record.is_file():
        return env, json.loads(record.read_text())["installs"]
    partial = env.with_name(env.name + ".partial")
    if partial.exists():
        import shutil

        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    say(f"matrix: {release}: making its environment")
    _make_layer(partial)
    constraints = partial / "constraints.txt"
    constraints.write_text("\n".join(CONSTRAINTS) + "\n")
    rc, out = _pip(partial, release, no_deps, pip_args, constraints)
    installs = "with --no-deps, as asked" if no_deps else "yes"
    if rc != 0 and no_deps:
        installs = f"no: {why_not(out)}"
    elif rc != 0:
        reason = why_not(out)
        rc, out2 = _pip(partial, release, True, pip_args, constraints)
        installs = f"only with --no-deps ({reason})" if rc == 0 else f"no: {reason}"
    if installs.startswith("no:"):  # not cached: the next run asks pip again (a registry can change)
        import shutil

        shutil.rmtree(partial, ignore_errors=True)
        return env, installs
    (partial / "matrix-install.json").write_text(json.dumps({"release": release, "installs": installs}))
    partial.rename(env)  # a venv finds its prefix from its interpreter's path: renaming it is safe
    return env, installs


# ---- one row -----------------------------------------------------------------------------------
def _versions(python: Path) -> dict:
    from harness.goldens.upgrade import installed_versions

    try:
        return installed_versions(WATCHED, python=str(python))
    except (subprocess.CalledProcessError, ValueError):
        return {}


PROBE = """
import sys
from harness.models.spec import load_model
import torch
m = load_model(sys.argv[1])
ids = torch.tensor([m.tokenizer("The capital of France is")["input_ids"]])
with torch.no_grad():
    logits = m.model(input_ids=ids).logits
assert torch.isfinite(logits).all(), "non-finite logits"
print(type(m.model).__name__)
"""


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith(("harness:", "Traceback")) or "Error" in l]
    return ((errors or lines or ["(no output)"])[-1])[:200]


def run_row(release: str, root: Path, pip_args: list[str], diff_args: list[str], say=print,
            no_deps: bool = False) -> Row:
    t0 = time.perf_counter()
    env, installs = prepare(release, root, pip_args, say, no_deps)
    row = Row(release, installs)
    if installs.startswith("no:"):
        row.seconds = time.perf_counter() - t0
        return row
    python = _env_python(env)
    row.versions = _versions(python)
    model = diff_args[diff_args.index("--model") + 1] if "--model" in diff_args else "fixture"
    # no USE_HUB_KERNELS here: keeping hub kernels off is the harness's own job (harness/__init__.py,
    # use_kernels=False on every load), and a row must show that it does it under each release
    env_vars = {k: v for k, v in os.environ.items() if k != "USE_HUB_KERNELS"} | {"PYTHONUNBUFFERED": "1"}
    try:
        probe = subprocess.run([str(python), "-c", PROBE, model], capture_output=True, text=True, env=env_vars,
                               stdin=subprocess.DEVNULL, timeout=ROW_TIMEOUT_S)
        row.loads = "yes" if probe.returncode == 0 else f"no: {_last_line(probe.stderr or probe.stdout)}"
    except subprocess.TimeoutExpired:
        row.loads = f"no: timed out after {ROW_TIMEOUT_S} s"
    if row.loads != "yes":
        row.seconds = time.perf_counter() - t0
        return row
    say(f"matrix: {release}: goldens diff ({', '.join(f'{k} {v}' for k, v in row.versions.items() if v)})")
    report = env / "diff.json"
    report.unlink(missing_ok=True)
    try:
        done = subprocess.run([str(python), "-m", "harness", "goldens", "diff", "--json", str(report), *diff_args],
                              capture_output=True, text=True, env=env_vars, stdin=subprocess.DEVNULL, timeout=ROW_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        row.verdict, row.seconds = f"timed out after {ROW_TIMEOUT_S} s", time.perf_counter() - t0
        return row
    row.exit = done.returncode
    (env / "diff.log").write_text(done.stdout + done.stderr)
    if done.returncode in (0, 1) and report.is_file():
        summary = json.loads(report.read_text())
        row.stages = summary["stages"]
        row.verdict = ("no golden changed" if done.returncode == 0 else
                       f"{summary['changes']} change(s), " + (f"{summary['blockers']} blocking" if summary["blockers"]
                                                               else "all numerics"))
    else:
        row.verdict = f"error (exit {done.returncode}): {_last_line(done.stderr or done.stdout)}"
    row.seconds = time.perf_counter() - t0
    return row


# ---- the table ---------------------------------------------------------------------------------
def _cell(move: dict | None) -> str:
    if not move:
        return ""
    lp = move.get("max_logprob")
    ids = "=" if not move["ids_changed"] else f"≠ {move['ids_changed']}/{move['prompts']}"
    return ids + ("" if lp is None else f" {lp:.2g}")


def _stage_order(stage: str) -> tuple:
    """The chain's order: the reference recipe first, each recipe's stages as harness/goldens/store.py lists them."""
    from harness.goldens.store import STAGES

    recipe, _, name = stage.rpartition(":")
    order = [*STAGES, "native"]
    return (0 if recipe == "fp32" or recipe.startswith("reference-") else 1, recipe,
            order.index(name) if name in order else len(order), name)


def table(rows: list[Row], header: str = "") -> str:
    stages = sorted({s for r in rows for s in r.stages}, key=_stage_order)
    cols = ["release", "resolved", "installs", "loads", "verdict", *stages, "time"]
    out = [header] if header else []
    out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        resolved = ", ".join(f"{k} {v}" for k, v in r.versions.items() if v and k in ("transformers", "torchao",
                                                                                      "executorch", "torch"))
        cells = [r.release, resolved, r.installs, r.loads or "-", r.verdict or "-",
                 *(_cell(r.stages.get(s)) for s in stages), f"{r.seconds:.0f} s"]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    out.append("")
    out.append("A stage cell: `=` its token ids equal the goldens on every prompt, `≠ k/n` on k of n prompts "
               "they differ; then the largest log-prob move at any recorded position (nats).")
    return "\n".join(out) + "\n"


def _header(record: dict) -> str:
    from harness.bench.host import describe

    return f"- Measured {record['date']} on {describe(record['host'])}: `{record['command']}`\n"


def render(records: list[dict]) -> str:
    """The markdown of one or more matrix runs (their JSON), rows in order, each run's header named."""
    rows = [Row(**r) for rec in records for r in rec["rows"]]
    return table(rows, "".join(_header(rec) for rec in records) + "\n")


def matrix(releases, out: Path | None, root: Path, pip_args: list[str], diff_args: list[str], say=print,
           no_deps: bool = False) -> list[Row]:
    from harness.atomic import write_bytes_atomic
    from harness.bench.host import host_info

    rows = []
    for release in releases:
        row = run_row(release, root, pip_args, diff_args, say, no_deps)
        say(f"matrix: {release}: installs {row.installs}; loads {row.loads or '-'}; {row.verdict or '-'} "
            f"({row.seconds:.0f} s)")
        rows.append(row)
    record = {"date": time.strftime("%Y-%m-%d"), "host": host_info(),
              "command": f"harness goldens matrix{' --no-deps' if no_deps else ''} {' '.join(releases)}"
                         + "".join(" " + a for a in diff_args),
              "rows": [asdict(r) for r in rows]}
    text = render([record])
    say(text)
    if out is not None:
        write_bytes_atomic(out.with_suffix(".json"), json.dumps(record, indent=1).encode(),
                           verify=lambda p: json.loads(p.read_text()))
        write_bytes_atomic(out, text.encode())
    return rows


def default_root() -> Path:
    from harness.cache import cache_root

    return cache_root() / "matrix"


def check_releases(releases) -> list[str]:
    from harness.goldens.upgrade import name_of

    bad = [r for r in releases if not name_of(r)]
    if bad:
        raise HarnessError(f"not a pip requirement: {bad[0]!r}", "name releases as pip does, e.g. transformers==5.23.0")
    return list(releases)
