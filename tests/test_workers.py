"""The mac tier on two workers (tox -e mac: pytest-xdist): a pytest session that a test starts on a
worker (tests/test_snapshot_update.py runs real ones) is a session of its own, not a worker, though
it inherits the worker's environment. The cache's side of the workers is tests/test_cache.py."""

from __future__ import annotations

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
