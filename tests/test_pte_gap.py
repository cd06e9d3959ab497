"""Between the exported program and the .pte (harness/goldens/pte_gap.py): when the .pte moves and
the exported program does not, ExecuTorch's ETDump and Inspector name the first delegate call or
portable op whose output disagrees with the program it was lowered from. The untouched .pte names
nothing; a .pte whose one XNNPACK delegate computes something else (one torchao scale of one linear
changed before lowering, the exported program left as it was) is named at that delegate, and
everything before it is within bounds."""

from __future__ import annotations

import pytest

from harness.goldens.store import GOLDEN_PROMPTS
from harness.tolerances import TOLERANCES

pytestmark = pytest.mark.mac

TOL = TOLERANCES["pte_gap/8da4w"].atol


@pytest.fixture(scope="module")
def clean():
    from harness.export.pipeline import BuildPipeline
    from harness.goldens.pte_gap import etrecord_path
    from harness.pipeline import encode_prompt

    pipe = BuildPipeline("fixture", "8da4w")
    ids = [encode_prompt(pipe.loaded.tokenizer, p) for p in GOLDEN_PROMPTS]
    return pipe, etrecord_path(pipe), ids


def test_the_untouched_pte_names_nothing(clean):
    from harness.goldens.pte_gap import numeric_gap
    from harness.tolerances import observe

    pipe, etrecord, prompts = clean
    for ids in prompts:
        report = numeric_gap(etrecord, pipe.pte_path, ids, TOL)
        observe("pte_gap/8da4w", max(r.gap for r in report.rows))
        assert report.first is None, report.line()
        assert sum(r.kind == "delegate call" for r in report.rows) >= 50, "the ETDump lost the delegate calls"
        assert sum(r.kind == "portable op" for r in report.rows) >= 50, "the ETDump lost the portable ops"
    assert report.line().startswith("no operator of the pte moves")


def test_one_delegate_computing_something_else_is_named(clean, tmp_path):
    """The .pte's regression with the exported program unchanged: layer 2's down_proj lowered with
    every scale x2 (what a kernel reading the wrong scale would compute)."""
    from harness.export.lower import lower
    from harness.export.pt2 import load_pt2
    from harness.export.pte import write_pte
    from harness.goldens.pte_gap import numeric_gap
    from harness.program import runner_metadata

    pipe, etrecord, prompts = clean
    ep = load_pt2(pipe.pt2_path)
    weight = ep.state_dict["model.model.layers.2.mlp.down_proj.weight"]
    weight.scale.mul_(2.0)
    program, _ = lower([ep], pipe.recipe, runner_metadata(pipe.loaded, pipe.settings, pipe.recipe))
    moved = write_pte([program], tmp_path / "moved.pte")
    report = numeric_gap(etrecord, moved, prompts[0], TOL)
    first = report.first
    assert first is not None, report.line()
    line = report.line()
    # the down_proj's delegate call has several outputs (the ETDump cannot pair them): the first
    # output compared after it is layer 2's next norm, and the line names the call in between
    assert all(m.startswith("model.layers.2.") for m in first.modules), line
    between = [u for u in report.uncompared if u.order < first.order and "model.layers.2.mlp.down_proj" in u.modules]
    assert between and "not compared" in line and between[-1].name() in line, line
    assert "everything before it" in line
    before = [r for r in report.rows if r.order < first.order]
    assert len(before) > 100 and max(r.gap for r in before) <= TOL
    print(line)


def test_a_record_for_another_program_is_refused(clean):
    """The ETRecord must describe the .pte it is used with: a lowering that gives other bytes is
    refused in one line, not compared against the wrong program."""
    from harness.errors import HarnessError
    from harness.goldens.pte_gap import save_etrecord

    class Other:
        buffer = b"another program"

    with pytest.raises(HarnessError, match="another program"):
        save_etrecord(Other(), clean[1].parent / "unused.bin", "0" * 64)
