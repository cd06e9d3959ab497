"""Between the exported program and the .pte (harness/goldens/pte_gap.py): when the .pte moves and
the exported program does not, ExecuTorch's ETDump and Inspector name the first delegate call or
portable op whose output disagrees with the program it was lowered from. The untouched .pte names
nothing; a .pte whose one XNNPACK delegate computes something else (one torchao scale of one linear
changed before lowering, the exported program left as it was) is named at that delegate, and
everything before it is within bounds."""

from __future__ import annotations

import pytest

from harness.goldens.store import GOLDEN_PROMPTS

pytestmark = pytest.mark.mac


@pytest.fixture(scope="module")
def clean():
    from harness.export.pipeline import BuildPipeline
    from harness.goldens.pte_gap import etrecord_path
    from harness.pipeline import encode_prompt

    pipe = BuildPipeline("fixture", "8da4w")
    ids = [encode_prompt(pipe.loaded.tokenizer, p) for p in GOLDEN_PROMPTS]
    return pipe, etrecord_path(pipe), ids


def test_the_comparator_reads_a_masked_tensor_whose_masked_places_agree():
    """An attention mask (0 and -inf) is equal to itself: the gap is 0, not nan (inf - inf). A mask
    whose -inf moved, or a finite value turned nan, is a move (inf); finite places give relative L2."""
    import math

    import torch

    from harness.goldens.pte_gap import relative_l2

    mask = torch.tensor([[0.0, -math.inf, -math.inf], [0.0, 0.0, -math.inf]])
    assert relative_l2(mask, mask.clone()) == 0.0
    assert relative_l2(mask, torch.tensor([[0.0, 0.0, -math.inf], [0.0, 0.0, -math.inf]])) == math.inf
    assert relative_l2(torch.tensor([1.0, math.nan]), torch.tensor([1.0, 2.0])) == math.inf
    assert relative_l2(torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0])) == 0.0
    a, b = torch.tensor([3.0, 4.0, -math.inf]), torch.tensor([3.0, 4.5, -math.inf])
    assert relative_l2(a, b) == pytest.approx(0.5 / 5.0)


def test_the_untouched_pte_names_nothing(clean):
    from harness.goldens.pte_gap import gap_report

    pipe, etrecord, prompts = clean
    for ids in prompts:
        report = gap_report(etrecord, pipe.pte_path, ids, "8da4w")  # observed: pte_gap/8da4w's measurement
        assert report.first is None, report.line()
        assert sum(r.kind == "delegate call" for r in report.rows) >= 50, "the ETDump lost the delegate calls"
        assert sum(r.kind == "portable op" for r in report.rows) >= 50, "the ETDump lost the portable ops"
    assert report.line().startswith("no operator of the pte moves")


def test_the_lowering_keeps_the_etrecord_and_no_second_lowering_is_made(clean):
    """The fixture's .pte was lowered with its ETRecord (etrecord_with_lowering): the gap takes the
    kept record (a cache hit), where before it lowered the program a second time (minutes)."""
    pipe, etrecord, _ = clean
    key = pipe._key("pte")
    assert pipe.cache.meta("pte", key).get("etrecord_kept") is True, "the lowering did not keep the ETRecord"
    events = [e[2] for e in pipe.cache.events if e[:2] == ("etrecord", key)]
    assert events[-1] == "hit", f"the ETRecord was lowered again: {events}"


def test_a_kept_etrecord_for_another_pte_is_not_taken(clean, tmp_path, monkeypatch):
    """A record kept by a lowering whose .pte did not land (another sha256) is dropped, and the
    record is made again from the .pte's program (here: the lowering that would make it, stopped)."""
    import types

    import harness.export.lower
    from harness.cache import ArtifactCache
    from harness.goldens.pte_gap import etrecord_path

    pipe, etrecord, _ = clean
    cache = ArtifactCache(tmp_path / "cache")
    cache.get_or_build("etrecord", "k", "etrecord.bin",
                       lambda p: (p.write_bytes(etrecord.read_bytes()), {"pte_sha256": "0" * 64})[1])

    def stopped(*a, **k):
        raise RuntimeError("lowered again")

    monkeypatch.setattr(harness.export.lower, "lower", stopped)
    stub = types.SimpleNamespace(pte_path=pipe.pte_path, cache=cache, _key=lambda stage: "k", loaded=pipe.loaded,
                                 recipe=pipe.recipe, settings=pipe.settings, exported=None, progress=lambda m: None)
    with pytest.raises(RuntimeError, match="lowered again"):
        etrecord_path(stub)
    assert cache.lookup("etrecord", "k", "etrecord.bin") is None


def test_the_untouched_fast_pte_names_nothing():
    """8da4w-fast, the default recipe for a checkpoint: its XNNPACK regions are few and large (most
    with several outputs, so not compared), and the ops between them (custom SDPA, the KV-cache
    updates, harness::q4_linear) are compared one by one."""
    from harness.export.pipeline import BuildPipeline
    from harness.goldens.pte_gap import etrecord_path, gap_report
    from harness.oplib import load_custom_ops_for_export
    from harness.pipeline import encode_prompt

    pipe = BuildPipeline("fixture", "8da4w-fast")
    load_custom_ops_for_export()  # the record's program calls llama:: ops
    etrecord = etrecord_path(pipe)
    for prompt in GOLDEN_PROMPTS:
        report = gap_report(etrecord, pipe.pte_path, encode_prompt(pipe.loaded.tokenizer, prompt), "8da4w-fast")
        assert report.first is None, report.line()
        names = " ".join(op for r in report.rows for op in r.ops)
        assert "llama_custom_sdpa" in names and "harness_q4_linear" in names, names[:500]


@pytest.fixture(scope="module")
def moved(clean, tmp_path_factory):
    """The .pte's regression with the exported program unchanged: layer 2's down_proj lowered with
    every scale x2 (what a kernel reading the wrong scale would compute)."""
    from harness.export.lower import lower
    from harness.export.pt2 import load_pt2
    from harness.export.pte import write_pte
    from harness.program import runner_metadata

    pipe = clean[0]
    ep = load_pt2(pipe.pt2_path)
    weight = ep.state_dict["model.model.layers.2.mlp.down_proj.weight"]
    weight.scale.mul_(2.0)
    program, _ = lower([ep], pipe.recipe, runner_metadata(pipe.loaded, pipe.settings, pipe.recipe))
    return write_pte([program], tmp_path_factory.mktemp("moved") / "moved.pte")


def test_one_delegate_computing_something_else_is_named(clean, moved):
    from harness.goldens.pte_gap import gap_report

    pipe, etrecord, prompts = clean
    report = gap_report(etrecord, moved, prompts[0], "8da4w", calibrating=False)
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
    assert len(before) > 100 and max(r.gap for r in before) <= report.tolerance
    print(line)


# ---- in goldens diff -----------------------------------------------------------------------------
FRANCE, SECOND = GOLDEN_PROMPTS[0], GOLDEN_PROMPTS[1]


def _moves(pte=(), exported=(), recipe="8da4w"):
    return {f"{recipe}:exported": {"moved_prompts": list(exported)}, f"{recipe}:pte": {"moved_prompts": list(pte)}}


def test_only_a_pte_that_moved_alone_is_compared():
    from harness.goldens.pte_gap import pte_moved_alone

    assert pte_moved_alone(_moves(pte=[FRANCE, SECOND]), "8da4w") == [FRANCE, SECOND]
    assert pte_moved_alone(_moves(pte=[FRANCE, SECOND], exported=[FRANCE]), "8da4w") == [SECOND]
    assert pte_moved_alone(_moves(exported=[FRANCE]), "8da4w") == []
    assert pte_moved_alone({}, "8da4w") == []


def test_goldens_diff_names_the_pte_operator_when_the_pte_moves_alone(clean, moved):
    """The line goldens diff prints, on the .pte above: the recipe, the first prompt that moved, the
    first operator beyond pte_gap/8da4w in layer 2; where the exported program moved too, nothing
    is compared (the change is upstream of lowering, and the activation line names it)."""
    from harness.goldens.pte_gap import gap_report, pte_localization_lines
    from harness.goldens.subject import fixture_subject
    from harness.pipeline import encode_prompt

    pipe, etrecord, _ = clean
    asked = []

    def gap(recipe, prompt):
        asked.append((recipe, prompt))
        return gap_report(etrecord, moved, encode_prompt(pipe.loaded.tokenizer, prompt), recipe, calibrating=False)

    lines = pte_localization_lines(fixture_subject(), _moves(pte=[SECOND, FRANCE]), progress=lambda m: None, gap=gap)
    assert asked == [("8da4w", SECOND)]
    assert len(lines) == 1 and lines[0].startswith(f"8da4w, {SECOND!r}: first operator to move in the 8da4w .pte"), lines
    assert "model.layers.2." in lines[0] and "everything before it" in lines[0], lines[0]
    assert pte_localization_lines(fixture_subject(), _moves(pte=[FRANCE], exported=[FRANCE]), gap=gap) == []
    assert len(asked) == 1


def test_a_recipe_without_a_calibrated_gap_says_so_and_lowers_nothing():
    from harness.goldens.pte_gap import pte_localization_lines
    from harness.goldens.subject import fixture_subject

    def gap(*args):
        raise AssertionError("compared without a tolerance")

    lines = pte_localization_lines(fixture_subject(), _moves(pte=[FRANCE], recipe="fp32"), gap=gap)
    assert lines == ["fp32:pte moved and fp32:exported did not, on 1 prompt(s); its operators are not compared: "
                     "no pte_gap/fp32 tolerance is calibrated (harness/tolerances.py)"]


def test_the_diff_records_which_prompts_moved_at_each_stage(goldens_copy, computed_goldens):
    """What pte_localization_lines reads: a clear-margin token of the 8da4w .pte tampered in its
    golden moves that prompt at the pte stage only."""
    import json

    from harness.goldens.refresh import assess
    from harness.goldens.store import token_golden_path

    gen = computed_goldens.runs[("8da4w", "pte", FRANCE)]
    top = gen.step_logits[3].topk(2)
    path = token_golden_path("8da4w", "pte", FRANCE)
    record = json.loads(path.read_text())
    record["ids"][3] = int(top.indices[1])
    path.write_text(json.dumps(record))
    moves = assess(computed_goldens, llamacpp=False).moves
    assert moves["8da4w:pte"]["moved_prompts"] == [FRANCE]
    assert all(m["moved_prompts"] == [] for k, m in moves.items() if k != "8da4w:pte"), moves


def test_a_record_for_another_program_is_refused(clean):
    """The ETRecord must describe the .pte it is used with: a lowering that gives other bytes is
    refused in one line, not compared against the wrong program."""
    from harness.errors import HarnessError
    from harness.goldens.pte_gap import save_etrecord

    class Other:
        buffer = b"another program"

    with pytest.raises(HarnessError, match="another program"):
        save_etrecord(Other(), clean[1].parent / "unused.bin", "0" * 64)
