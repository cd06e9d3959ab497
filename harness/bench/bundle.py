"""The Pi 5 bundle: what the device needs to run the ``pi5`` tier, built on a workstation.

The device has no transformers and never exports: it gets the ``.pte`` files (fixture and
benchmark model, every recipe), the GGUFs for llama.cpp's side of the comparison, both
``tokenizer.json`` files (for ExecuTorch's LLM runner), and ``manifest.json``: the fixture prompts
already chat-templated and tokenized with their golden ids, the benchmark prompts as ids, the
host's answers, bytes read per decode token (for the roofline) and every file's sha256.
Written to ``DIR.partial`` and renamed when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from harness.cache import sha256_file
from harness.errors import HarnessError
from harness.goldens.store import FIXTURE_PROMPTS

MANIFEST = "manifest.json"

def build_bundle(out: Path, recipes: list[str] | None = None, with_gguf: bool = True, progress=print) -> Path:
    from harness.atomic import check_writable
    from harness.bench.protocol import DEFAULT_NEW_TOKENS, bench_prompts
    from harness.models.bench import bench_model_dir
    from harness.goldens.store import golden_ids
    from harness.pipeline import Pipeline
    from harness.program import eos_ids
    from harness.recipes import RECIPES, get_recipe, golden_recipe
    from harness.bench.roofline import gguf_bytes_per_token, torch_bytes_per_token
    from harness.versions import library_versions

    recipes = recipes or list(RECIPES)
    for r in recipes:
        get_recipe(r)
    out = Path(out)
    check_writable(out)  # its parent must exist and be writable; DIR itself is created
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    files: dict[str, str] = {}

    def put(src: Path, name: str) -> str:
        shutil.copyfile(src, staging / name)
        files[name] = sha256_file(staging / name)
        return name

    fixture = Pipeline("fixture", "fp32", progress=progress)
    put(fixture.loaded.directory / "tokenizer.json", "fixture-tokenizer.json")
    put(bench_model_dir() / "tokenizer.json", "bench-tokenizer.json")
    tok = fixture.loaded.tokenizer
    manifest: dict = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "libraries": library_versions(),
        "fixture": {"eos_ids": eos_ids(fixture.loaded), "max_new_tokens": 9, "pte": {}, "prompts": []},
        "bench": {"pte": {}, "gguf": {}, "bytes_per_token": {}, "host_ids": {}, "errors": {}},
    }
    for prompt in FIXTURE_PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        manifest["fixture"]["prompts"].append({
            "prompt": prompt, "templated": text, "ids": fixture.prompt_ids(prompt),
            "goldens": {r: golden_ids(golden_recipe(r), "pte", prompt) for r in recipes},
        })
    bench = Pipeline("bench", "fp32", progress=progress)
    prompts = bench_prompts(vocab=bench.loaded.config.vocab_size)
    context = len(prompts[0]) + DEFAULT_NEW_TOKENS // 2
    manifest["bench"].update(prompts=prompts, new_tokens=DEFAULT_NEW_TOKENS)
    for r in recipes:
        pf = Pipeline("fixture", r, progress=progress)
        manifest["fixture"]["pte"][r] = put(pf.pte_path, f"fixture-{r}.pte")
        pb = Pipeline("bench", r, progress=progress)
        manifest["bench"]["pte"][r] = put(pb.pte_path, f"bench-{r}.pte")
        manifest["bench"]["bytes_per_token"][f"executorch:{r}"] = torch_bytes_per_token(pb.quantized, context)
        from harness.runtimes.executorch import PteRuntime

        runtime = PteRuntime(pb.pte_path)
        manifest["bench"]["host_ids"][f"executorch:{r}"] = [runtime.generate(p, DEFAULT_NEW_TOKENS, keep_logits=False).ids
                                                            for p in prompts]
    if with_gguf:
        for q in ("f32", "q4_0"):
            try:
                from harness.runtimes.gguf import gguf_for

                path = gguf_for("bench", q)
                manifest["bench"]["gguf"][q] = put(path, f"bench-{q}.gguf")
                manifest["bench"]["bytes_per_token"][f"llama.cpp:{q}"] = gguf_bytes_per_token(path, bench.loaded.config, context)
            except (HarnessError, ImportError) as e:
                manifest["bench"]["errors"][f"llama.cpp:{q}"] = str(e)
    manifest["files"] = files
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    return out


def read_manifest(bundle: Path) -> dict:
    """The manifest, after checking every bundled file against its sha256 (a half-copied bundle
    is refused, not benchmarked)."""
    bundle = Path(bundle)
    path = bundle / MANIFEST
    if not path.is_file():
        raise HarnessError(f"{bundle} is not a harness bundle (no {MANIFEST})",
                           "build one on a workstation with: harness bench bundle DIR, and copy DIR here")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as e:
        raise HarnessError(f"{path} is malformed ({e})", "copy the bundle again") from e
    for name, digest in manifest.get("files", {}).items():
        f = bundle / name
        if not f.is_file() or sha256_file(f) != digest:
            raise HarnessError(f"bundle file {f} is missing or damaged (sha256 mismatch)", "copy the bundle again")
    return manifest
