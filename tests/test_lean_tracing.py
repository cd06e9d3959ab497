"""Lowering runs under harness/export/lean.py (provenance shared instead of deep-copied, the cyclic
collector slowed): 14-30% of the demo's lowering time, and it must not change a byte of the
program. ExecuTorch reads a node's provenance to give it a debug handle (one per oldest ancestor),
which the ``.pte`` carries, so a provenance that lost its history would show in the bytes: the fixture's
program lowered without it must be the same byte for byte (one lowering, in tests/test_lower_memory.py)."""

from __future__ import annotations

import copy
import gc

import pytest

pytestmark = pytest.mark.mac


def _small_program():
    import torch

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x @ x.T).mean(dim=-1) * 2

    return torch.export.export(M(), (torch.randn(4, 3),))


def _ancestors(ep) -> dict[str, str]:
    from executorch.exir.debug_handle_utils import get_greatest_ancestor_node_identifier

    return {n.name: get_greatest_ancestor_node_identifier(n).split(".")[0]
            for n in ep.graph.nodes if n.op == "call_function" and "from_node" in n.meta}


def test_shared_provenance_names_the_same_ancestors_and_a_lost_history_would_not(monkeypatch):
    """What the debug handles are made of, after a decomposition: each node's oldest ancestor. Shared
    records name the same ones as deep copies; records that lose their history (the regression a
    careless sharing would be) name others, which is what the byte comparison in tests/test_lower_memory.py would catch."""
    from torch.fx.traceback import NodeSource

    from harness.export.lean import lean_tracing

    ep = _small_program()
    plain = _ancestors(ep.run_decompositions())
    with lean_tracing():
        lean = _ancestors(ep.run_decompositions())
    assert plain and lean == plain

    monkeypatch.setattr(NodeSource, "__deepcopy__", lambda self, memo: NodeSource(None, self.pass_name),
                        raising=False)  # a history dropped
    assert _ancestors(ep.run_decompositions()) != plain


def test_lean_tracing_is_undone_on_exit_on_error_and_when_nested():
    from torch.fx.traceback import NodeSource

    from harness.export.lean import GC_THRESHOLDS, lean_tracing

    source = NodeSource(None, "a pass")
    thresholds = gc.get_threshold()
    with lean_tracing():
        assert copy.deepcopy(source) is source
        assert gc.get_threshold()[0] == max(GC_THRESHOLDS[0], thresholds[0])
        with lean_tracing():
            pass
        assert copy.deepcopy(source) is source, "a nested exit undid the outer lean_tracing"
    assert copy.deepcopy(source) is not source and gc.get_threshold() == thresholds

    with pytest.raises(RuntimeError):
        with lean_tracing():
            raise RuntimeError("a failing lowering")
    assert copy.deepcopy(source) is not source and gc.get_threshold() == thresholds


def test_executorchs_edge_dialect_table_is_read_with_libyaml():
    """Importing executorch.exir parses its edge-dialect table (edge.yaml, 138 kB) with ruamel.yaml:
    1.9 s in pure Python, 0.3 s with ruamel.yaml.clib (measured on Zen 4 under load), paid by every
    process that exports or lowers. The regression: the C extension dropped from the environment,
    and ruamel silently falling back to its pure-Python parser."""
    import ruamel.yaml.main
    from ruamel.yaml import YAML

    assert ruamel.yaml.main.CParser is not None, "ruamel.yaml.clib is missing: pip install ruamel.yaml.clib"
    assert YAML(typ="safe").Parser is ruamel.yaml.main.CParser
    assert YAML(typ="safe", pure=True).Parser is not ruamel.yaml.main.CParser  # what the fallback would be
