"""The refresh flow: `harness goldens diff` (0: nothing changed, 1: something did, 2: an error) and
`harness goldens update [--allow REASON]`, the one writer of goldens, behind its gate. Run on copies
of the committed goldens (HARNESS_GOLDENS_DIR) with the session's own computed set, so nothing is
computed twice; one test runs the real command line."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from support import tree_bytes
import torch

from harness.goldens.store import GOLDEN_PROMPTS, goldens_dir, token_golden_path

pytestmark = pytest.mark.mac
FRANCE = GOLDEN_PROMPTS[0]


def _tamper_clear_margin(computed, recipe="fp32", stage="pte", prompt=FRANCE, pos=3) -> int:
    """Write another token into one golden where the running stack's top-2 margin is clear."""
    gen = computed.runs[(recipe, stage, prompt)]
    top = gen.step_logits[pos].topk(2)
    assert float(top.values[0] - top.values[1]) > 4
    path = token_golden_path(recipe, stage, prompt)
    record = json.loads(path.read_text())
    record["ids"][pos] = int(top.indices[1])
    path.write_text(json.dumps(record))
    return int(top.indices[1])


def test_diff_names_a_tampered_golden_and_update_refuses_then_allows(goldens_copy, computed_goldens, capsys):
    from harness.goldens.refresh import diff_main, update_main

    _tamper_clear_margin(computed_goldens)
    assert diff_main(computed=computed_goldens) == 1
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("- [tokens]"))
    assert repr(FRANCE) in line and "first diverging stage fp32:pte at generated position 3" in line, out
    assert "BLOCKS the refresh" in line and "clear-margin" in line

    before = tree_bytes(goldens_copy)
    assert update_main(computed=computed_goldens) == 1
    assert "nothing was written" in capsys.readouterr().out
    assert tree_bytes(goldens_copy) == before, "a refused update changed files"

    assert update_main(allow="testing the gate", computed=computed_goldens) == 0
    capsys.readouterr()
    prov = json.loads((goldens_copy / "provenance.json").read_text())
    entry = prov["accepted_over_the_gate"][-1]
    assert entry["reason"] == "testing the gate" and any(repr(FRANCE) in b for b in entry["blocked"])
    assert entry["date"] and entry["recorded_stack"] and entry["new_stack"]
    assert json.loads(token_golden_path("fp32", "pte", FRANCE).read_text())["ids"] == \
        computed_goldens.runs[("fp32", "pte", FRANCE)].ids
    assert diff_main(computed=computed_goldens) == 0, capsys.readouterr().out


def test_allowed_refreshes_are_appended_never_rewritten(goldens_copy, computed_goldens, capsys):
    from harness.goldens.refresh import update_main

    for reason in ("first", "second"):
        _tamper_clear_margin(computed_goldens)
        assert update_main(allow=reason, computed=computed_goldens) == 0
    capsys.readouterr()
    history = json.loads((goldens_copy / "provenance.json").read_text())["accepted_over_the_gate"]
    assert [h["reason"] for h in history[-2:]] == ["first", "second"]


def _with_step(gen, pos: int, token: int, margin: float):
    """A copy of a run that says ``token`` at ``pos`` with the given top-2 margin there."""
    logits = [l.clone() for l in gen.step_logits]
    top = float(logits[pos].max())
    logits[pos][token] = top + margin
    ids = list(gen.ids)
    ids[pos] = token
    return dataclasses.replace(gen, ids=ids[: pos + 1], step_logits=logits[: pos + 1])


@pytest.mark.parametrize("margin,accepted", [(0.05, True), (3.0, False)])
def test_the_gate_accepts_a_token_change_only_at_a_near_tie(goldens_copy, computed_goldens, margin, accepted):
    from harness.goldens.refresh import assess

    key = ("8da4w", "pte", FRANCE)
    gen = computed_goldens.runs[key]
    runner_up = int(gen.step_logits[3].topk(2).indices[1])
    c = dataclasses.replace(computed_goldens, runs={**computed_goldens.runs, key: _with_step(gen, 3, runner_up, margin)})
    changes = [ch for ch in assess(c, llamacpp=False).changes if ch.kind == "tokens"]
    assert len(changes) == 1 and "8da4w:pte at generated position 3" in changes[0].detail
    assert changes[0].acceptable is accepted, changes[0].line()


def test_the_gate_accepts_stages_that_follow_an_upstream_near_tie(goldens_copy, computed_goldens):
    """fp32 hf_generate flips at a near-tie and every later fp32 stage says what it now says: one
    acceptable change, localized at hf_generate."""
    from harness.goldens.refresh import assess

    runs = dict(computed_goldens.runs)
    gen = runs[("fp32", "hf_generate", FRANCE)]
    runner_up = int(gen.step_logits[3].topk(2).indices[1])
    moved = _with_step(gen, 3, runner_up, 0.05)
    for stage in ("hf_generate", "eager", "exported", "pte"):
        other = runs[("fp32", stage, FRANCE)]
        runs[("fp32", stage, FRANCE)] = _with_step(other, 3, runner_up, 3.0 if stage != "hf_generate" else 0.05)
    runs[("fp32", "hf_generate", FRANCE)] = moved
    changes = [ch for ch in assess(dataclasses.replace(computed_goldens, runs=runs), llamacpp=False).changes
               if ch.kind == "tokens"]
    fp32 = [ch for ch in changes if ch.where == f"{FRANCE!r} fp32"]
    assert len(fp32) == 1 and "fp32:hf_generate at generated position 3" in fp32[0].detail
    assert fp32[0].acceptable, fp32[0].line()


def test_the_gate_blocks_logits_beyond_the_multiple_of_their_tolerance(goldens_copy, computed_goldens):
    from harness.goldens.refresh import assess
    from harness.tolerances import tolerance

    key = ("fp32", "exported", FRANCE)
    gen = computed_goldens.runs[key]
    beyond = 4 * tolerance("refresh/logit_multiple").atol * tolerance("logit_golden/fp32").atol
    bumped = dataclasses.replace(gen, step_logits=[l + beyond * (torch.arange(l.numel()) % 2) for l in gen.step_logits])
    c = dataclasses.replace(computed_goldens, runs={**computed_goldens.runs, key: bumped})
    blockers = assess(c, llamacpp=False).blockers
    assert any(b.kind == "logits" and "exported" in b.detail for b in blockers), [b.line() for b in blockers]


def test_goldens_diff_command_line_says_one_line_on_a_broken_provenance(tmp_path):
    root = tmp_path / "goldens"
    shutil.copytree(goldens_dir(), root)
    (root / "provenance.json").write_text("{not json")
    env = {**os.environ, "HARNESS_GOLDENS_DIR": str(root), "PYTHONWARNINGS": "ignore"}
    res = subprocess.run([sys.executable, "-m", "harness", "goldens", "diff"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [l for l in res.stderr.splitlines() if l.startswith("harness: error:")]
    assert len(errors) == 1 and "provenance.json is malformed JSON" in errors[0], res.stderr
