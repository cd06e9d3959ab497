"""Bad input gets one clear line that names the problem and the fix (API and command line)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.errors import HarnessError
from harness.load import load_directory
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
    with pytest.raises(HarnessError, match="unknown recipe 'int3'.*choose one of: 8da4w, fp32"):
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
    from harness.goldens import read_json_golden

    bad = tmp_path / "golden.json"
    bad.write_text('{"ids": [1, 2,')
    with pytest.raises(HarnessError, match="is malformed JSON.*restore it from git"):
        read_json_golden(bad)


def test_not_enough_free_disk(tmp_path):
    from harness.atomic import check_writable

    with pytest.raises(HarnessError, match="not enough free disk"):
        check_writable(tmp_path / "x.pte", need_bytes=1 << 60)
