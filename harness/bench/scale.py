"""Every build stage at full size, measured: ``python -m harness.bench.scale stages DIR RECIPE``.

Runs the build (streamed load+quantize, export and ``.pt2`` save+verify, lower and serialize to
``.pte``) in this process, stage by stage, with an empty artifact cache of its own, and records
for each stage its seconds, its own peak RSS (VmHWM, reset between stages through
``/proc/self/clear_refs``), the artifact's size, and the memory pre-flight's estimate beside the
measurement. Prints one JSON object; the ``scale`` tier (tests/test_scale.py) and the README's
stage table read it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from harness.rss import peak_rss_mb

PI5_BANDWIDTH_GB_S = 17.07  # Raspberry Pi 5 (LPDDR4X-4267, 32-bit): the figure
# llama.cpp's published Raspberry Pi 5 figures for Gemma 4 E2B Q4_K_M (the issue's): decode, pp512
PI5_LLAMACPP_E2B_Q4_K_M = {"decode_tok_s": 6.44, "prefill_tok_s_pp512": 31.98}


def reset_peak() -> bool:
    """Start a new VmHWM window (Linux: writing 5 to clear_refs resets the peak to the current RSS)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakTracer:
    """Samples this process's RSS every ``interval`` seconds from a thread and, each time it climbs
    ``step`` bytes past its highest so far, records where the main thread is (the innermost frames
    of harness, torch, torchao and executorch code): at E2B size, which step of a stage holds the
    memory is the question, not only how much."""

    def __init__(self, interval: float = 0.5, step: int = 512 << 20, frames: int = 6, progress=None):
        import threading

        self.interval, self.step, self.frames = interval, step, frames
        self.progress = progress or (lambda m: None)
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.time()
        self.stage = ""

    def _where(self) -> list[str]:
        import traceback

        frame = sys._current_frames().get(self._main)
        if frame is None:
            return []
        stack = [f for f in traceback.extract_stack(frame)
                 if any(k in f.filename for k in ("harness", "torch", "executorch", "torchao"))]
        return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack[-self.frames:]]

    def _run(self) -> None:
        from harness.rss import rss_mb

        high = 0
        while not self._stop.wait(self.interval):
            rss = int(rss_mb() * (1 << 20))
            if rss > high + self.step:
                high = rss
                self.events.append({"t": round(time.time() - self._t0, 1), "stage": self.stage, "rss_bytes": rss,
                                    "where": self._where()})
                self.progress(f"rss {rss / 1e9:.2f} GB at {self.events[-1]['where'][-2:]}")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_stages(directory: str, recipe: str, max_context: int = 1024, progress=print) -> dict:
    from harness.export import preflight
    from harness.models.size import model_size
    from harness.pipeline import Pipeline
    from harness.program import ExportSettings

    size = model_size(directory)
    pipe = Pipeline(directory, recipe, ExportSettings(max_context=max_context), progress=progress, stream=True)
    from harness.bench.host import host_info

    out: dict = {"host": host_info(), "model": directory, "recipe": recipe, "params": size.params,
                 "max_context": max_context, "fp32_bytes": size.fp32_bytes, "stages": {}}
    windows = reset_peak()
    tracer = PeakTracer(progress=progress)
    out["rss_trace"] = tracer.events
    with tracer:
        for stage, attr, est_stage in (("load+quantize", "quantized", "quantize"), ("export", "pt2_path", "export"),
                                       ("lower+serialize", "pte_path", "lower")):
            tracer.stage = stage
            _stage(pipe, out, size, recipe, stage, attr, est_stage, progress, windows)
    out["peak_windows"] = windows
    out["lower_report"] = pipe.lower_report
    return out


def _stage(pipe, out, size, recipe, stage, attr, est_stage, progress, windows) -> None:
    from harness.export import preflight

    t0 = time.time()
    value = getattr(pipe, attr)
    row = {"seconds": round(time.time() - t0, 1), "peak_rss_bytes": int(peak_rss_mb() * (1 << 20)),
           "estimate_bytes": preflight.estimate(size, recipe, est_stage, streamed=True).peak_bytes}
    if isinstance(value, Path):
        row["artifact_bytes"] = value.stat().st_size
        row["artifact"] = str(value)
    else:
        from harness.export.pipeline import param_bytes

        row["model_bytes"] = param_bytes(value)
    out["stages"][stage] = row
    progress(f"{stage}: {json.dumps(row)}")
    if stage == "export":  # the quantized model is not needed past the .pt2 (the reload is)
        pipe.release_model()
    if windows:
        reset_peak()


def agreement(directory: str, recipe: str, prompt_tokens: int = 600, new_tokens: int = 8,
              max_context: int = 1024, progress=print) -> dict:
    """The ``.pte`` (ExecuTorch's Python runtime) against eager PyTorch on the same quantized model
    (streamed), greedy over one seeded prompt longer than the sliding window and the decode steps
    after it; logits compared under ``scale/pte_vs_eager/RECIPE`` (harness/compare.py)."""
    from harness.bench.protocol import bench_prompts
    from harness.bench.roofline import torch_bytes_per_token
    from harness.compare import compare_runs
    from harness.pipeline import Pipeline
    from harness.program import ExportSettings

    pipe = Pipeline(directory, recipe, ExportSettings(max_context=max_context), progress=progress, stream=True)
    vocab = int(pipe.loaded.config.vocab_size)
    prompt = bench_prompts(1, prompt_tokens, vocab, seed=17)[0]
    out: dict = {"model": directory, "recipe": recipe, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
                 "sliding_window": int(pipe.loaded.config.sliding_window)}
    out["bytes_per_token"] = torch_bytes_per_token(pipe.quantized, prompt_tokens + new_tokens)
    t0 = time.time()
    eager = pipe.runtime("eager").generate(prompt, new_tokens)
    out["eager_seconds"] = round(time.time() - t0, 1)
    out["eager_nudged_max_abs_logit_diff"] = nudge_sensitivity(pipe, prompt, eager.step_logits[0])
    t0 = time.time()
    pte = pipe.runtime("pte").generate(prompt, new_tokens)
    out["pte_seconds"] = round(time.time() - t0, 1)
    diffs, margins = [], []
    for a, b in zip(eager.step_logits, pte.step_logits):
        diffs.append(float((a.float() - b.float()).abs().max()))
        top = a.float().topk(2).values
        margins.append(float(top[0] - top[1]))
    out.update(eager_ids=eager.ids, pte_ids=pte.ids, max_abs_logit_diff=diffs, eager_top2_margin=margins,
               logit_range=[float(min(l.min() for l in eager.step_logits)), float(max(l.max() for l in eager.step_logits))],
               finite=bool(all(l.isfinite().all() for l in pte.step_logits)),
               problem=compare_runs(eager, pte, f"scale/pte_vs_eager/{recipe}", "eager", ".pte"))
    out["pte_over_nudge"] = diffs[0] / max(out["eager_nudged_max_abs_logit_diff"], 1e-12)
    return out


def nudge_sensitivity(pipe, prompt: list[int], reference, rel: float = 1e-6) -> float:
    """How far eager's logits at the prompt's last position move when the token embeddings are
    scaled by 1 + ``rel`` (1e-6): what rounding alone does to this model (dynamic INT8 activation codes
    flip). 0.18 on the generated E2B-shaped checkpoint (2026-12-05); 2.76, as large as the logits
    themselves, on its older, chaotic weights (q/k norms of ones)."""
    import torch

    runtime = pipe.runtime("eager")
    # the module that looks tokens up: the fast wrapper's shared table where it has one
    target = getattr(runtime.wrapper, "tied", None)
    if target is None:
        target = pipe.quantized.model.embed_tokens
    hook = target.register_forward_hook(lambda m, i, o: o * (1 + rel))
    try:
        nudged = runtime.step(prompt, list(range(len(prompt))))[0, -1]
    finally:
        hook.remove()
    return float((nudged.float() - torch.as_tensor(reference).float()).abs().max())


def speed(pte: str, gguf: str, config, threads: int = 2, prompts: int = 3, prompt_tokens: int = 128,
          new_tokens: int = 32, rounds: int = 3, progress=print) -> dict:
    """The ``.pte`` through the native runner against llama.cpp on the GGUF of the same weights,
    each in a process of its own, in alternating (paired) passes over the same seeded prompts:
    medians of prefill, decode and time to first token, the paired ratios, each side's load time
    and peak RSS (a fresh process each), bytes read per decode token and the share of the measured
    read bandwidth that decode reaches."""
    from harness.bench.host import host_info
    from harness.bench.protocol import bench_prompts, medians
    from harness.bench.roofline import gguf_bytes_per_token, read_bandwidth
    from harness.runtimes.process import isolated, measure_once

    ids = bench_prompts(prompts, prompt_tokens, int(config.vocab_size))
    sides = {"native": ("executorch-native", pte), "llama.cpp": ("llama.cpp", gguf)}
    out: dict = {"host": host_info(threads), "threads": threads, "prompts": prompts, "prompt_tokens": prompt_tokens,
                 "new_tokens": new_tokens, "rounds": rounds, "bytes": {"pte": Path(pte).stat().st_size, "gguf": Path(gguf).stat().st_size}}
    for name, (kind, artifact) in sides.items():
        once = measure_once(kind, artifact, threads, ids[0], new_tokens, timeout=3600)
        out[name] = {"load_s": once["load_s"], "peak_rss_bytes": int(once["peak_rss_mb"] * (1 << 20))}
        progress(f"{name}: loaded in {once['load_s']:.1f} s, peak RSS {once['peak_rss_mb']:.0f} MB")
    runners = {name: isolated(kind, artifact, threads, timeout=3600) for name, (kind, artifact) in sides.items()}
    samples: dict = {name: [] for name in sides}
    try:
        for name, r in runners.items():  # warm-up pass each
            r.generate(ids[0], new_tokens)
        for i in range(rounds):
            for name, r in (runners.items() if i % 2 == 0 else reversed(list(runners.items()))):
                samples[name] += [r.generate(p, new_tokens) for p in ids]
            progress(f"round {i + 1}/{rounds}: " + ", ".join(
                f"{n} decode {medians(s)['decode_tok_s']:.2f} tok/s" for n, s in samples.items()))
    finally:
        for r in runners.values():
            r.close()
    for name in sides:
        out[name].update(medians(samples[name]))
    ours, theirs = out["native"], out["llama.cpp"]
    out["ratio_decode"] = ours["decode_tok_s"] / theirs["decode_tok_s"]
    out["ratio_prefill"] = ours["prefill_tok_s"] / theirs["prefill_tok_s"]
    from harness.runtimes.native import native_runner

    bw = read_bandwidth(threads=threads, runner=[str(native_runner())])
    out["read_bandwidth_gb_s"], out["read_bandwidth_kernel"] = bw.read_gb_s, bw.kernel
    context = prompt_tokens + new_tokens // 2
    out["llama.cpp"]["bytes_per_token"] = gguf_bytes_per_token(gguf, config, context)
    return out


def _pte_parts(path) -> tuple[int, int, list[dict], list[dict], int]:
    """(file bytes, constant segment bytes, every constant tensor ExecuTorch's kernels read, every
    named data entry (the XNNPACK delegates' weights), delegate count), from the program header:
    the weights are not loaded."""
    import mmap

    from executorch.exir._serialize._program import _flatbuffer_to_program, _get_extended_header
    from executorch.exir.schema import Tensor

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        header = _get_extended_header(mm[:64])
        program = _flatbuffer_to_program(bytes(mm[:header.program_size]))
        total = len(mm)
    offsets = list(program.constant_segment.offsets)
    constant_bytes = program.segments[program.constant_segment.segment_index].size if offsets else 0
    ends = offsets[1:] + [constant_bytes]
    constants = []
    for value in program.execution_plan[0].values:
        t = value.val
        if isinstance(t, Tensor) and 0 < t.data_buffer_idx < len(offsets):
            constants.append({"dtype": t.scalar_type.name, "shape": list(t.sizes),
                              "bytes": ends[t.data_buffer_idx] - offsets[t.data_buffer_idx]})
    named = [{"key": n.key, "bytes": program.segments[n.segment_index].size} for n in program.named_data]
    return total, constant_bytes, constants, named, len(program.execution_plan[0].delegates)


def pte_composition(path) -> dict:
    """What a ``.pte``'s bytes hold: the constant tensors ExecuTorch's own kernels read (the
    embedding tables: ``BYTE`` rows are INT4 packed two per byte, ``CHAR`` INT8), with their shapes,
    and the XNNPACK delegates' named data (packed weights and scales), largest first."""
    total, constant_bytes, constants, named, delegates = _pte_parts(path)
    named.sort(key=lambda e: -e["bytes"])
    constants.sort(key=lambda e: -e["bytes"])
    return {"bytes": total, "constant_bytes": constant_bytes, "constants": constants[:8],
            "delegate_named_bytes": sum(e["bytes"] for e in named), "delegate_named_largest": named[:6],
            "delegates": delegates}


def token_table_copies(path, vocab: int, hidden: int) -> list[str]:
    """Every copy of a [vocab, hidden] token table a ``.pte`` stores, in any form: a constant of
    ExecuTorch's kernels ([V, D] FP32 or INT8, [V, D/2] INT4 packed) or an XNNPACK weight blob of
    V x D/2 bytes (INT4: a packed ``lm_head``) or V x D (INT8)."""
    _, _, constants, named, _ = _pte_parts(path)
    copies = [f"constant {c['dtype']} {c['shape']}" for c in constants
              if c["shape"] in ([vocab, hidden], [vocab, hidden // 2])]
    copies += [f"XNNPACK weights, {e['bytes']} bytes" for e in named
               if e["bytes"] in (vocab * hidden // 2, vocab * hidden)]
    return copies


def pi5_projection(bytes_per_token: int, roofline_fraction: float, bandwidth_gb_s: float = PI5_BANDWIDTH_GB_S) -> float:
    """Decode tok/s on a Raspberry Pi 5, projected: its DRAM read bandwidth over the bytes one
    decode token reads, times the share of the roofline decode reached here. A projection, not a
    measurement."""
    return bandwidth_gb_s * 1e9 / bytes_per_token * roofline_fraction


def projection(speed_res: dict, pte_bytes_per_token: int) -> dict:
    """Each side's decode as a share of the read roofline measured here, and the Pi 5 projection
    from it, beside llama.cpp's published Pi 5 figure (labelled: a projection)."""
    bw = speed_res["read_bandwidth_gb_s"] * 1e9
    out = {}
    for name, per_token in (("native", pte_bytes_per_token), ("llama.cpp", speed_res["llama.cpp"]["bytes_per_token"])):
        fraction = speed_res[name]["decode_tok_s"] * per_token / bw
        out[name] = {"bytes_per_token": per_token, "roofline_fraction": fraction,
                     "pi5_projected_decode_tok_s": pi5_projection(per_token, fraction)}
    out["pi5_published_llamacpp_q4_k_m"] = PI5_LLAMACPP_E2B_Q4_K_M
    return out


def _main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "stages":
        ctx = int(argv[3]) if len(argv) > 3 else 1024
        res = run_stages(argv[1], argv[2], ctx, progress=lambda m: print(m, file=sys.stderr, flush=True))
        print(json.dumps(res))
        return 0
    if len(argv) >= 3 and argv[0] == "agreement":
        res = agreement(argv[1], argv[2], progress=lambda m: print(m, file=sys.stderr, flush=True))
        print(json.dumps(res))
        return 0
    if len(argv) >= 4 and argv[0] == "speed":
        from harness.export.stream import text_config

        res = speed(argv[1], argv[2], text_config(argv[3]), progress=lambda m: print(m, file=sys.stderr, flush=True))
        print(json.dumps(res))
        return 0
    print("usage: python -m harness.bench.scale stages DIR RECIPE [MAX_CONTEXT] | agreement DIR RECIPE | "
          "speed PTE GGUF DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(_main(sys.argv[1:]))
