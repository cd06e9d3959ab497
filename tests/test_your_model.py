"""Your model, not only ours: the goldens cycle on a Gemma 4 checkpoint that is not the fixture.

A fresh ``harness make-checkpoint --shape small`` (the multimodal, sharded layout of the real E2B
at toy width) gets its goldens recorded into a temporary goldens directory, exactly as a user
would with ``harness goldens update --model DIR --goldens DIR``; then the cycle every upgrade runs:
diff clean on the command line (a fresh process recomputes every stage), a clear-margin token
tampered (diff exits 1 and names prompt, recipe and stage), the update refused with every file
byte-identical, and ``--allow REASON`` accepted and recorded. The compact logit goldens
(top 256 + sketch, harness/goldens/store.py) and the digested quantize golden keep their teeth.

The stages are computed once per session (tests/conftest.py, shared with tests/test_matrix.py); the lowering of the small checkpoint
is most of this file's time (docs/your-model.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.goldens.store import logit_golden_path, read_json_golden, token_golden_path
from support import run_cli, tree_bytes

pytestmark = pytest.mark.mac
RECIPE = "8da4w-fast"


@pytest.fixture(scope="module")
def checkpoint(your_checkpoint) -> Path:
    return your_checkpoint


@pytest.fixture(scope="module")
def recorded(your_recorded):
    return your_recorded


@pytest.fixture
def goldens(recorded, tmp_path, monkeypatch) -> Path:
    """A copy of the recorded goldens, pointed at, for a test that tampers with them."""
    root = tmp_path / "goldens"
    shutil.copytree(recorded[0], root)
    monkeypatch.setenv("HARNESS_GOLDENS_DIR", str(root))
    return root


def _harness(*argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_GOLDENS_DIR"}
    return subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_the_first_update_records_every_stage_of_a_checkpoint_that_is_not_the_fixture(recorded, checkpoint):
    root, computed, out = recorded
    subject = computed.subject
    key = subject.key
    assert key.startswith("my-gemma4-") and "first record" in out, out
    assert subject.chain() == [("reference-bf16", "hf_generate")] + [(RECIPE, s) for s in ("eager", "exported", "pte", "native")]
    prov = json.loads((root / "provenance" / f"{key}.json").read_text())
    assert prov["model_id"] == key and prov["model_directory"] == str(checkpoint)
    assert prov["synthetic_weights"] is True and prov["recipes"] == [RECIPE]
    assert prov["stages"] == [f"{r}:{s}" for r, s in subject.chain()]
    for stage in ("reference-bf16:hf_generate", f"{RECIPE}:eager", f"{RECIPE}:exported", f"{RECIPE}:pte", f"{RECIPE}:native"):
        row = prov["stage_stats"][stage]
        assert row["seconds"] >= 0 and row["peak_rss_gib"] > 0, (stage, row)
        assert f"{stage}: " in out and "peak RSS" in out
    for prompt in subject.prompts:
        for recipe, stage in subject.chain():
            assert (root / "tokens" / key / recipe / stage).is_dir()
            assert computed.runs[(recipe, stage, prompt)].ids, (recipe, stage, prompt)
        # the torch-free runner the device bundle runs says what the Python runtime says
        assert computed.runs[(RECIPE, "native", prompt)].ids == computed.runs[(RECIPE, "pte", prompt)].ids
    window = json.loads((checkpoint / "config.json").read_text())["text_config"]["sliding_window"]
    longest = max(len(computed.prompts[p]["ids"]) for p in subject.prompts)
    assert longest > window, f"no default prompt crosses the sliding window of {window} ({longest} tokens)"


def test_goldens_diff_on_the_command_line_recomputes_every_stage_and_finds_nothing(recorded, checkpoint):
    """A fresh process: the reference, eager and exported stages recomputed, the cached .pt2 and
    .pte reloaded. Exit 0 only if every token, logit, prompt and quantize golden still holds."""
    root, computed, _ = recorded
    before = tree_bytes(root)
    done = _harness("goldens", "diff", "--model", str(checkpoint), "--goldens", str(root))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no golden changed" in done.stdout and computed.subject.key in done.stdout
    assert tree_bytes(root) == before, "diff wrote to the goldens"


def _clearest(computed, stage: str) -> tuple[str, int, int]:
    """(prompt, generated position, runner-up id) where ``stage``'s top-2 margin is clearest. The
    small shape's final norm (harness/training/synthetic.py) is what gives a random model clear
    margins at all."""
    from harness.goldens.checks import is_near_tie

    def margin(prompt, i):
        top = computed.runs[(RECIPE, stage, prompt)].step_logits[i].topk(2).values
        return float(top[0] - top[1])

    prompt, pos = max(((p, i) for p in computed.subject.prompts
                       for i in range(len(computed.runs[(RECIPE, stage, p)].step_logits))), key=lambda pi: margin(*pi))
    best = margin(prompt, pos)
    assert not is_near_tie(best), f"no clear margin anywhere in {stage} (best {best:.3f})"
    return prompt, pos, int(computed.runs[(RECIPE, stage, prompt)].step_logits[pos].topk(2).indices[1])


def test_a_tampered_token_fails_the_diff_and_the_update_is_refused_then_allowed(goldens, recorded, capsys):
    from harness.goldens.refresh import diff_main, update_main

    _, computed, _ = recorded
    key = computed.subject.key
    prompt, pos, other = _clearest(computed, "pte")
    gen = computed.runs[(RECIPE, "pte", prompt)]
    path = token_golden_path(RECIPE, "pte", prompt, key)
    record = json.loads(path.read_text())
    record["ids"][pos] = other
    path.write_text(json.dumps(record))

    assert diff_main(computed=computed) == 1
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("- [tokens]"))
    assert repr(prompt) in line and f"first diverging stage {RECIPE}:pte at generated position {pos}" in line, out
    assert "BLOCKS the refresh" in line and "clear-margin" in line
    # the .pte moved and the exported program did not: its operators are compared with the program
    # it was lowered from (the ETRecord the lowering kept), and the untouched .pte names none
    assert f"localized: {RECIPE}, {prompt!r}: no operator of the {RECIPE} .pte moves" in out, out[-3000:]

    before = tree_bytes(goldens)
    assert update_main(computed=computed) == 1
    assert "nothing was written" in capsys.readouterr().out
    assert tree_bytes(goldens) == before, "a refused update changed files"

    assert update_main(allow="testing the gate on my own model", computed=computed) == 0
    capsys.readouterr()
    prov = json.loads((goldens / "provenance" / f"{key}.json").read_text())
    entry = prov["accepted_over_the_gate"][-1]
    assert entry["reason"] == "testing the gate on my own model" and any(repr(prompt) in b for b in entry["blocked"])
    assert json.loads(path.read_text())["ids"] == gen.ids
    assert diff_main(computed=computed) == 0, capsys.readouterr().out


def test_pytest_harness_model_checks_every_golden_and_fails_only_the_tampered_one(goldens, recorded, checkpoint):
    """``pytest -m mac --harness-model DIR --harness-goldens GOLDENS`` (tests/test_your_goldens.py) in
    a fresh process, on goldens with one exported-stage token changed: every other golden passes;
    that token's test and the whole diff fail, naming recipe, stage and prompt."""
    _, computed, _ = recorded
    key = computed.subject.key
    prompt, pos, other = _clearest(computed, "exported")
    path = token_golden_path(RECIPE, "exported", prompt, key)
    record = json.loads(path.read_text())
    record["ids"][pos] = other
    path.write_text(json.dumps(record))
    env = {k: v for k, v in os.environ.items() if k not in ("HARNESS_GOLDENS_DIR", "HARNESS_MODEL")}
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "mac", "tests/test_your_goldens.py", "-q", "-rf",
                           "-p", "no:cacheprovider", "--harness-model", str(checkpoint), "--harness-goldens", str(goldens)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout
    assert done.returncode == 1, out[-4000:] + done.stderr[-2000:]
    failed = [l for l in out.splitlines() if l.startswith("FAILED")]
    assert len(failed) == 2, out[-4000:]
    assert any(f"test_your_token_golden[{RECIPE}:exported:{prompt[:30]}]" in l for l in failed), failed
    assert any("test_your_goldens_diff_is_clean" in l for l in failed), failed
    import re

    subject = computed.subject
    n, nodes = len(subject.prompts), len(subject.chain())
    with_logits = nodes - 1  # the native runner's golden is its tokens
    want = n + (n * nodes - 1) + n * with_logits + len(subject.recipes)  # prompts, tokens, logits, quantize
    assert re.search(rf"\b2 failed, {want} passed, {n} skipped\b", out), out[-2000:]


# ---- teeth of the compact goldens (a 262,144-token vocabulary is stored as top 256 + a sketch) ----
def _transformed(gen, fn):
    return dataclasses.replace(gen, step_logits=[fn(i, l.clone()) for i, l in enumerate(gen.step_logits)])


def test_a_tail_token_outside_the_top_256_rising_one_nat_fails_the_compact_logit_golden(goldens, recorded):
    from harness.goldens.checks import check_logit_golden

    _, computed, _ = recorded
    key, prompt = computed.subject.key, computed.subject.prompts[0]
    node = ("reference-bf16", "hf_generate")
    gen = computed.runs[(*node, prompt)]
    assert check_logit_golden(*node, prompt, gen, model=key) is None
    golden = read_json_golden(logit_golden_path(*node, prompt, key))
    pos = 1
    assert "sketch" in golden[pos] and len(golden[pos]["head_ids"]) == 256
    tail = int(gen.step_logits[pos].argsort(descending=True)[1000])
    assert tail not in golden[pos]["head_ids"], "the tail token is stored exactly: not a test of the sketch"

    def bump(i, logits):
        if i == pos:
            logits[tail] += 1.0
        return logits

    problem = check_logit_golden(*node, prompt, _transformed(gen, bump), model=key)
    assert problem is not None and "reference-bf16:hf_generate" in problem and f"position {pos}" in problem, problem


def test_a_constant_shift_of_the_logits_fails_the_compact_logit_golden_on_its_bias(goldens, recorded):
    from harness.goldens.checks import check_logit_golden

    _, computed, _ = recorded
    key, prompt = computed.subject.key, computed.subject.prompts[0]
    node = ("reference-bf16", "hf_generate")
    gen = computed.runs[(*node, prompt)]
    problem = check_logit_golden(*node, prompt, _transformed(gen, lambda i, l: l + 0.01), model=key)
    assert problem is not None and "bias" in problem, problem


def test_a_ten_percent_change_of_one_scale_fails_the_digested_quantize_golden(goldens, recorded, checkpoint):
    """A user's quantize golden stores the scales as a sha256 (E2B has 145 million): any change of
    one scale is named, exactly."""
    from harness.goldens.checks import check_quantize_golden
    from harness.goldens.store import quantize_record
    from harness.pipeline import Pipeline

    _, computed, _ = recorded
    key = computed.subject.key
    model = Pipeline(str(checkpoint), RECIPE).quantized  # (FP32 load + quantize: the small shape, seconds)
    assert check_quantize_golden(RECIPE, quantize_record(model, digest_scales=True), key) is None
    for name, module in model.named_modules():
        if name.endswith("mlp.gate_proj") and hasattr(module.weight, "scale"):
            module.weight.scale.view(-1)[0] *= 1.1
            break
    else:
        raise AssertionError("no quantized gate_proj with a scale")
    problem = check_quantize_golden(RECIPE, quantize_record(model, digest_scales=True), key)
    assert problem is not None and f"{name}.weight scale changed" in problem, problem


# ---- bad input: one line, exit 2, nothing written --------------------------------------------------
def _one_error(argv: list[str], expected: str) -> None:
    rc, stdout, stderr = run_cli(argv)
    errors = [l for l in stderr.splitlines() if l.startswith("harness: error:")]
    assert rc == 2, (rc, stdout[-2000:], stderr[-2000:])
    assert len(errors) == 1 and expected in errors[0], stderr
    assert "Traceback" not in stderr


def _copy(checkpoint: Path, where: Path) -> Path:
    out = where / checkpoint.name
    shutil.copytree(checkpoint, out)
    return out


def test_a_directory_that_is_not_a_gemma4_checkpoint(goldens, checkpoint, tmp_path):
    other = _copy(checkpoint, tmp_path)
    config = json.loads((other / "config.json").read_text())
    config["model_type"] = "llama"
    (other / "config.json").write_text(json.dumps(config))
    before = tree_bytes(goldens)
    _one_error(["goldens", "update", "--model", str(other), "--goldens", str(goldens)], "is not a Gemma 4 checkpoint")
    assert tree_bytes(goldens) == before


def test_a_tokenizer_that_does_not_match_the_vocabulary(goldens, checkpoint, tmp_path):
    from harness.training.synthetic import write_tokenizer

    other = _copy(checkpoint, tmp_path)
    write_tokenizer(other, 4096)  # another model's tokenizer: twice the small shape's 2048 ids
    before = tree_bytes(goldens)
    _one_error(["goldens", "diff", "--model", str(other), "--goldens", str(goldens)],
               "the tokenizer has 4096 tokens, the model's vocabulary 2048")
    assert tree_bytes(goldens) == before


def test_goldens_recorded_for_another_model_with_the_same_name(goldens, recorded, checkpoint, tmp_path):
    """The same directory name, one weight changed: another content hash, so another model id."""
    other = _copy(checkpoint, tmp_path)
    shard = sorted(other.glob("model-*-of-*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    _one_error(["goldens", "diff", "--model", str(other), "--goldens", str(goldens)],
               f"were recorded for {recorded[1].subject.key}, not my-gemma4-")


def test_goldens_recorded_for_another_recipe(goldens, checkpoint):
    _one_error(["goldens", "diff", "--model", str(checkpoint), "--goldens", str(goldens), "--recipe", "8da4w"],
               f"were recorded for {RECIPE}, not 8da4w")


def test_a_prompt_file_with_a_malformed_line(goldens, checkpoint, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "What is the capital of France?"}\n{"prompt": "Who wrote\n')
    before = tree_bytes(goldens)
    _one_error(["goldens", "update", "--model", str(checkpoint), "--goldens", str(goldens), "--prompts", str(prompts)],
               f"{prompts}:2 is not valid JSON")
    assert tree_bytes(goldens) == before


def test_a_goldens_directory_that_is_not_writable(checkpoint, tmp_path):
    """Under a regular file (root ignores permission bits, a file in the path stops everyone)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file\n")
    _one_error(["goldens", "update", "--model", str(checkpoint), "--goldens", str(blocker / "goldens")],
               "is not writable")
    assert blocker.read_text() == "a file\n"


_WRITER = r"""
import json, os, sys
from pathlib import Path
from types import SimpleNamespace

os.environ["HARNESS_GOLDENS_DIR"] = sys.argv[1]
from harness.goldens.store import goldens_dir
from harness.goldens.write import SUBTREES, write_goldens

root, key = goldens_dir(), sys.argv[2]
files = {p: json.loads(p.read_text()) for sub in SUBTREES for p in (root / sub / key).rglob("*.json")}
provenance = json.loads((root / "provenance" / f"{key}.json").read_text())
print("writing", flush=True)
n = 0
while True:
    n += 1
    c = SimpleNamespace(subject=SimpleNamespace(key=key), files=lambda: {p: {"generation": n, "was": d} for p, d in files.items()})
    write_goldens(c, {**provenance, "generation": n})
"""


def _generations(root: Path, key: str) -> tuple[set, int]:
    """Which write each of this model's files is from (0: the recorded set), and how many there are."""
    from harness.goldens.write import SUBTREES

    paths = [p for sub in SUBTREES for p in (root / sub / key).rglob("*.json")] + [root / "provenance" / f"{key}.json"]
    tags = set()
    for p in paths:
        data = json.loads(p.read_text())
        tags.add(data.get("generation", 0) if isinstance(data, dict) else 0)
    return tags, len(paths)


@pytest.mark.parametrize("kill_after", [0.0, 0.15, 0.4, 0.8])
def test_an_update_killed_mid_write_leaves_the_old_goldens_or_the_new_never_a_mix(goldens, recorded, kill_after):
    import signal
    import time

    key = recorded[1].subject.key
    _, count = _generations(goldens, key)
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(goldens), key], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    try:
        assert child.stdout.readline().strip() == "writing"
        time.sleep(kill_after)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    from harness.goldens.write import recover

    recover(goldens)  # what every later diff and update does first
    generations, after = _generations(goldens, key)
    assert after == count, "files of this model went missing or appeared"
    assert len(generations) == 1, f"a mix of writes: generations {sorted(generations)}"
    assert not list(goldens.parent.glob(f".{goldens.name}-*")), "a staging directory was left behind"


# ---- the device bundle for your model ------------------------------------------------------------
@pytest.fixture(scope="module")
def model_bundle(recorded, checkpoint, tmp_path_factory) -> Path:
    from support import require_arm_tools

    require_arm_tools()
    out = tmp_path_factory.mktemp("device") / "bundle"
    rc, stdout, stderr = run_cli(["bench", "bundle", str(out), "--model", str(checkpoint), "--goldens", str(recorded[0]),
                                  "--recipe", RECIPE])
    assert rc == 0, stdout[-2000:] + stderr[-2000:]
    assert "goldens checked on aarch64 cortex-a76 (emulated)" in stdout, stdout
    return out


def test_the_model_bundle_holds_its_pte_as_a_hard_link_into_the_cache(model_bundle, recorded, checkpoint):
    from harness.bench.bundle import read_manifest
    from harness.export.preflight import checked_pipeline
    from harness.program import ExportSettings

    manifest = read_manifest(model_bundle)
    m = manifest["model"]
    subject = recorded[1].subject
    assert m["id"] == subject.key and m["recipe"] == RECIPE and m["goldens_stage"] == "native"
    assert manifest["fixture"] is None and manifest["bench"] is None
    assert [p["prompt"] for p in m["prompts"]] == list(subject.prompts)
    assert all(p["golden"] == recorded[1].runs[(RECIPE, "native", p["prompt"])].ids for p in m["prompts"])
    assert all(0 <= p["exact_upto"] <= len(p["golden"]) for p in m["prompts"])
    cached = checked_pipeline(str(checkpoint), RECIPE, ExportSettings(max_context=subject.max_context)).pte_path
    bundled = model_bundle / m["pte"]
    assert m["pte_stored"] == "hard link" and os.stat(bundled).st_ino == os.stat(cached).st_ino, \
        "the bundle wrote a second copy of the cached .pte"
    assert (model_bundle / m["tokenizer"]).read_bytes() == (checkpoint / "tokenizer.json").read_bytes()


def test_the_pi5_tier_checks_your_model_torch_free_under_emulation(model_bundle, tmp_path):
    """``pytest -m pi5 --pi5-force --pi5-emulate cortex-a76 --pi5-bundle DIR`` from an interpreter with
    only pytest and pytest-benchmark: your model's goldens through the bundle's aarch64 runner, and
    its benchmark row (emulated)."""
    from test_pi5_emulated import device_pytest

    out = tmp_path / "pi5.json"
    run = device_pytest(tmp_path, model_bundle, "--benchmark-json", str(out))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "PASSED tests/test_pi5.py::test_pi5_goldens_native_runner" in run.stdout, run.stdout[-3000:]
    rows = [b["extra_info"] for b in json.loads(out.read_text())["benchmarks"]]
    assert [r["recipe"] for r in rows] == [RECIPE] and rows[0]["model"].startswith("my-gemma4-"), rows
    assert rows[0]["emulated"] == "qemu cortex-a76" and rows[0]["decode_tok_s"] > 0


def test_a_wrong_golden_in_the_model_bundle_fails_on_the_device(model_bundle, tmp_path):
    from test_pi5_emulated import device_pytest

    bad = tmp_path / "bad-bundle"
    shutil.copytree(model_bundle, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    p = max(manifest["model"]["prompts"], key=lambda p: p["exact_upto"])
    assert p["exact_upto"] > 0, "no prompt is held exactly anywhere"
    p["golden"][0] = (p["golden"][0] + 1) % 2048
    (bad / "manifest.json").write_text(json.dumps(manifest))
    run = device_pytest(tmp_path, bad, "-k", "goldens_native_runner")
    assert run.returncode == 1, run.stdout[-3000:]
    assert f"{manifest['model']['id']} {RECIPE}" in run.stdout and "!= golden" in run.stdout, run.stdout[-3000:]


def test_a_model_bundle_needs_recorded_goldens(checkpoint, tmp_path):
    _one_error(["bench", "bundle", str(tmp_path / "b"), "--model", str(checkpoint), "--goldens", str(tmp_path / "none")],
               "has no goldens for my-gemma4-")
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def _cached_pte(checkpoint: Path, subject) -> Path:
    from harness.export.preflight import checked_pipeline
    from harness.program import ExportSettings

    return checked_pipeline(str(checkpoint), RECIPE, ExportSettings(max_context=subject.max_context)).pte_path


def test_verify_holds_a_pte_to_your_models_goldens(goldens, recorded, checkpoint):
    _, computed, _ = recorded
    subject = computed.subject
    pte = _cached_pte(checkpoint, subject)
    rc, stdout, stderr = run_cli(["verify", "--pte", str(pte), "--model", str(checkpoint), "--goldens", str(goldens)])
    assert rc == 0, stdout + stderr
    assert f"{len(subject.prompts)}/{len(subject.prompts)} prompts equal the {RECIPE}:pte goldens of {subject.key}" in stdout
    prompt = subject.prompts[2]
    path = token_golden_path(RECIPE, "pte", prompt, subject.key)
    record = json.loads(path.read_text())
    record["ids"][0] = (record["ids"][0] + 1) % 2048
    path.write_text(json.dumps(record))
    rc, stdout, stderr = run_cli(["verify", "--pte", str(pte), "--model", str(checkpoint), "--goldens", str(goldens)])
    assert rc == 1 and "FAIL" in stdout and f"{len(subject.prompts) - 1}/{len(subject.prompts)}" in stdout, stdout + stderr
