"""Lowering at E2B size must fit a 16 GB laptop (tests/test_scale.py measures it): the lowering lets
go of the exported program and of the weights XNNPACK has already packed, and the program is
streamed to disk instead of joined into one more copy. None of that may change a byte of the
program: the fixture's .pte lowered without the drop must equal the cached one, lowered with it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.mac


def test_lowering_plain_writes_the_same_bytes_and_the_drop_lets_go_of_every_weight(pipeline, tmp_path):
    """One lowering serves every check on what the lowering options may not change: lowered plain
    (weights kept, no lean tracing, no ETRecord) it must write the cached program byte for byte, which
    was lowered with all three (harness/export/lean.py's shared provenance would show in the debug
    handles the .pte carries); then the drop run on it must let go of every delegated weight (the
    regression: the drop finding nothing, a renamed attribute or a Parameter type check, and the
    memory staying held)."""
    import torch
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from harness.export.lower import drop_delegated_weights, lower
    from harness.export.pte import write_pte
    from harness.program import runner_metadata

    pipe = pipeline("fp32")
    assert pipe.cache.meta("pte", pipe._key("pte")).get("etrecord_kept") is True
    kept, _ = lower(pipe.exported, pipe.recipe, runner_metadata(pipe.loaded, pipe.settings, pipe.recipe),
                    drop_weights=False, lean=False)
    written = write_pte(kept, tmp_path / "kept.pte")
    assert written.read_bytes() == pipe.pte_path.read_bytes(), (
        "the weight drop, lean tracing (harness/export/lean.py) or the kept ETRecord changed the program")

    lowered = [m for _, m, _ in get_lowered_submodules(kept.exported_program().graph_module)]
    held = sum(t.numel() * t.element_size() for m in lowered
               for t in list(m.original_module.state_dict.values()) + list(m.original_module.constants.values())
               if isinstance(t, torch.Tensor))
    assert held > 1_000_000  # the fixture's linears, FP32
    assert drop_delegated_weights(kept) == held
    assert all(t.untyped_storage().nbytes() <= t.element_size() for m in lowered
               for t in m.original_module.state_dict.values())
