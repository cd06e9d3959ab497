"""Command line: ``harness`` / ``python -m harness``.

Errors the user can fix print one line on stderr and exit 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from harness.errors import HarnessError
from harness.cli.guard import progress as _progress, verdict
from harness.cli.goldens import SKIP_HELP, add_goldens_commands

from harness.cli.verify import DEFAULT_PROMPT, cmd_verify


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.2f} MB"


DEMO_RECIPE = "8da4w-fast"  # says exactly what 8da4w says (its goldens); lowers in ~62 s, not ~80 s


def cmd_demo(args) -> int:
    """The main job: load → quantize → export → lower → .pte → generate → verify, on the fixture."""
    from harness.atomic import check_writable
    from harness.program import ExportSettings
    from harness.export.pipeline import StageRecord
    from harness.export.pte import write_pte

    from harness.cli.guard import check_prompt
    from harness.export.preflight import checked_pipeline

    check_prompt(args.prompt)
    if args.out:
        check_writable(Path(args.out))
    pipe = checked_pipeline(args.model, args.recipe, ExportSettings(max_context=args.max_context),
                            progress=_progress, skip=args.skip_memory_check)
    pipe.etrecord_with_lowering = False  # the demo never compares operators: no record to copy and save
    pipe.loaded
    pipe.quantized
    pipe.pt2_path
    pipe.pte_path
    gen = pipe.generate(args.prompt, stage="pte", max_new_tokens=args.max_new_tokens)
    answer = pipe.decode(gen.ids)
    t0 = time.time()
    reference = pipe.hf_generate(args.prompt, max_new_tokens=args.max_new_tokens)
    pipe.records["verify (HF generate, FP32)"] = StageRecord(time.time() - t0, None)
    print(f"model:   {pipe.loaded.name} ({pipe.loaded.param_count():,} parameters)")
    print(f"recipe:  {pipe.recipe.name}: {pipe.recipe.description}")
    print(f"prompt:  {args.prompt}")
    print(f"answer:  {answer}   (.pte, token ids {gen.ids})")
    rows = [
        [stage, f"{rec.seconds:.2f}", _fmt_bytes(rec.bytes), "cache" if rec.cached else ""]
        for stage, rec in pipe.records.items()
    ]
    print()
    print(_table(rows, ["stage", "seconds", "size", "from"]))
    ops = pipe.lower_report
    if ops:
        print(f"\nXNNPACK delegate calls: {ops['delegated_calls']}; portable ops left: {ops['portable_total']}")
    print(f".pte: {pipe.pte_path}")
    if gen.ids != reference:
        print(
            f"\nVERIFY FAILED: the .pte said {gen.ids} ({answer!r}); HF generate (FP32) says "
            f"{reference} ({pipe.decode(reference)!r})",
            file=sys.stderr,
        )
        return 1
    print("\nverify: the .pte answer equals HF generate (FP32), token for token")
    if args.out:
        write_pte(pipe.pte_path, Path(args.out))
    return 0


def cmd_export(args) -> int:
    from harness.atomic import check_writable
    from harness.program import ExportSettings
    from harness.export.pte import write_pte
    from harness.recipes import get_recipe

    out = Path(args.out)
    if out.suffix != ".pte":
        raise HarnessError(f"--out {out} does not end in .pte", "name the output FILE.pte")
    check_writable(out)
    if out.is_dir():
        raise HarnessError(f"--out {out} is a directory", "name the output FILE.pte")
    get_recipe(args.recipe)
    from harness.export.preflight import checked_pipeline, disk_estimate, model_size

    pipe = checked_pipeline(args.model, args.recipe, ExportSettings(max_context=args.max_context),
                            progress=_progress, skip=args.skip_memory_check)
    pipe.memory_check("lower")  # memory first (a machine's fixed limit), then disk, before minutes of work
    check_writable(out, need_bytes=disk_estimate(model_size(args.model), args.recipe)["pte"])
    write_pte(pipe.pte_path, out)
    rows = [[s, f"{r.seconds:.2f}", _fmt_bytes(r.bytes), "cache" if r.cached else ""] for s, r in pipe.records.items()]
    print(_table(rows, ["stage", "seconds", "size", "from"]))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


def cmd_generate(args) -> int:
    from harness.runtimes.base import check_prompt as check_prompt_ids
    from harness.models.load import FIXTURE_DIR, _load_tokenizer, check_model_dir
    from harness.pipeline import encode_prompt
    from harness.runtimes.executorch import PteRuntime

    from harness.cli.guard import check_pte_path

    runner = PteRuntime(check_pte_path(args.pte))
    tok_dir = FIXTURE_DIR if args.tokenizer == "fixture" else Path(args.tokenizer)
    if args.tokenizer != "fixture" and not tok_dir.is_dir():
        check_model_dir(tok_dir)
    try:
        tokenizer = _load_tokenizer(tok_dir)
    except HarnessError:
        raise
    except Exception as e:  # a damaged tokenizer.json / tokenizer_config.json
        raise HarnessError(f"the tokenizer in {tok_dir} could not be loaded ({type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0][:120]})",
                           "copy the checkpoint's tokenizer files again") from e
    meta = runner.metadata()
    eos = meta.get("get_eos_ids", [])
    eos = set(eos if isinstance(eos, list) else [eos])
    from harness.cli.guard import check_prompt

    ids = encode_prompt(tokenizer, check_prompt(args.prompt))
    # the prompt is checked against the program's limits before any runtime sees it
    check_prompt_ids(ids, args.max_new_tokens, runner.max_context, runner.vocab_size)
    if args.native:  # the torch-free native runner (harness/runtimes/native.py), a process of its own
        from harness.runtimes.native import NativeRuntime

        with NativeRuntime(str(args.pte), threads=os.cpu_count() or 1) as child:
            gen_ids = child.generate(ids, args.max_new_tokens, eos_ids=eos).ids
    else:
        gen_ids = runner.generate(ids, args.max_new_tokens, eos_ids=eos).ids
    print(tokenizer.decode(gen_ids, skip_special_tokens=True))
    if args.ids:
        print(gen_ids)
    return 0


def cmd_doctor(args) -> int:
    """Library versions, the hidden torchvision dependency, memory and disk, Pi governor/throttling."""
    import importlib.util

    import psutil

    from harness.versions import library_versions

    for lib, version in library_versions().items():
        print(f"{lib:13s} {version}")
    tv = importlib.util.find_spec("torchvision") is not None
    print(f"{'torchvision':13s} {'present' if tv else 'absent'} (Gemma 4's processor needs it for images; "
          "the text path here does not)")
    from harness.cache import cache_root
    from harness.export.preflight import disk_estimate, estimate, gib, model_size

    mem = psutil.virtual_memory()
    cache_dir = cache_root()
    probe = next((p for p in (cache_dir, *cache_dir.parents) if p.exists()), Path.cwd())
    disk = shutil.disk_usage(probe)
    try:
        size = model_size(args.model)
        est = estimate(size, args.recipe, "lower")
        files = disk_estimate(size, args.recipe)
    except HarnessError as e:  # doctor still reports everything else
        size, problem = None, f"              no estimate for --model {args.model}: {e}"
    print(f"memory        {mem.available / 2**30:.1f} GiB available of {mem.total / 2**30:.1f} GiB")
    if size is None:
        print(problem)
    else:
        print(f"              export of {size.name} ({size.params / 1e6:,.1f}M parameters, {args.recipe}): "
              f"about {gib(est.peak_bytes)} at its peak"
              + ("" if est.peak_bytes <= mem.available else "  (TOO LITTLE: export would be refused; "
                 "--skip-memory-check overrides)"))
    print(f"disk          {disk.free / 2**30:.1f} GiB free in {probe} (artifact cache {cache_dir})")
    if size is not None:
        need_disk = files["pt2"] + 2 * files["pte"]  # the cache's .pt2 and .pte, and the copy at --out
        print(f"              its .pt2 and .pte, and the copy at --out: about {gib(need_disk)}"
              + ("" if need_disk <= disk.free else "  (TOO LITTLE)"))
    model_file = Path("/proc/device-tree/model")
    if model_file.is_file():
        print(f"board         {model_file.read_text(errors='replace').strip(chr(0))}")
    gov = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    if gov.is_file():
        g = gov.read_text().strip()
        print(f"governor      {g}" + ("" if g == "performance" else "  (set 'performance' before benchmarking)"))
    if shutil.which("vcgencmd"):
        import subprocess

        out = subprocess.run(["vcgencmd", "get_throttled"], capture_output=True, text=True).stdout.strip()
        print(f"throttling    {out}")
    return 0


def cmd_bench_report(args) -> int:
    """A benchmark JSON as a llama-bench-style markdown table (stdout) and a PNG chart."""
    from harness.bench.report import chart, markdown, read_result

    data = read_result(Path(args.result))
    print(markdown(data))
    if not args.no_chart:
        png = Path(args.png) if args.png else Path(args.result).with_suffix(".png")
        chart(data, png)
        print(f"\nchart: {png}")
    return 0


@verdict
def cmd_bench_diff(args) -> int:
    """Exit 0: no paired ratio dropped beyond the spread between runs; 1: one did; 2: an error."""
    from harness.bench.perf import bench_diff, read_side, recorded_side

    if len(args.runs) > 2:
        raise HarnessError("bench diff takes OLD NEW, or NEW alone", "pass two benchmark JSONs, or one")
    sides = [read_side(p) for p in args.runs]
    old = sides[0] if len(sides) == 2 else recorded_side(sides[0]["host_class"])
    return bench_diff(old, sides[-1])


@verdict
def cmd_bench_record(args) -> int:
    from harness.bench.perf import record

    return record(args.runs, allow=args.allow)


def cmd_bench_bundle(args) -> int:
    """Everything the Pi 5 tier needs, built here: .pte files, GGUFs, tokenizers, a manifest."""
    from harness.bench.bundle import build_bundle

    if args.model != "fixture":
        from harness.bench.model_bundle import build_model_bundle

        if args.goldens:
            os.environ["HARNESS_GOLDENS_DIR"] = str(Path(args.goldens).resolve())
        if args.recipe and len(args.recipe) > 1:
            raise HarnessError("a model bundle holds one recipe's .pte", "pass one --recipe")
        out = build_model_bundle(Path(args.out), args.model, (args.recipe or ["8da4w-fast"])[0], arch=args.arch,
                                 progress=_progress)
    else:
        if args.goldens:
            raise HarnessError("--goldens is for --model DIR (the fixture's goldens are the repository's)",
                               "pass --model DIR with --goldens, or drop --goldens")
        out = build_bundle(Path(args.out), recipes=args.recipe, with_gguf=not args.no_gguf, arch=args.arch,
                           fixture_only=args.fixture_only, progress=_progress)
    checked = json.loads((out / "manifest.json").read_text())["checked"]
    for c in checked:
        print(f"bundle: goldens checked on {c['arch']} {c['cpu']}" + (" (emulated)" if c.get("emulated") else "")
              + (" with logits" if "logits_max_abs_diff" in c else "")
              if c["checked"] else f"bundle: not checked on {c['arch']} here ({c['why']})")
    print(f"bundle: {out} (copy it to the Pi; see docs/device.md)")
    return 0


def cmd_make_checkpoint(args) -> int:
    """A checkpoint with Gemma 4 E2B's text shape and seeded random weights, in the real layout."""
    from harness.training.synthetic import make_checkpoint

    t0 = time.time()
    out = make_checkpoint(Path(args.out), shape=args.shape, seed=args.seed,
                          shard_bytes=int(args.shard_gb * (1 << 30)), progress=_progress)
    shards = sorted(out.glob("model-*.safetensors"))
    size = sum(f.stat().st_size for f in shards)
    print(f"checkpoint: {out} ({args.shape}, seed {args.seed}): {len(shards)} shards, {size / 1e9:.2f} GB, "
          f"{time.time() - t0:.0f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from harness.cli.guard import OneLineArgumentParser, at_least

    ap = OneLineArgumentParser(prog="harness", description="Gemma 4 → ExecuTorch golden-token harness")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = ap.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the main job on the fixture: export → quantize → lower → .pte → generate → verify")
    d.add_argument("--model", default="fixture", help="fixture, or a local checkpoint directory")
    d.add_argument("--recipe", default=DEMO_RECIPE,
                   help=f"default {DEMO_RECIPE}: 8da4w's quantization and answers, lowered in 7 delegates, not 123")
    d.add_argument("--prompt", default=DEFAULT_PROMPT)
    d.add_argument("--max-new-tokens", type=at_least(1), default=9)
    d.add_argument("--max-context", type=at_least(2), default=128)
    d.add_argument("--out", help="also copy the .pte here")
    d.add_argument("--skip-memory-check", action="store_true", help=SKIP_HELP)
    d.set_defaults(func=cmd_demo)

    mc = sub.add_parser("make-checkpoint", help="write a Gemma 4 E2B-shaped checkpoint with seeded random weights "
                                                 "(multimodal layout, bf16 shards, index, tokenizer)")
    mc.add_argument("out", metavar="DIR")
    mc.add_argument("--shape", choices=("e2b", "small"), default="e2b",
                    help="e2b: the real text shape (4.63B parameters, 9.3 GB); small: the same architecture at toy size")
    mc.add_argument("--seed", type=int, default=0)
    mc.add_argument("--shard-gb", type=float, default=2.0, help="shard size in GiB (default 2; a larger tensor gets its own)")
    mc.set_defaults(func=cmd_make_checkpoint)
    e = sub.add_parser("export", help="export, quantize and lower a model to a .pte")
    e.add_argument("--model", default="fixture", help="fixture, or a local checkpoint directory")
    e.add_argument("--recipe", default="8da4w")
    e.add_argument("--out", required=True, help="FILE.pte")
    e.add_argument("--max-context", type=at_least(2), default=128)
    e.add_argument("--skip-memory-check", action="store_true", help=SKIP_HELP)
    e.set_defaults(func=cmd_export)

    g = sub.add_parser("generate", help="greedy generation from a .pte")
    g.add_argument("--pte", required=True)
    g.add_argument("--tokenizer", default="fixture", help="fixture, or a directory with tokenizer.json")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=at_least(1), default=9)
    g.add_argument("--ids", action="store_true", help="also print the generated token ids")
    g.add_argument("--native", action="store_true",
                   help="run the .pte through the native runner (ExecuTorch's C++ runtime, no Python, no libtorch)")
    g.set_defaults(func=cmd_generate)

    v = sub.add_parser("verify", help="check a .pte against the goldens")
    v.add_argument("--pte", required=True)
    v.add_argument("--model", default="fixture", help="fixture, or a local checkpoint directory")
    v.add_argument("--recipe", help="the .pte's recipe (default 8da4w for the fixture; for a checkpoint, the one "
                                    "its goldens were recorded for)")
    v.add_argument("--goldens", metavar="DIR", help="with --model DIR: its goldens (goldens update --goldens); "
                                                    "without recorded goldens the .pte is held to HF generate")
    v.add_argument("--skip-memory-check", action="store_true", help=SKIP_HELP)
    v.set_defaults(func=cmd_verify)

    doc = sub.add_parser("doctor", help="versions, hidden dependencies, memory, disk, governor, throttling")
    doc.add_argument("--model", default="fixture", help="the model whose memory and disk needs to show")
    doc.add_argument("--recipe", default="8da4w")
    doc.set_defaults(func=cmd_doctor)

    add_goldens_commands(sub)

    b = sub.add_parser("bench", help="benchmarks: report a result, build the Pi 5 bundle")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    br = bsub.add_parser("report", help="RESULT.json (pytest --benchmark-json) as a markdown table and a PNG chart")
    br.add_argument("result", metavar="RESULT.json")
    br.add_argument("--png", help="chart path (default: RESULT.png beside the JSON)")
    br.add_argument("--no-chart", action="store_true", help="print the table only")
    br.set_defaults(func=cmd_bench_report)
    bd = bsub.add_parser("diff", help="speed across an upgrade: the paired ratios against llama.cpp of two "
                                      "benchmark JSONs (or NEW against this host class's performance golden); "
                                      "exit 1 on a drop beyond the spread between runs")
    bd.add_argument("runs", nargs="+", type=Path, metavar="JSON", help="OLD NEW, or NEW alone")
    bd.set_defaults(func=cmd_bench_diff)
    brec = bsub.add_parser("record", help="the performance golden of a host class: median paired ratios over "
                                          "runs of one stack (refused if slower than the recorded one)")
    brec.add_argument("runs", nargs="+", type=Path, metavar="JSON")
    brec.add_argument("--allow", metavar="REASON", help="record even a slower golden, with the reason")
    brec.set_defaults(func=cmd_bench_record)
    bb = bsub.add_parser("bundle", help="build the Pi 5 bundle: .pte files, GGUFs, tokenizers, manifest")
    bb.add_argument("out", metavar="DIR")
    bb.add_argument("--recipe", action="append", help="recipes to bundle (default: all)")
    bb.add_argument("--no-gguf", action="store_true", help="skip the llama.cpp GGUFs")
    bb.add_argument("--arch", choices=("aarch64", "x86_64"), default="aarch64",
                    help="the device's architecture: the native runner is built for it (default aarch64, the Pi 5)")
    bb.add_argument("--model", default="fixture",
                    help="fixture (the harness's own, with the benchmark model), or your checkpoint directory: "
                         "its .pte (hard-linked from the artifact cache), tokenizer and recorded goldens")
    bb.add_argument("--goldens", metavar="DIR", help="with --model DIR: where its goldens were recorded (goldens update --goldens)")
    bb.add_argument("--fixture-only", action="store_true",
                    help="only the fixture model (goldens, logits, and the emulated benchmark), not the benchmark model")
    bb.set_defaults(func=cmd_bench_bundle)
    return ap


def main(argv: list[str] | None = None) -> int:
    from harness.cli.guard import run_main

    # one line on stderr for any failure (harness/cli/guard.py); --debug shows the traceback
    return run_main(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
