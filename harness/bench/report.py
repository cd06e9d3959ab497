"""``harness bench report RESULT.json``: a pytest-benchmark JSON (from ``pytest -m bench`` or
``pytest -m pi5`` with ``--benchmark-json``) as a markdown table in the style of llama-bench, and
a PNG chart of the same figures. Runtimes that could not be built are listed with the reason."""

from __future__ import annotations

import json
from pathlib import Path

from harness.errors import HarnessError

COLUMNS = ["model", "recipe", "runtime", "threads", "prefill tok/s", "decode tok/s", "TTFT ms",
           "load s", "peak RSS MB", "model RSS MB", "J/token", "roofline", "vs llama.cpp"]


def read_result(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise HarnessError(f"benchmark result {path} does not exist",
                           "run: pytest -m bench --benchmark-json out.json, then pass out.json")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise HarnessError(f"{path} is not valid JSON ({e})", "pass the file written by --benchmark-json") from e
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise HarnessError(f"{path} is not a pytest-benchmark result (no 'benchmarks' list)",
                           "pass the file written by pytest --benchmark-json")
    rows = [b for b in data["benchmarks"] if isinstance(b, dict) and "decode_tok_s" in b.get("extra_info", {})]
    if not rows and not (data.get("harness") or {}).get("failures"):
        raise HarnessError(f"{path} holds no harness benchmark figures",
                           "pass the JSON of a `pytest -m bench` or `pytest -m pi5` run")
    return data


def rows(data: dict) -> list[dict]:
    """One dict per benchmark, with ``ratio`` = decode tok/s over its llama.cpp counterpart's: the
    paired ratio where the counterpart ran in alternating rounds, else row over row."""
    infos = [dict(b["extra_info"], name=b["name"]) for b in data["benchmarks"]
             if "decode_tok_s" in b.get("extra_info", {})]
    for i in list(infos):  # ExecuTorch's C++ LLM runner on the same .pte: a row of its own
        if i.get("runner_decode_tok_s") is not None:
            infos.insert(infos.index(i) + 1, {
                **{k: i.get(k) for k in ("model", "recipe", "kind", "threads", "counterpart", "prompts", "rounds")},
                "via": "runner", "runtime": f"{i.get('runtime')} (runner)",
                "prefill_tok_s": i["runner_prefill_tok_s"], "decode_tok_s": i["runner_decode_tok_s"],
                "ttft_s": i.get("runner_ttft_s"), "load_s": i.get("runner_load_s"),
                "roofline_fraction": (i["runner_decode_tok_s"] / i["roofline_tok_s"]) if i.get("roofline_tok_s") else None,
            })
    by_runtime = {(i.get("model"), i.get("runtime")): i for i in infos}
    for i in infos:
        other = by_runtime.get((i.get("model"), i.get("counterpart")))
        if i.get("paired_ratio_decode") is not None:  # measured in alternating rounds: the one to trust
            i["ratio"] = i["paired_ratio_decode"]
        else:
            i["ratio"] = i["decode_tok_s"] / other["decode_tok_s"] if other and other is not i else None
    return infos


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def markdown(data: dict) -> str:
    body = []
    for i in rows(data):
        runtime = (i.get("kind", i.get("runtime", "?")) + (" (runner)" if i.get("via") == "runner" else "")
                   + (" EMULATED" if i.get("emulated") else ""))
        body.append([
            i.get("model", "?"), i.get("recipe", "?"), runtime, str(i.get("threads", "?")),
            _f(i.get("prefill_tok_s"), ".1f"), _f(i.get("decode_tok_s"), ".1f"),
            _f(i["ttft_s"] * 1e3 if i.get("ttft_s") is not None else None, ".1f"),
            _f(i.get("load_s"), ".2f"), _f(i.get("peak_rss_mb"), ".0f"), _f(i.get("model_rss_mb"), ".0f"),
            _f(i.get("j_per_token"), ".3f"),
            _f(i["roofline_fraction"] * 100 if i.get("roofline_fraction") is not None else None, ".0f") + ("%" if i.get("roofline_fraction") is not None else ""),
            _f(i.get("ratio"), ".2f") + ("×" if i.get("ratio") is not None else ""),
        ])
    widths = [max(len(r[c]) for r in body + [COLUMNS]) for c in range(len(COLUMNS))]
    line = lambda r: "| " + " | ".join(c.rjust(w) if k > 2 else c.ljust(w) for k, (c, w) in enumerate(zip(r, widths))) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + (":" if k > 2 else "-") for k, w in enumerate(widths)) + "|"
    out = [line(COLUMNS), sep] + [line(r) for r in body]
    h = data.get("harness") or {}
    notes = []
    prompt = next(iter(rows(data)), {})
    if prompt:
        notes.append(f"{prompt.get('prompts', '?')} prompts × {prompt.get('rounds', '?')} rounds, "
                     f"prompt {prompt.get('prompt_tokens', '?'):g} tokens, {prompt.get('new_tokens', '?')} new tokens, "
                     "median; warm-up excluded; RSS from a fresh process per runtime (model RSS = peak − "
                     "the interpreter and libraries before loading)")
    if any(i.get("via") == "runner" for i in rows(data)):
        notes.append("(runner) rows: ExecuTorch's C++ TextLLMRunner on the same .pte, its own C++ timings, over "
                     "the 5 chat-templated fixture prompts (about 15 tokens; it stops early at an EOS id)")
    if any(str(i.get("kind", "")) == "executorch-native" for i in rows(data)):
        notes.append("executorch-native rows: the same .pte through ExecuTorch's C++ runtime in a program with no "
                     "Python and no libtorch (harness/runtimes/cpp), timed in C++ around each forward call, over the same "
                     "prompts; its llama:: attention and cache kernels are the harness's own (the executorch wheel "
                     "ships ExecuTorch's only inside a library that links libtorch)")
    paired = [i for i in rows(data) if i.get("paired_ratio_decode") is not None]
    if paired:
        notes.append("vs llama.cpp: decode tok/s over the llama.cpp counterpart's (fp32 over F32, 8da4w* over Q4_0); "
                     f"for {', '.join(i['runtime'] for i in paired)} the counterpart ran in alternating rounds "
                     "with it (paired), the other rows divide by the counterpart's own row")
    bw = h.get("bandwidth")
    if bw:
        notes.append(f"roofline: decode tok/s ÷ (measured read bandwidth {bw['read_gb_s']:.1f} GB/s with "
                     f"{bw['threads']} threads" + (f", {bw['kernel']}" if bw.get("kernel") else "")
                     + " ÷ bytes read per token)")
    machine = (data.get("machine_info") or {})
    cpu = (machine.get("cpu") or {}).get("brand_raw") or machine.get("processor") or "?"
    emulated = emulation(data)
    if emulated:
        notes.insert(0, f"**EMULATED: every rate here was measured under {emulated} on {cpu}. They are the emulator's "
                        "speed, not a Raspberry Pi 5's, and must never be quoted as Pi figures; the run checks the "
                        "goldens and the protocol, not the speed.**")
    board = h.get("board") or machine.get("node", "?")
    if emulated:
        board = f"{emulated} on {board}"
    bundle = h.get("bundle") or {}
    if bundle.get("runner"):
        r = bundle["runner"]
        notes.append(f"native runner: the bundle's {r.get('arch')} build, sha256 {str(r.get('sha256'))[:16]}, "
                     f"{r.get('compiler')}, against {r.get('linked')}")
    if h.get("host"):
        from harness.bench.host import describe

        cpu = describe(h["host"])
    notes.append(f"machine: {board}, {cpu}; governor {h.get('governor') or 'n/a'}"
                 + (f"; throttled before {h.get('throttled_before')} after {h.get('throttled_after')}"
                    if h.get("throttled_after") is not None else ""))
    libs = h.get("libraries")
    if libs:
        notes.append("libraries: " + ", ".join(f"{k} {v}" for k, v in libs.items()))
    for runtime, why in (h.get("failures") or {}).items():
        notes.append(f"**{runtime} did not run:** {why}")
    return "\n".join(out + [""] + [f"- {n}" for n in notes])


def emulation(data: dict) -> str | None:
    """What emulated the run (``qemu cortex-a76``), from the run's context or any row; None on hardware."""
    h = data.get("harness") or {}
    return h.get("emulated") or next((i["emulated"] for i in rows(data) if i.get("emulated")), None)


def chart(data: dict, out: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise HarnessError("matplotlib is not installed, so no chart can be drawn",
                           "pip install matplotlib (it is in the dev extra), or pass --no-chart") from e
    from harness.atomic import atomic_path

    infos = rows(data)
    short = {"executorch": "ET", "executorch-native": "ET\nnative"}
    labels = [f"{short.get(i.get('kind'), i.get('kind'))}\n{i.get('recipe')}" + ("\n(runner)" if i.get("via") == "runner" else "")
              for i in infos]
    fig, axes = plt.subplots(1, 3, figsize=(4 + 1.6 * len(infos), 4.5))
    for ax, key, title in zip(axes, ("prefill_tok_s", "decode_tok_s", "peak_rss_mb"),
                              ("prefill tok/s", "decode tok/s", "peak RSS MB (whole process)")):
        values = [i.get(key) for i in infos]
        bars = ax.bar(range(len(infos)), [v or 0 for v in values],
                      color=["#4c72b0" if i.get("kind") != "llama.cpp" else "#dd8452" for i in infos])
        ax.bar_label(bars, labels=["-" if v is None else f"{v:.0f}" for v in values], fontsize=8)
        ax.set_xticks(range(len(infos)), labels, fontsize=7)
        ax.set_title(title)
    model = infos[0].get("model", "") if infos else ""
    threads = infos[0].get("threads", "") if infos else ""
    emulated = emulation(data)
    fig.suptitle(f"{model}: {threads} threads (median of prompts × rounds)"
                 + (f"\nEMULATED ({emulated}): not Raspberry Pi 5 figures" if emulated else ""))
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out
