"""The mac tier on two workers (tox -e mac: pytest-xdist): a pytest session that a test starts on a
worker (tests/test_snapshot_update.py runs real ones) is a session of its own, not a worker, though
it inherits the worker's environment; and each group of tests (a module, or every test on the
generated checkpoint) runs on one worker, so that its fixtures are built once. The cache's side of
the workers is tests/test_cache.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import XDIST_NAMES, forget_inherited_worker

pytestmark = pytest.mark.mac
TESTS = Path(__file__).resolve().parent

WORKER = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2", "PYTEST_XDIST_TESTRUNUID": "abc"}


def test_the_worker_keeps_its_names_and_notes_its_pid():
    environ = dict(WORKER)
    assert forget_inherited_worker(environ, 4242) is False
    assert environ == {**WORKER, "HARNESS_XDIST_WORKER_PID": "4242"}
    assert forget_inherited_worker(environ, 4242) is False, "a second look from the worker dropped its names"


def test_a_process_the_worker_started_drops_them():
    environ = {**WORKER, "HARNESS_XDIST_WORKER_PID": "4242", "HOME": "/root"}
    assert forget_inherited_worker(environ, 4343) is True
    assert environ == {"HOME": "/root"}


def test_outside_xdist_nothing_changes():
    environ = {"HOME": "/root"}
    assert forget_inherited_worker(environ, 4242) is False and environ == {"HOME": "/root"}


CHILD = ("import os, sys; from support import forget_inherited_worker; "
         "sys.argv[1] == 'forget' and forget_inherited_worker(os.environ, os.getpid()); "
         "from syrupy.utils import is_xdist_worker; print(is_xdist_worker())")


@pytest.mark.parametrize("forget, worker", [("forget", "False"), ("keep", "True")])
def test_syrupy_in_a_child_of_the_worker_is_not_on_a_worker(forget, worker):
    """The regression and its fix in a real child process: with this process as the worker, syrupy in
    the child takes itself for a worker unless the child forgets the inherited names."""
    env = {**os.environ, **WORKER, "HARNESS_XDIST_WORKER_PID": str(os.getpid()),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", CHILD, forget], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == worker


def test_the_names_forgotten_are_the_ones_xdist_sets():
    import inspect

    remote = pytest.importorskip("xdist.remote")  # the module that runs in each worker
    source = inspect.getsource(remote)
    for name in XDIST_NAMES:
        assert name in source, f"xdist no longer sets {name}: forget_inherited_worker is out of date"


# ---- each group on one worker -------------------------------------------------------------------
def _spread(tmp_path: Path, dist: str) -> dict[str, dict]:
    """The mac tier collected as the tox env runs it (two workers, ``--dist DIST``), each test
    reported passed without running (tests/support/dry_run.py): test id -> its worker and groups."""
    tmp_path.mkdir(parents=True)
    env = dict(os.environ, HARNESS_DRY_RUN_DIR=str(tmp_path))
    for name in XDIST_NAMES + ("HARNESS_XDIST_WORKER_PID",):
        env.pop(name, None)  # a session of its own, with workers of its own
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "mac", "-n", "2", "--dist", dist,
                           "--no-loadscope-reorder", "-p", "support.dry_run", "-p", "no:cacheprovider", "-q"],
                          cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [json.loads(line) for part in sorted(tmp_path.glob("ran.*")) for line in part.read_text().splitlines()]
    return {r["id"].split("@")[0]: r for r in ran}


def _groups_on_several_workers(ran: dict[str, dict]) -> dict[str, set[str]]:
    workers: dict[str, set[str]] = {}
    for r in ran.values():
        for group in r["groups"] or ["(none)"]:
            workers.setdefault(group, set()).add(r["worker"])
    return {g: w for g, w in workers.items() if len(w) > 1}


def test_each_group_of_the_tier_runs_on_one_worker(tmp_path):
    """Two ways ``--dist loadgroup`` grouped nothing and said nothing: conftest.py marked the tests
    only where ``--dist`` read loadgroup, which xdist sets to "no" on its workers (their collection
    is the one scheduled); and pytest 9.2 gives tests structured ids, while xdist 3.8 writes the
    group into the old string field (pytest-xdist#1386). Either way the generated checkpoint was
    recorded on both workers (its lowering 231.6 s and 209.6 s, the same .pte) and each module's
    fixtures built twice. pyproject.toml keeps pytest below 9.2 until xdist follows."""
    ran = _spread(tmp_path / "grouped", "loadgroup")
    assert len({r["worker"] for r in ran.values()}) == 2, "one worker ran the whole tier"
    assert all(r["groups"] for r in ran.values()), [i for i, r in ran.items() if not r["groups"]][:5]
    assert not _groups_on_several_workers(ran), _groups_on_several_workers(ran)
    yours = {i for i, r in ran.items() if r["groups"] == ["yours"]}
    assert any(i.startswith("tests/test_matrix.py::") for i in yours) and len(yours) > 10, sorted(yours)
    # the check can fail: with the groups ignored (--dist load, as pytest 9.2 made loadgroup), modules split
    split = _groups_on_several_workers(_spread(tmp_path / "ungrouped", "load"))
    assert "yours" in split and len(split) > 5, split
