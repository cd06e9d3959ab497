"""Bad input gets one clear line that names the problem and the fix (API and command line)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.errors import HarnessError
from harness.models.load import load_directory
from harness.recipes import get_recipe

pytestmark = pytest.mark.mac


def test_missing_model_directory(tmp_path):
    with pytest.raises(HarnessError, match="does not exist.*pass --model fixture"):
        load_directory(tmp_path / "nope")


def test_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gemma4_text"}')
    with pytest.raises(HarnessError, match="no \\*.safetensors weights"):
        load_directory(tmp_path)


def test_directory_with_a_missing_shard(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gemma4"}')
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x")
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}'
    )
    with pytest.raises(HarnessError, match="incomplete: missing shard.*00002"):
        load_directory(tmp_path)


def test_not_a_gemma4_directory(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(HarnessError, match="not a Gemma 4 model"):
        load_directory(tmp_path)


def test_unknown_recipe():
    import re

    from harness.recipes import RECIPES

    names = ", ".join(sorted(RECIPES))  # 8da4w, fp32, and whatever recipes.py adds
    with pytest.raises(HarnessError, match=f"unknown recipe 'int3'.*choose one of: {re.escape(names)}$"):
        get_recipe("int3")


def test_prompt_longer_than_the_exported_maximum(pipeline):
    p = pipeline("fp32")
    long_prompt = "What is the capital of France? " * 40
    with pytest.raises(HarnessError, match="tokens in one call exceed the exported maximum of 127 per call"):
        p.generate(long_prompt, stage="eager")


def test_generation_that_would_overrun_the_context(pipeline):
    p = pipeline("fp32")
    with pytest.raises(HarnessError, match="new tokens exceed the exported maximum context"):
        p.generate("What is the capital of France?", stage="eager", max_new_tokens=200)


def test_token_id_outside_the_vocabulary(pipeline):
    p = pipeline("fp32")
    with pytest.raises(HarnessError, match="token id 5000 is outside the vocabulary \\(0..1023\\)"):
        p.generate([2, 4, 5000], stage="eager")


def test_empty_prompt(pipeline):
    with pytest.raises(HarnessError, match="empty prompt"):
        pipeline("fp32").generate("   ", stage="eager")


def _cli(*args, cwd=None):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def _error_lines(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if l.startswith("harness: error:")]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["export", "--model", "/nonexistent/gemma", "--recipe", "fp32", "--out", "{tmp}/m.pte"],
         "model directory /nonexistent/gemma does not exist"),
        (["export", "--model", "fixture", "--recipe", "int3", "--out", "{tmp}/m.pte"], "unknown recipe 'int3'"),
        (["generate", "--pte", "{tmp}/notes.pte", "--prompt", "hi"], "is not an ExecuTorch program"),
        (["generate", "--pte", "{tmp}/cut.pte", "--prompt", "hi"], "is a damaged or incompatible .pte"),
        (["export", "--model", "fixture", "--recipe", "fp32", "--out", "/nonexistent-dir/m.pte"],
         "output directory /nonexistent-dir does not exist"),
        (["export", "--model", "fixture", "--recipe", "fp32", "--out", "{tmp}/m.bin"], "does not end in .pte"),
    ],
    ids=["missing-model-dir", "unknown-recipe", "not-a-pte", "truncated-pte", "unwritable-out", "wrong-suffix"],
)
def test_cli_prints_one_line_and_exits_nonzero(pipeline, tmp_path, args, expected):
    (tmp_path / "notes.pte").write_text("these are my notes, not a program\n" * 10)
    good = pipeline("fp32").pte_path.read_bytes()
    (tmp_path / "cut.pte").write_bytes(good[: len(good) // 3])
    res = _cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.returncode == 2, res.stderr
    errors = _error_lines(res.stderr)
    assert len(errors) == 1 and expected in errors[0], res.stderr
    assert "Traceback" not in res.stderr


def test_malformed_golden_file(tmp_path):
    from harness.goldens.store import read_json_golden

    bad = tmp_path / "golden.json"
    bad.write_text('{"ids": [1, 2,')
    with pytest.raises(HarnessError, match="is malformed JSON.*restore it from git"):
        read_json_golden(bad)


def test_not_enough_free_disk(tmp_path):
    from harness.atomic import check_writable

    with pytest.raises(HarnessError, match="not enough free disk"):
        check_writable(tmp_path / "x.pte", need_bytes=1 << 60)


# ---- goldens under another stack, malformed goldens, through `harness verify` -------------------
def _goldens_copy(tmp_path, provenance: dict | None = None, edit: dict | None = None):
    """A copy of the committed goldens: provenance fields replaced, golden files rewritten."""
    import json
    import shutil

    from harness.goldens.store import goldens_dir

    root = tmp_path / "goldens"
    shutil.copytree(goldens_dir(), root)
    if provenance:
        prov = json.loads((root / "provenance.json").read_text())
        (root / "provenance.json").write_text(json.dumps({**prov, **provenance}))
    for name, text in (edit or {}).items():
        (root / name).write_text(text)
    return root


FRANCE_PTE_FP32 = "tokens/fixture/fp32/pte/what-is-the-capital-of-france.json"


def _verify(pipeline, goldens):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HARNESS_GOLDENS_DIR": str(goldens)}
    return subprocess.run([sys.executable, "-m", "harness", "verify", "--pte", str(pipeline("fp32").pte_path),
                           "--model", "fixture", "--recipe", "fp32"], capture_output=True, text=True, env=env,
                          timeout=300)


def test_stack_note_names_each_version_and_the_refresh():
    from harness.goldens.provenance import current_provenance, stack_note

    now = current_provenance("f" * 64)
    assert stack_note(recorded=dict(now), now=now) == ""
    note = stack_note(recorded={**now, "transformers": "5.23.0", "torchao": "0.17.0"}, now=now)
    assert "\n" not in note
    assert f"torchao 0.17.0 -> {now['torchao']}" in note and f"transformers 5.23.0 -> {now['transformers']}" in note
    assert "tox -e refresh" in note and "docs/goldens.md" in note


def test_verify_failing_under_other_versions_says_which_and_how_to_refresh(pipeline, tmp_path):
    golden = ('{"prompt": "What is the capital of France?", "ids": [337, 324, 321, 483, 316, 999, 5], '
              '"text": "The capital of France is Rome."}')
    goldens = _goldens_copy(tmp_path, provenance={"transformers": "5.23.0", "torch": "2.12.0"},
                            edit={FRANCE_PTE_FP32: golden})
    res = _verify(pipeline, goldens)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL 'What is the capital of France?'" in res.stdout
    note = [l for l in res.stdout.splitlines() if l.startswith("the goldens were recorded under another stack")]
    assert len(note) == 1, res.stdout
    assert "torch 2.12.0 -> " in note[0] and "transformers 5.23.0 -> " in note[0] and "tox -e refresh" in note[0]


def test_verify_failing_under_the_same_versions_blames_no_stack(pipeline, tmp_path):
    """Under the very stack the goldens name (this host's libraries and CPU features written into
    the copy's provenance: the committed record may come from another CPU), a failure is the
    .pte's, and no stack is blamed."""
    from harness.goldens.provenance import current_provenance

    golden = ('{"prompt": "What is the capital of France?", "ids": [337, 324, 321, 483, 316, 999, 5], '
              '"text": "The capital of France is Rome."}')
    res = _verify(pipeline, _goldens_copy(tmp_path, provenance=current_provenance(), edit={FRANCE_PTE_FP32: golden}))
    assert res.returncode == 1 and "FAIL" in res.stdout
    assert "another stack" not in res.stdout


def test_verify_with_a_malformed_golden_prints_one_line(pipeline, tmp_path):
    res = _verify(pipeline, _goldens_copy(tmp_path, edit={FRANCE_PTE_FP32: '{"ids": [337, 324,'}))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "is malformed JSON" in res.stderr and "restore it from git" in res.stderr
    assert "Traceback" not in res.stderr
