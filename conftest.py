"""Shared fixtures: one lazily built, cached pipeline per (model, recipe); hypothesis profiles."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support import BENCH_STATE, PROFILE, RECIPE_NAMES, corpus, forget_inherited_worker  # (tests/support)


# a pytest that a test starts under an xdist worker is not a worker (tests/support: forget_inherited_worker)
forget_inherited_worker(os.environ, os.getpid())

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the Pi 5 runs the pi5 tier with pytest and pytest-benchmark only
    settings = None
if settings is not None:
    quiet = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
    settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True,
                              suppress_health_check=quiet)
    settings.register_profile("dev", deadline=None, suppress_health_check=quiet)
    settings.register_profile("debug", deadline=None, verbosity=3, print_blob=True, suppress_health_check=quiet)
    settings.load_profile(PROFILE)


@pytest.fixture(scope="session")
def fixture_answers() -> dict[str, str]:
    return {row["prompt"]: row["answer"] for row in corpus()}


@pytest.fixture(scope="session")
def pipeline():
    """``pipeline(recipe, model="fixture")``: one Pipeline per key per session; its .pt2/.pte
    come from the artifact cache when their key matches."""
    from harness.pipeline import Pipeline

    made: dict = {}

    def get(recipe: str = "fp32", model: str = "fixture") -> Pipeline:
        key = (model, recipe)
        if key not in made:
            made[key] = Pipeline(model, recipe)
        return made[key]

    return get


# ---- goldens ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def stage_runs(pipeline):
    """``stage_runs(recipe, stage, prompt)`` -> Generation, computed once per session; ``.chain``
    gives every stage's run of a prompt, keyed (recipe, stage), for failure explanations."""
    from harness.goldens.store import MAX_NEW_TOKENS, chain

    memo: dict = {}

    def run(recipe: str, stage: str, prompt: str):
        key = (recipe, stage, prompt)
        if key not in memo:
            memo[key] = pipeline(recipe).run_stage(stage, prompt, MAX_NEW_TOKENS)
        return memo[key]

    def whole(prompt: str, recipes=tuple(RECIPE_NAMES)) -> dict:
        return {(r, s): run(r, s, prompt) for r, s in chain(recipes)}

    run.chain = whole
    return run


@pytest.fixture(scope="session")
def computed_goldens(stage_runs, pipeline):
    """The whole golden set as this stack computes it (harness.goldens.refresh.compute), from the
    session's own runs: what `harness goldens diff/update` would compute, computed once."""
    from harness.goldens.refresh import compute

    return compute(run=stage_runs, pipeline=pipeline, progress=lambda msg: None)


def pytest_configure(config):
    """Goldens are rewritten only through the gate. Under syrupy's ``--snapshot-update`` the token
    goldens' snapshots (tests/support/snapshots.py) write nothing themselves; the gate runs on the
    whole set at the session's end (``pytest_sessionfinish`` below). Without syrupy the flag is refused."""
    if config.getoption("--snapshot-update-new-only", default=False):
        raise pytest.UsageError(
            "--snapshot-update-new-only would write a part of the golden set: use --snapshot-update (the gate "
            "on the whole set) or `harness goldens update` (docs/goldens.md)")
    if config.getoption("--snapshot-update", default=False) and getattr(config.option, "numprocesses", None):
        raise pytest.UsageError(
            "--snapshot-update runs the gate once, on the whole set, in one process: run it without xdist "
            "(pytest -m mac --snapshot-update, or tox -e mac -- -n 0 --snapshot-update)")
    if config.getoption("--snapshot-update", default=False) and not config.pluginmanager.hasplugin("syrupy"):
        raise pytest.UsageError(
            "--snapshot-update needs syrupy (pip install -e '.[dev]'); or run `harness goldens update`, which "
            "recomputes the whole set and writes it only if every change is numerics (docs/goldens.md)")


@pytest.fixture
def token_snapshot(snapshot):
    """``token_snapshot(recipe, stage, prompt) == token_record(...)``: a syrupy assertion on the token
    golden's own file (tests/support/snapshots.py)."""
    from support.snapshots import TokenGoldenExtension, snapshot_index

    ext = snapshot.use_extension(TokenGoldenExtension)
    return lambda recipe, stage, prompt, model="fixture": ext(name=snapshot_index(recipe, stage, prompt, model))


def _snapshot_update_gate(session) -> None:
    """``pytest --snapshot-update``: where a token golden differed, ``harness goldens update``'s gate on
    the whole set (never the part a ``-k`` selected): it writes every golden and the provenance when
    every change is numerics, or nothing, and then this session fails with the gate's lines."""
    if not getattr(session.config.option, "update_snapshots", False):
        return
    from support.snapshots import REQUESTED

    say = session.config.pluginmanager.get_plugin("terminalreporter").write_line
    if not REQUESTED:
        say("snapshot-update: no token golden differs; nothing to update")
        return
    from harness.errors import HarnessError
    from harness.goldens.refresh import update_main

    say(f"snapshot-update: {len(REQUESTED)} token golden(s) differ; the gate of `harness goldens update` "
        "recomputes and judges the whole set:")
    try:
        rc = update_main(say=say, progress=lambda msg: None)
    except HarnessError as e:
        say(f"snapshot-update: error: {e}")
        rc = 2
    verdict = ("snapshot-update: REFUSED; no golden was written" if rc != 0 else
               "snapshot-update: the gate accepted; the whole golden set and the provenance were written")
    say(verdict)
    session.config.stash[_GATE_VERDICT] = verdict
    if rc != 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_GATE_VERDICT = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The gate's verdict again, last: syrupy's own summary ("N snapshots updated") prints after the
    session finished and counts what it asked for, not what the gate wrote."""
    if _GATE_VERDICT in config.stash:
        terminalreporter.write_line(config.stash[_GATE_VERDICT])


def pytest_report_header(config):
    from harness.errors import HarnessError
    from harness.goldens.provenance import stack_note

    try:
        note = stack_note()
    except HarnessError as e:
        return f"goldens: {e}"
    return "goldens: recorded under this exact stack" if not note else f"goldens: {note}"


@pytest.fixture(scope="session")
def golden_tokens_for():
    """Read a committed token golden: ``golden_tokens_for(recipe, stage, prompt)`` -> ids."""
    from harness.goldens.store import golden_ids

    return golden_ids


# ---- benchmark tiers (bench: this host; pi5: the device) ------------------------------------------
def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.hasplugin("syrupy"):  # where syrupy is installed it registers the option itself
        parser.addoption("--snapshot-update", action="store_true",
                         help="refused: goldens are rewritten only by `harness goldens update` (the gate)")
    yours = parser.getgroup("your model (tests/test_your_goldens.py)")
    yours.addoption("--harness-model", metavar="DIR", default=os.environ.get("HARNESS_MODEL"),
                    help="your Gemma 4 checkpoint directory: its recorded goldens are checked stage by stage "
                         "(default $HARNESS_MODEL; record them first with harness goldens update --model DIR)")
    yours.addoption("--harness-goldens", metavar="DIR", default=os.environ.get("HARNESS_MODEL_GOLDENS"),
                    help="where --harness-model's goldens are (goldens update --goldens DIR; default "
                         "$HARNESS_MODEL_GOLDENS, else the repository's goldens/)")
    group = parser.getgroup("harness benchmarks")
    group.addoption("--pi5-force", action="store_true",
                    help="run the pi5 tier on a machine that is not a Raspberry Pi 5 (a dry run)")
    group.addoption("--pi5-bundle", default=os.environ.get("HARNESS_PI5_BUNDLE"),
                    help="the bundle built by `harness bench bundle DIR` (default $HARNESS_PI5_BUNDLE)")
    group.addoption("--pi5-emulate", metavar="CPU",
                    help="run the bundle's aarch64 runner under qemu-user as CPU (e.g. cortex-a76) on this host: "
                         "a dry run of the whole pi5 tier; every rate is marked emulated")
    group.addoption("--pi5-qemu", metavar="QEMU",
                    help="the qemu-user program for --pi5-emulate (default: qemu-aarch64-static or qemu-aarch64 on PATH)")
    group.addoption("--power-meter-cmd", default=os.environ.get("HARNESS_POWER_METER_CMD"),
                    help="a shell command that prints the board's draw in watts (external meter); "
                         "default on a Pi 5: its PMIC through vcgencmd pmic_read_adc")


@pytest.fixture(scope="session")
def bench_failures() -> dict:
    return BENCH_STATE["failures"]


@pytest.fixture(scope="session")
def bench_bandwidth():
    """This machine's memory read bandwidth, measured once per run with the benchmark's threads."""
    from harness.bench.roofline import read_bandwidth

    threads = int(os.environ.get("HARNESS_BENCH_THREADS", 0) or os.cpu_count() or 1)
    # the pi5 tier on the device: the bundle's native runner has a read loop too (no numpy there)
    BENCH_STATE["bandwidth"] = bw = read_bandwidth(threads, runner=BENCH_STATE.get("runner_command"))
    return bw


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """The run's context beside pytest-benchmark's figures: board, governor, throttling before and
    after, memory bandwidth, library versions, and each runtime that could not be built and why."""
    from dataclasses import asdict

    from harness.bench import device
    from harness.versions import library_versions

    from harness.bench.host import host_info

    state = dict(BENCH_STATE)
    bw = state.get("bandwidth")
    output_json["harness"] = {
        # the CPU, its ISA features, caches and thread placement: a rate is only comparable with these
        "host": host_info(int(os.environ.get("HARNESS_BENCH_THREADS", 0) or os.cpu_count() or 1)),
        "board": device.board_model(),
        "governor": device.cpu_governor(),
        "throttled_before": state.get("throttled_before"),
        "throttled_after": device.throttled(),
        "bandwidth": asdict(bw) if bw else None,
        "idle_w": state.get("idle_w"),
        "libraries": library_versions(),
        "failures": state["failures"],
        # a rate measured under qemu is the emulator's, never the board's
        "emulated": f"qemu {state['emulated']}" if state.get("emulated") else None,
        "bundle": state.get("bundle"),
    }


@pytest.hookimpl(trylast=True)  # after syrupy's own finish, which queues the snapshot writes
def pytest_sessionfinish(session, exitstatus):
    _snapshot_update_gate(session)
    _tolerance_report()


def _tolerance_report() -> None:
    """HARNESS_TOLERANCE_REPORT=FILE: the largest value each named tolerance saw in this run. Under
    xdist each worker writes FILE.gwN, and the controller, finishing last, merges them into FILE."""
    path = os.environ.get("HARNESS_TOLERANCE_REPORT")
    if not path:
        return
    from harness.tolerances import OBSERVED

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        Path(f"{path}.{worker}").write_text(json.dumps(OBSERVED, sort_keys=True))
        return
    merged = {name: dict(seen) for name, seen in OBSERVED.items()}
    for part in sorted(Path(path).parent.glob(Path(path).name + ".gw*")):
        for name, seen in json.loads(part.read_text()).items():
            into = merged.setdefault(name, {})
            for field, value in seen.items():
                into[field] = max(into.get(field, value), value)
        part.unlink()
    Path(path).write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


# ---- the tier on several workers (tox -e mac: pytest-xdist, -n 2 --dist loadgroup) ---------------
# Each module runs on one worker (its module fixtures built once), the tests on the generated
# checkpoint (tests/conftest.py's session fixtures) together, and the longest groups first, so
# that no worker is left with a long one at the end (measured cold on 2 cores, 2026-12-07).
LONGEST_FIRST = ("yours", "test_pte_gap", "test_preflight", "test_bench_tools",
                 "test_lower_memory", "test_snapshot_update", "test_native", "test_golden_refresh")
_YOURS = {"your_checkpoint", "your_recorded"}


def _group(item) -> str:
    return "yours" if _YOURS & set(getattr(item, "fixturenames", ())) else item.path.stem


def _loadgroup(config) -> bool:
    """Whether this process collects for ``--dist loadgroup``: the controller says so in ``dist``;
    a worker, whose ``dist`` xdist sets to "no", in ``loadgroup``. The workers' collection is the one
    that counts (xdist reads the group marks into their test ids, and schedules in their order), so
    a check on ``dist`` alone sorted nothing on the workers (tests/test_workers.py)."""
    return config.getvalue("dist") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group marks into the test ids
def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:  # (marked under any --dist: tests/test_workers.py reads them under --dist load too)
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    if _loadgroup(config):
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_group(item), len(rank)))  # stable: the rest keep their order


FIXTURE_PROGRAMS = ("8da4w", "8da4w-fast", "fp32")  # the fixture's .pte files, the longest to lower first


@pytest.fixture(scope="session", autouse=True)
def _lower_in_turn(request):
    """Under xdist, before its first test, each worker lowers the fixture programs that no other
    worker is lowering (starting at its own place in the list, skipping any whose claim another
    holds), so that the three lowerings run side by side instead of one worker waiting on the
    other's. Only where the session has tests on the fixture's pipelines."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not any("pipeline" in getattr(i, "fixturenames", ()) for i in request.session.items):
        return
    from harness.pipeline import Pipeline

    pipeline = request.getfixturevalue("pipeline")
    start = int(worker[2:]) % len(FIXTURE_PROGRAMS)
    for recipe in FIXTURE_PROGRAMS[start:] + FIXTURE_PROGRAMS[:start]:
        p: Pipeline = pipeline(recipe)
        with p.cache.claim("lowering", p._key("pte"), wait=False) as mine:
            if mine:
                p.pte_path
