"""A pytest plugin (``-p support.dry_run``) that runs no test: each one is reported passed at once,
and its worker, test id and ``xdist_group`` marks go to ``$HARNESS_DRY_RUN_DIR/ran.<worker>``, one
JSON line each. tests/test_workers.py reads them to see how xdist spread the tier over its workers
without the tier's 25 minutes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    from _pytest.reports import TestReport

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    groups = sorted(str(m.args[0] if m.args else m.kwargs.get("name")) for m in item.iter_markers("xdist_group"))
    with open(Path(os.environ["HARNESS_DRY_RUN_DIR"]) / f"ran.{worker}", "a") as f:
        f.write(json.dumps({"worker": worker, "id": item.nodeid, "groups": groups}) + "\n")
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    item.ihook.pytest_runtest_logreport(report=TestReport(item.nodeid, item.location, {}, "passed", None, "call", [], 0.0))
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
