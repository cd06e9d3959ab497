"""Decode roofline: this machine's memory read bandwidth, and the bytes a decode step must read.

Decoding one token reads every weight the step multiplies by (each linear, the output projection)
once, one row of each embedding table, and the KV cache up to the current position. At batch 1
that traffic dominates, so ``bandwidth / bytes per token`` bounds decode tok/s; a runtime's
decode rate divided by that bound is its fraction of the roofline.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass


@dataclass
class Bandwidth:
    threads: int
    read_gb_s: float
    buffer_mb: int
    kernel: str = ""  # the read loop that gave the best figure


def _timed(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def read_bandwidth(threads: int | None = None, buffer_mb: int = 512, repeats: int = 5,
                   runner: list[str] | None = None) -> Bandwidth:
    """Best read bandwidth over a buffer far larger than any cache, from every read loop available
    here (best of ``repeats`` each): ``threads`` Python threads each summing their slice with
    numpy (which releases the GIL), torch's vectorized multi-threaded ``sum`` on ``threads``
    threads, and, given ``runner`` (how to start the native runner), its C++ loop
    (``et_native - THREADS --bandwidth MB``), which is all a device without numpy has. The roofline
    needs the most this machine can read: numpy's float64 pairwise sum alone measured 17-21 GB/s
    here, while torch's sum read 28.5 GB/s and llama.cpp F32 decoding moved 27 GB/s, which put
    runtimes at 156% of a roofline that was too low."""
    threads = threads or os.cpu_count() or 1
    results = {}
    if runner:
        results["native runner, one slice per thread"] = _runner_seconds(runner, threads, buffer_mb)
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        results.update(_numpy_and_torch_seconds(np, threads, buffer_mb, repeats))
    if not results:
        raise ImportError("no read loop here: numpy is not installed and no native runner was given")
    kernel, best = min(results.items(), key=lambda kv: kv[1])
    return Bandwidth(threads=threads, read_gb_s=buffer_mb * (1 << 20) / best / 1e9, buffer_mb=buffer_mb, kernel=kernel)


def _runner_seconds(runner: list[str], threads: int, buffer_mb: int) -> float:
    """The native runner's best pass over ``buffer_mb``, as seconds for the same bytes."""
    import json
    import subprocess

    from harness.errors import HarnessError

    cmd = [*runner, "-", str(threads), "--bandwidth", str(buffer_mb)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise HarnessError(f"the native runner could not measure bandwidth (exit {out.returncode}: "
                           f"{(out.stderr.strip().splitlines() or ['no output'])[-1]})", "run by hand: " + " ".join(cmd))
    gb_s = json.loads(out.stdout.strip().splitlines()[-1])["read_gb_s"]
    return buffer_mb * (1 << 20) / (gb_s * 1e9)


def _numpy_and_torch_seconds(np, threads: int, buffer_mb: int, repeats: int) -> dict[str, float]:
    data = np.ones(buffer_mb * (1 << 20) // 8, dtype=np.float64)
    parts = np.array_split(data, threads)
    for p in parts:  # fault every page in before timing
        p.sum()

    def numpy_threads() -> float:  # seconds from the barrier on: thread start-up is not reading
        barrier = threading.Barrier(threads + 1)

        def work(part):
            barrier.wait()
            part.sum()

        pool = [threading.Thread(target=work, args=(p,)) for p in parts]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        return time.perf_counter() - t0

    results = {"numpy sum, one slice per thread": min(numpy_threads() for _ in range(repeats))}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        view = torch.from_numpy(data).view(torch.float32)  # the same bytes
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            view.sum()
            results["torch sum"] = min(_timed(view.sum) for _ in range(repeats))
        finally:
            torch.set_num_threads(before)
    return results


def _tensor_bytes(t) -> int:
    """Bytes a runtime reads for a weight. torchao keeps INT4 codes unpacked in int8 tensors;
    XNNPACK (and llama.cpp) read them packed, so codes count at the target bit width, scales as
    stored, and all-zero zero points (symmetric schemes) not at all."""
    names = getattr(t, "tensor_data_names", None)
    if not names:
        return t.numel() * t.element_size()
    bits = {"int4": 4, "uint4": 4, "int2": 2, "int1": 1}.get(str(getattr(t, "target_dtype", "")).replace("torch.", ""))
    total = 0
    for name in names:
        part = getattr(t, name, None)
        if part is None:
            continue
        if name == "qdata" and bits:
            total += (part.numel() * bits + 7) // 8
        elif name == "zero_point" and not bool(part.any()):
            continue
        else:
            total += part.numel() * part.element_size()
    return total


def layer_head_dim(config, i: int) -> int:
    """Layer ``i``'s head size: transformers 5.24 keeps per-layer overrides in a sequence view
    (``config.per_layer_config[i].head_dim``); older releases use ``global_head_dim``."""
    view = getattr(config, "per_layer_config", None)
    try:
        return int(view[i].head_dim)
    except (TypeError, IndexError, KeyError, AttributeError):
        pass
    if config.layer_types[i] == "full_attention" and getattr(config, "global_head_dim", None):
        return int(config.global_head_dim)
    return int(config.head_dim)


def kv_bytes_per_token(config, context: int, bytes_per_value: int = 4) -> int:
    """KV cache read by one decode step at ``context`` positions (shared layers read no cache of
    their own; sliding layers read at most the window)."""
    n_layers = config.num_hidden_layers
    shared = getattr(config, "num_kv_shared_layers", 0) or 0
    total = 0
    for i, kind in enumerate(config.layer_types[: n_layers - shared]):
        head_dim = layer_head_dim(config, i)
        span = min(context, config.sliding_window) if kind == "sliding_attention" else context
        total += 2 * config.num_key_value_heads * head_dim * span * bytes_per_value
    return total


def torch_bytes_per_token(model, context: int) -> int:
    """Bytes one decode step reads for a (possibly torchao-quantized) transformers model: every
    linear weight (the tied output projection included), one row per embedding table, the KV cache."""
    import torch

    total, seen = 0, set()
    for module in model.modules():
        w = getattr(module, "weight", None)
        if w is None or id(w) in seen and not isinstance(module, torch.nn.Linear):
            continue
        if isinstance(module, torch.nn.Embedding):
            total += _tensor_bytes(w) // module.num_embeddings  # one row
        elif isinstance(module, torch.nn.Linear):
            total += _tensor_bytes(w)
        seen.add(id(w))
    return total + kv_bytes_per_token(model.config, context)


def gguf_bytes_per_token(gguf_path, config, context: int) -> int:
    """The same count for a GGUF file, from its tensor table: embedding tables contribute one row,
    except ``token_embd`` when there is no separate ``output.weight`` (tied: read in full)."""
    from harness.runtimes.llamacpp_setup import gguf_py

    reader = gguf_py().GGUFReader(str(gguf_path))  # llama.cpp's own reader, from its sdist
    names = {t.name for t in reader.tensors}
    total = 0
    for t in reader.tensors:
        size = int(t.n_bytes)
        if t.name == "token_embd.weight" and "output.weight" not in names:
            total += size + size // int(t.shape[-1])  # the output projection, plus the looked-up row
        elif "token_embd" in t.name:
            total += size // int(t.shape[-1])  # one row (gguf shapes list the row count last)
        else:
            total += size
    return total + kv_bytes_per_token(config, context)
