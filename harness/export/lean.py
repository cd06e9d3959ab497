"""Lowering without its bookkeeping overhead, and without changing a byte of the program.

Lowering the 1.5M-parameter fixture took 75-80 s (``8da4w-fast``) on a 2-core host, and the cost
is per graph node, not per parameter: every pass retraces the whole graph with FakeTensors. Two
costs in that retrace are bookkeeping, not work on the program (measured, fixture, ``8da4w-fast``,
host B, 2026-12-05):

- **Provenance copied, not shared.** Each node a pass creates records where it came from
  (``node.meta["from_node"]``, torch.fx's ``NodeSource``), and torch builds that record with a
  ``copy.deepcopy`` of the source node's whole history. Histories grow by one level per pass
  (about 30 passes, 17 of them once per XNNPACK partition), so the copying grows with the square of
  the pass count: 42,929 deep copies, 7.2M objects, 10-12 s of a 73-79 s lowering. A ``NodeSource`` is
  never changed once built (torch builds new lists for new records), so the copy can share it:
  ExecuTorch reads the history only to find each node's oldest ancestor for its debug handles,
  which a shared history gives identically.
- **The cyclic garbage collector.** A lowering allocates millions of short-lived objects (FakeTensors,
  SymInts, sympy expressions); with Python's default thresholds the collector ran 4,500 times,
  5.3 s. Raised thresholds: 56 times, 2.7 s. Memory is still released by reference counting; only
  cycles wait longer.

Measured together (host B, quiet): the ``8da4w-fast`` fixture lowering 72.6 s -> 62.2 s, the
``8da4w`` one (123 partitions, so more passes) 114 s -> 80 s in the demo, the same ``.pte`` byte for
byte (``tests/test_lower_memory.py`` holds that; ``tests/test_lean_tracing.py`` that each part is undone on exit). Nothing here
changes what is traced: on an upgrade that makes a ``NodeSource`` mutable or renames it,
``lean_tracing`` must be revisited; the byte-identity test is what says so. Export is not traced
lean: it measured no faster (6.5 vs 6.3 s for the fixture).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

GC_THRESHOLDS = (50_000, 20, 100)  # Python's defaults are (700, 10, 10) (2000 from 3.13)


def _share_provenance(memo_self, memo):
    return memo_self


@contextmanager
def lean_tracing():
    """Share provenance records instead of deep-copying them, and collect cycles less often, for
    the duration of a lowering; both are restored on exit, also on error, also nested."""
    from torch.fx.traceback import NodeSource

    had = "__deepcopy__" in NodeSource.__dict__
    before = NodeSource.__dict__.get("__deepcopy__")
    thresholds = gc.get_threshold()
    NodeSource.__deepcopy__ = _share_provenance
    gc.set_threshold(*(max(a, b) for a, b in zip(GC_THRESHOLDS, thresholds)))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if had:
            NodeSource.__deepcopy__ = before
        else:
            del NodeSource.__deepcopy__
