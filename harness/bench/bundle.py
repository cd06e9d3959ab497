"""The Pi 5 bundle: what the device needs to run the ``pi5`` tier, built on a workstation.

The device needs Python with pytest and pytest-benchmark, and nothing else: no torch, no
executorch, no transformers, no compiler. So the bundle carries:

- ``runner/``: the native runner (harness/runtimes/cpp) built for the device's architecture
  (aarch64 by default, cross-compiled against the pinned aarch64 executorch wheel; or this host's
  with ``arch="x86_64"``), with the C++ runtime libraries it loads in ``runner/lib``;
- the ``.pte`` files (fixture, and the benchmark model unless ``fixture_only``), the GGUFs for
  llama.cpp's side, both ``tokenizer.json`` files (for the optional ExecuTorch LLM-runner rows);
- the goldens: the fixture prompts chat-templated and tokenized with their token goldens, and
  ``fixture-logits.json``, this host's native runner's logits over a prefill longer than the
  sliding window (the device's must be within ``tolerances.py``'s ``arm_vs_x86/RECIPE``);
- ``manifest.json``: all of that, every file's sha256, the runner's build, and ``checked``:
  which architecture and CPU the bundle's own runner said the goldens on before it was written
  (under qemu for aarch64 where qemu is here).

Written to ``DIR.partial`` and renamed when complete and checked.
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
RUNNER = "runner/et_native"
LOGITS = "fixture-logits.json"
CHECK_CPUS = {"aarch64": ("cortex-a76",), "x86_64": (None,)}  # where the bundle is checked before writing


def window_prompt(prompts: list[list[int]], window: int) -> list[int]:
    """One prompt longer than the sliding window: the prompts' ids joined (each after the first
    without its BOS), as many as it takes."""
    ids = list(prompts[0])
    for more in prompts[1:]:
        if len(ids) > window:
            break
        ids += more[1:]
    if len(ids) <= window:
        raise HarnessError(f"the prompts make {len(ids)} ids, not more than the {window}-slot window",
                           "add golden prompts")
    return ids


def build_bundle(out: Path, recipes: list[str] | None = None, with_gguf: bool = True, arch: str = "aarch64",
                 fixture_only: bool = False, progress=print) -> Path:
    from harness.goldens.store import golden_ids
    from harness.pipeline import Pipeline
    from harness.program import eos_ids
    from harness.recipes import RECIPES, get_recipe, golden_recipe
    from harness.runtimes.arm import ARCHES
    from harness.runtimes.native import native_runner, prompt_logits
    from harness.versions import library_versions

    if arch not in ARCHES:
        raise HarnessError(f"no device runner for architecture {arch!r}", f"pass --arch {' or --arch '.join(ARCHES)}")
    recipes = recipes or list(RECIPES)
    for r in recipes:
        get_recipe(r)
    staging = Staging(out)
    try:  # a failure anywhere leaves neither DIR.partial nor a changed DIR
        files = staging.files

        def put(src: Path, name: str) -> str:
            staging.put(src, name)
            return name

        runner_record = staging.put_runner(arch, progress)
        fixture = Pipeline("fixture", "fp32", progress=progress)
        put(fixture.loaded.directory / "tokenizer.json", "fixture-tokenizer.json")
        tok = fixture.loaded.tokenizer
        manifest: dict = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "libraries": library_versions(),
            "runner": runner_record,
            "fixture": {"eos_ids": eos_ids(fixture.loaded), "max_new_tokens": 9, "pte": {}, "prompts": [],
                        "sliding_window": int(fixture.loaded.config.sliding_window), "logits": LOGITS},
            "bench": None,
        }
        for prompt in FIXTURE_PROMPTS:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
            manifest["fixture"]["prompts"].append({
                "prompt": prompt, "templated": text, "ids": fixture.prompt_ids(prompt),
                "goldens": {r: golden_ids(golden_recipe(r), "pte", prompt) for r in recipes},
            })
        long_ids = window_prompt([p["ids"] for p in manifest["fixture"]["prompts"]], manifest["fixture"]["sliding_window"])
        logits: dict = {"ids": long_ids, "source": "this host's native runner (x86_64)", "recipes": {}}
        for r in recipes:
            pf = Pipeline("fixture", r, progress=progress)
            manifest["fixture"]["pte"][r] = put(pf.pte_path, f"fixture-{r}.pte")
            logits["recipes"][r] = prompt_logits(pf.pte_path, long_ids, 2, [str(native_runner())])
        (staging.dir / LOGITS).write_text(json.dumps(logits))
        files[LOGITS] = sha256_file(staging.dir / LOGITS)
        if not fixture_only:
            manifest["bench"] = _bench_section(put, recipes, with_gguf, progress)
        manifest["checked"] = [check_bundle(staging.dir, manifest, logits, cpu, progress) for cpu in CHECK_CPUS[arch]]
        return staging.finish(manifest)
    except BaseException:
        staging.abort()
        raise


class Staging:
    """A bundle being built: ``DIR.partial``, filled file by file (each file's sha256 recorded),
    renamed to ``DIR`` once its manifest reads back with every file as recorded."""

    def __init__(self, out: Path):
        from harness.atomic import check_writable

        self.out = Path(out)
        check_writable(self.out)  # its parent must exist and be writable; DIR itself is created
        self.dir = self.out.with_name(self.out.name + ".partial")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.files: dict[str, str] = {}

    def put(self, src: Path, name: str, link: bool = False) -> str:
        """Copy ``src`` in as ``name``; with ``link``, a hard link instead where ``src`` is on the same
        file system (a 3.6 GB ``.pte`` from the artifact cache is not written twice). Returns how."""
        dest = self.dir / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        how = "copy"
        if link:
            try:
                os.link(src, dest)
                how = "hard link"
            except OSError:  # another file system (EXDEV), or one without hard links
                shutil.copyfile(src, dest)
                how = "copy (the artifact cache is on another file system)"
        else:
            shutil.copyfile(src, dest)
        self.files[name] = sha256_file(dest)
        return how

    def put_runner(self, arch: str, progress) -> dict:
        """The native runner for ``arch`` and the C++ runtime libraries it loads; its manifest record."""
        from harness.runtimes.arm import device_runner

        progress(f"bundle: the native runner for {arch}")
        runner = device_runner(arch)
        self.put(runner, RUNNER)
        os.chmod(self.dir / RUNNER, 0o755)
        build = json.loads((runner.parent / "meta.json").read_text())
        for name in build.get("libraries", {}):
            self.put(runner.parent / "lib" / name, f"runner/lib/{name}")
        return {"arch": arch, "path": RUNNER, "sha256": self.files[RUNNER],
                **{k: build.get(k) for k in ("compiler", "linked", "command")}}

    def finish(self, manifest: dict) -> Path:
        manifest["files"] = self.files
        (self.dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
        read_manifest(self.dir)  # every file as recorded
        if self.out.exists():
            shutil.rmtree(self.out)
        os.replace(self.dir, self.out)
        return self.out

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _bench_section(put, recipes: list[str], with_gguf: bool, progress) -> dict:
    from harness.bench.protocol import DEFAULT_NEW_TOKENS, bench_prompts
    from harness.bench.roofline import gguf_bytes_per_token, torch_bytes_per_token
    from harness.models.bench import bench_model_dir
    from harness.pipeline import Pipeline
    from harness.runtimes.executorch import PteRuntime

    put(bench_model_dir() / "tokenizer.json", "bench-tokenizer.json")
    bench = Pipeline("bench", "fp32", progress=progress)
    prompts = bench_prompts(vocab=bench.loaded.config.vocab_size)
    context = len(prompts[0]) + DEFAULT_NEW_TOKENS // 2
    section: dict = {"pte": {}, "gguf": {}, "bytes_per_token": {}, "host_ids": {}, "errors": {},
                     "prompts": prompts, "new_tokens": DEFAULT_NEW_TOKENS}
    for r in recipes:
        pb = Pipeline("bench", r, progress=progress)
        section["pte"][r] = put(pb.pte_path, f"bench-{r}.pte")
        section["bytes_per_token"][f"executorch:{r}"] = torch_bytes_per_token(pb.quantized, context)
        runtime = PteRuntime(pb.pte_path)
        section["host_ids"][f"executorch:{r}"] = [runtime.generate(p, DEFAULT_NEW_TOKENS, keep_logits=False).ids
                                                  for p in prompts]
    if with_gguf:
        for q in ("f32", "q4_0"):
            try:
                from harness.runtimes.gguf import gguf_for

                path = gguf_for("bench", q)
                section["gguf"][q] = put(path, f"bench-{q}.gguf")
                section["bytes_per_token"][f"llama.cpp:{q}"] = gguf_bytes_per_token(path, bench.loaded.config, context)
            except (HarnessError, ImportError) as e:
                section["errors"][f"llama.cpp:{q}"] = str(e)
    return section


def check_bundle(root: Path, manifest: dict, logits: dict, cpu: str | None = None, progress=print,
                 qemu_name: str | None = None) -> dict:
    """The bundle's own runner on this machine (as ``cpu`` under qemu for an aarch64 runner):
    every fixture golden, and the logits within ``arm_vs_x86/RECIPE``. Returns the provenance
    record; raises if a golden differs or a logit is out of tolerance (such a bundle is not
    written). With no qemu here, an aarch64 bundle is recorded as not checked, and why."""
    import platform

    from harness.runtimes.arm import arm_logits_problem, runner_prefix
    from harness.runtimes.native import prompt_logits

    arch = manifest["runner"]["arch"]
    record = {"arch": arch, "cpu": cpu or _host_cpu(), "emulated": arch != platform.machine() or bool(cpu),
              "host": platform.machine()}
    try:
        prefix = runner_prefix(arch, root / manifest["runner"]["path"], cpu, qemu_name)
    except HarnessError as e:
        return {**record, "checked": False, "why": str(e)}
    progress(f"bundle: checking its runner on {record['cpu']}" + (" (qemu)" if record["emulated"] else ""))
    problems = native_golden_problems(root, manifest, prefix)
    if problems:
        raise HarnessError(f"the bundle's {arch} runner on {record['cpu']}: {problems[0]} ({len(problems)} in all)",
                           "the bundle was not written; see tests/test_arm.py")
    worst = {}
    for recipe, name in ((manifest.get("fixture") or {}).get("pte", {}) if logits else {}).items():
        got = prompt_logits(root / name, logits["ids"], 2, prefix)
        problem = arm_logits_problem(logits["recipes"][recipe], got, recipe, f"{recipe} host",
                                     f"{recipe} {arch} ({record['cpu']})", f"a {len(logits['ids'])}-token prefill")
        if problem:
            raise HarnessError(problem, "the bundle was not written")
        worst[recipe] = max(abs(a - b) for ra, rb in zip(logits["recipes"][recipe][0], got[0]) for a, b in zip(ra, rb))
    return {**record, "checked": True, "goldens": "equal", **({"logits_max_abs_diff": worst} if logits else {})}


def golden_sets(manifest: dict) -> list[dict]:
    """Each ``.pte`` the bundle holds with its prompts and their goldens: the fixture's, one per
    recipe, and a model bundle's (``harness bench bundle DIR --model CKPT``)."""
    out = []
    fx = manifest.get("fixture")
    for recipe, name in (fx or {}).get("pte", {}).items():
        out.append({"label": recipe, "model": "fixture", "recipe": recipe, "pte": name, "tokenizer": "fixture-tokenizer.json",
                    "eos_ids": fx["eos_ids"], "max_new_tokens": fx["max_new_tokens"],
                    "prompts": [{"prompt": p["prompt"], "templated": p["templated"], "ids": p["ids"],
                                 "golden": p["goldens"][recipe]} for p in fx["prompts"]]})
    m = manifest.get("model")
    if m:
        out.append({"label": f"{m['id']} {m['recipe']}", **{k: m[k] for k in
                    ("recipe", "pte", "tokenizer", "eos_ids", "max_new_tokens", "prompts")}, "model": m["id"]})
    return out


def native_golden_problems(root: Path, manifest: dict, runner: list[str]) -> list[str]:
    """Every bundled ``.pte`` through the native runner that ``runner`` starts: one line for each
    prompt whose greedy ids differ from its golden (no EOS stop, so each golden's EOS must come
    where the golden has it)."""
    from harness.runtimes.native import NativeRuntime

    problems = []
    for g in golden_sets(manifest):
        runtime = NativeRuntime(root / g["pte"], 2, runner=runner)
        try:
            for p in g["prompts"]:
                n = p.get("exact_upto", len(p["golden"]))  # a model's goldens: up to its first near-tie
                ids = runtime.generate(p["ids"], len(p["golden"])).ids
                if ids[:n] != p["golden"][:n]:
                    problems.append(f"{g['label']} {p['prompt'][:60]!r}: native {ids} != golden {p['golden']}"
                                    + (f" (exact up to position {n}, its first near-tie)" if n < len(p["golden"]) else ""))
        finally:
            runtime.close()
    return problems


def _host_cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


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
