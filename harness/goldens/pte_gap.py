"""Between the exported program and the ``.pte``: which delegate call or portable op moved first.

When the ``pte`` stage's golden moves and the ``exported`` stage's does not, the change is in
lowering or in ExecuTorch's runtime (XNNPACK's kernels, a portable kernel, the emitter). This module
names the first operator of the ``.pte`` whose output disagrees with the program it was lowered from:

1. The ETRecord: the program lowered once more with ``generate_etrecord=True``
   (harness/export/lower.py), kept in the artifact cache beside the ``.pte`` under the same key.
   That lowering must give the cached ``.pte`` byte for byte, or the record describes another
   program: refused in one line.
2. The ETDump: the ``.pte`` run through ExecuTorch's Python runtime with event tracing and a debug
   buffer, one forward over the prompt (its prefill), every intermediate output logged.
3. ExecuTorch's Inspector matches the two by debug handle and runs the record's edge-dialect program
   on the same input (``calculate_numeric_gap``) with this module's comparator: relative L2,
   ||pte - program|| / ||program||, per operator in forward order (the smallest debug handle).

What XNNPACK exposes: each delegate call as one event, its outputs only. The ETDump carries no
intermediate inside a delegate, so the finest name for a move inside XNNPACK is the delegate call,
which the harness gives with the modules its operators come from (``nn_module_stack``): 123 calls
for the fixture's ``8da4w`` program (each a few ops: a linear, a norm's tail, an attention block's
arithmetic), 7 for ``8da4w-fast`` (large regions between its custom ops). Portable ops (the ones
XNNPACK does not take: mean, pow, index_put of the KV cache, slices) are logged one by one.

A delegate call with several outputs (a q/k/v projection block, the RoPE tables) is left out and
counted: which of its outputs the program's value is, the ETDump does not say, and pairing by shape
picked wrong ones. A move inside such a call is named at the first single-output call it reaches.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError

DEBUG_BUFFER_BYTES = 256 << 20  # every intermediate of one fixture prefill fits many times over


@dataclass
class OpGap:
    order: int  # the smallest debug handle: forward order in the edge program
    kind: str  # "delegate call" (XNNPACK) or "portable op"
    ops: list[str]  # the edge program's operators it covers
    modules: list[str]  # the model's modules those operators come from
    gap: float  # relative L2 of the runtime's output against the program's

    def name(self) -> str:
        where = module_summary(self.modules)
        ops = ", ".join(self.ops[:3]) + (f" (+{len(self.ops) - 3} more)" if len(self.ops) > 3 else "")
        return f"{self.kind} [{ops}]" + (f" in {where}" if where else "")


@dataclass
class GapReport:
    rows: list[OpGap] = field(default_factory=list)
    tolerance: float = 0.0
    prompt_tokens: int = 0
    skipped: int = 0  # outputs of multi-output delegate calls, which the ETDump does not pair
    uncompared: list[OpGap] = field(default_factory=list)  # those calls, one each (gap nan)

    @property
    def first(self) -> OpGap | None:
        return next((r for r in self.rows if not r.gap <= self.tolerance), None)

    def line(self, stage: str = "pte") -> str:
        """The localization line for the ``.pte``: the first operator over the tolerance, and that
        everything before it is within bounds."""
        first = self.first
        n = sum(r.kind == "delegate call" for r in self.rows)
        if first is None:
            worst = max((r.gap for r in self.rows), default=0.0)
            return (f"no operator of the {stage} moves: {len(self.rows)} outputs ({n} delegate calls) within "
                    f"{self.tolerance:g} of the program it was lowered from (largest {worst:.3g})")
        before = [r for r in self.rows if r.order < first.order]
        worst = max((r.gap for r in before), default=0.0)
        tail = (f"everything before it ({len(before)} outputs, {sum(r.kind == 'delegate call' for r in before)} "
                f"delegate calls) within {self.tolerance:g} (largest {worst:.3g})" if before else "it is the first output")
        last = max((r.order for r in before), default=-1)
        between = [u for u in self.uncompared if last < u.order < first.order]
        hidden = (f"; between them, not compared (a delegate call with several outputs): "
                  + "; ".join(u.name() for u in between) if between else "")
        return (f"first operator to move in the {stage} (prefill of {self.prompt_tokens} tokens, against the "
                f"program it was lowered from): {first.name()} moves {first.gap:.3g} (relative L2); {tail}{hidden}")


def module_summary(modules: list[str]) -> str:
    """``model.layers.2.mlp.down_proj`` for one module; the first and the last, in forward order,
    and a count for several."""
    if not modules:
        return ""
    if len(set(modules)) == 1:
        return modules[0]
    return f"{modules[0]} .. {modules[-1]} ({len(set(modules))} modules)"


UNPAIRED = math.nan  # the comparator's answer for values that cannot be the same output


def relative_l2(a, b) -> float:
    """Relative L2 of ``b`` against ``a`` over their finite places; where either is not finite
    (an attention mask's -inf, a nan) the two must be the same, or the gap is inf. ``UNPAIRED``
    (nan) for values that cannot be one output (not tensors, other sizes)."""
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.numel() != b.numel():
        return UNPAIRED
    # a delegate's output can be the program's value before a view (1x4x8x32 against 4x8x32)
    a, b = a.detach().reshape(-1).double(), b.detach().reshape(-1).double()
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else math.inf
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not finite.all():
        x, y = a[~finite], b[~finite]
        if not bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all()):
            return math.inf
        a, b = a[finite], b[finite]
    norm = float(torch.linalg.vector_norm(a))
    diff = float(torch.linalg.vector_norm(a - b))
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


def _comparator():
    from executorch.devtools.inspector.numerical_comparator.numerical_comparator_base import NumericalComparatorBase

    class RelativeL2(NumericalComparatorBase):
        """Relative L2 per output."""

        def element_compare(self, a, b) -> float:
            return relative_l2(a, b)

    return RelativeL2()


def save_etrecord(program, path: Path, pte_sha256: str) -> None:
    """The ETRecord of ``program`` (from ``lower(..., etrecord=True)``), refused if the program is
    not the ``.pte`` the record is for."""
    import hashlib

    from harness.export.pte import seal

    got = hashlib.sha256(seal(program.buffer)).hexdigest()  # the .pte is the program and its seal
    if got != pte_sha256:
        raise HarnessError(f"lowering again for the ETRecord gave another program (sha256 {got[:12]}, the .pte "
                           f"{pte_sha256[:12]}): lowering is not deterministic here",
                           "report it with both files; the numeric gap cannot be computed for this .pte")
    program.get_etrecord().save(str(path))


def etrecord_path(pipe) -> Path:
    """The ETRecord for ``pipe``'s ``.pte``, from the artifact cache (stage ``etrecord``, the
    ``.pte``'s own key: the lowering keeps it there for programs up to 1 GiB,
    ``BuildPipeline.etrecord_with_lowering``) or lowered once more and checked against the ``.pte``.
    A kept record is taken only for the ``.pte`` it was made with (its sha256)."""
    from harness.cache import sha256_file
    from harness.export.lower import lower
    from harness.program import runner_metadata

    pte = pipe.pte_path

    def build(path: Path):
        pipe.progress(f"lowering {pipe.loaded.name} [{pipe.recipe.name}] once more for its ETRecord ...")
        program, _ = lower([pipe.exported], pipe.recipe, runner_metadata(pipe.loaded, pipe.settings, pipe.recipe),
                           etrecord=True)
        pipe.__dict__.pop("exported", None)
        want = sha256_file(pte)
        save_etrecord(program, path, want)
        return {"pte_sha256": want}

    key = pipe._key("pte")
    found = pipe.cache.lookup("etrecord", key, "etrecord.bin")
    if found is not None and pipe.cache.meta("etrecord", key).get("pte_sha256") != sha256_file(pte):
        import shutil

        shutil.rmtree(pipe.cache.entry("etrecord", key), ignore_errors=True)  # another lowering's .pte
    return pipe.cache.get_or_build("etrecord", key, "etrecord.bin", build)


def trace_pte(pte_path: Path, ids: list[int], workdir: Path, debug_buffer_bytes: int = DEBUG_BUFFER_BYTES):
    """Run one forward of the ``.pte`` over ``ids`` with ETDump and a debug buffer; returns the
    ETDump and debug-buffer paths."""
    import torch
    from executorch.runtime import Runtime

    from harness.export.pte import _ensure_kernels

    _ensure_kernels()  # the quantized kernels the .pte's portable ops name (embedding_byte)
    program = Runtime.get().load_program(Path(pte_path), enable_etdump=True, debug_buffer_size=debug_buffer_bytes)
    method = program.load_method("forward")
    method.execute([torch.tensor([ids], dtype=torch.long), torch.arange(len(ids), dtype=torch.long)])
    etdump, debug = workdir / "run.etdp", workdir / "debug.bin"
    program.write_etdump_result_to_file(str(etdump), str(debug))
    if not etdump.is_file() or etdump.stat().st_size == 0:
        raise HarnessError(f"{pte_path}: the runtime wrote no ETDump",
                           "use an executorch built with the event tracer (EXECUTORCH_ENABLE_EVENT_TRACER=ON; the PyPI wheel is)")
    return etdump, debug


def numeric_gap(etrecord: Path, pte_path: Path, ids: list[int], tolerance: float) -> GapReport:
    """Every operator output of ``pte_path`` against the record's program, on ``ids``, in forward order."""
    import logging

    import torch
    from executorch.devtools import Inspector
    from executorch.devtools.etrecord import parse_etrecord

    record = parse_etrecord(str(etrecord))
    record.update_representative_inputs([(torch.tensor([ids], dtype=torch.long), torch.arange(len(ids), dtype=torch.long))])
    with tempfile.TemporaryDirectory(prefix="harness-etdump-") as tmp:
        etdump, debug = trace_pte(pte_path, ids, Path(tmp))
        # the edge-dialect program is the reference: the ATen one loses debug handles over the
        # symbolic sequence length, and the Inspector says so at WARNING each time
        logging.getLogger("executorch.devtools.inspector._inspector").setLevel(logging.ERROR)
        inspector = Inspector(etdump_path=str(etdump), etrecord=record, debug_buffer_path=str(debug))
        df = inspector.calculate_numeric_gap(_comparator(), reference_graph="edge_dialect_exported_program")
        graph = inspector._resolve_reference_graph("edge_dialect_exported_program")[0]
    modules = _handle_modules(graph)
    groups = df["aot_debug_handle"].map(tuple).value_counts() if len(df) else {}
    rows, skipped, uncompared = [], 0, []
    for _, r in df.iterrows():
        handles = list(r["aot_debug_handle"])
        gaps = [float(g) for g in r["gap"]]
        gap = max(gaps) if gaps else 0.0
        delegate = any("DELEGATE" in str(op) for op in (r["runtime_ops"] or []))
        # a delegate call with several outputs comes as one row per output, each paired with a
        # value the ETDump does not tie to it (pairing by shape picked wrong ones): left out
        row = OpGap(min(handles), "delegate call" if delegate else "portable op", list(r["aot_ops"]),
                    list(dict.fromkeys(modules[h] for h in sorted(handles) if modules.get(h))), float(gap))
        if groups[tuple(handles)] > 1 or any(math.isnan(g) for g in gaps):
            skipped += 1
            if not any(u.order == row.order for u in uncompared):
                uncompared.append(OpGap(row.order, row.kind, row.ops, row.modules, math.nan))
            continue
        rows.append(row)
    rows.sort(key=lambda r: r.order)
    return GapReport(rows, tolerance, len(ids), skipped, sorted(uncompared, key=lambda u: u.order))


def _handle_modules(graph_module) -> dict[int, str]:
    """Debug handle → the innermost module its node was traced in (``model.layers.2.mlp.down_proj``)."""
    out = {}
    for node in graph_module.graph.nodes:
        handle = node.meta.get("debug_handle")
        stack = node.meta.get("nn_module_stack")
        if isinstance(handle, int) and stack:
            path = list(stack.values())[-1][0]
            out[handle] = _clean(path)
    return out


def _clean(path: str) -> str:
    """``L['self'].model.layers[2].mlp`` and ``model.layers.2.mlp`` alike become the latter, without
    the export wrapper's prefix."""
    import re

    path = re.sub(r"L\['self'\]\.?", "", path)
    path = re.sub(r"^model\.", "", path)  # the export wrapper's own attribute
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"getattr\(([^,]+), '(\d+)'\)", r"\1.\2", path)
    return path.strip(".")


# ---- in ``goldens diff``: the .pte moved, the exported program did not ---------------------------
def pte_moved_alone(moves: dict, recipe: str) -> list[str]:
    """The prompts whose ``pte`` stage moved (ids, or logits beyond the golden's tolerance) while
    the ``exported`` stage of the same recipe did not: the change is in lowering or the runtime."""
    exported = set(moves.get(f"{recipe}:exported", {}).get("moved_prompts", ()))
    return [p for p in moves.get(f"{recipe}:pte", {}).get("moved_prompts", ()) if p not in exported]


def gap_tolerance(recipe: str) -> tuple[str, float] | None:
    """``(name, bound)`` of the recipe's calibrated ``pte_gap`` tolerance, or None if it has none."""
    from harness.tolerances import TOLERANCES

    name = f"pte_gap/{recipe}"
    return (name, TOLERANCES[name].atol) if name in TOLERANCES else None


def gap_report(etrecord: Path, pte_path: Path, ids: list[int], recipe: str, calibrating: bool = True) -> GapReport:
    """``numeric_gap`` under the recipe's tolerance; the largest gap is observed for the tolerance
    report (harness/tolerances.py) unless the ``.pte`` was moved on purpose (``calibrating=False``)."""
    from harness.tolerances import observe

    named = gap_tolerance(recipe)
    if named is None:
        raise HarnessError(f"no pte_gap tolerance is calibrated for {recipe}",
                           "calibrate one in harness/tolerances.py on the untouched .pte (tests/test_pte_gap.py)")
    name, bound = named
    report = numeric_gap(etrecord, pte_path, ids, bound)
    if calibrating:
        observe(name, max((r.gap for r in report.rows), default=0.0))
    return report


def _cached_gap(subject, recipe: str, prompt: str, progress) -> GapReport:
    """The numeric gap of the recipe's cached ``.pte`` on ``prompt`` (its ETRecord from the cache,
    or one more lowering, checked against the ``.pte``'s bytes)."""
    from harness.export.pipeline import BuildPipeline
    from harness.pipeline import encode_prompt
    from harness.program import ExportSettings

    pipe = BuildPipeline(subject.spec, recipe, ExportSettings(max_context=subject.max_context), progress=progress)
    if pipe.recipe.export == "fast":  # the record's program calls llama:: ops, which the Inspector runs
        from harness.oplib import load_custom_ops_for_export

        load_custom_ops_for_export()
    return gap_report(etrecord_path(pipe), pipe.pte_path, encode_prompt(pipe.loaded.tokenizer, prompt), recipe)


def pte_localization_lines(subject, moves: dict, progress=print, gap=None) -> list[str]:
    """One line per recipe whose ``.pte`` moved alone: the first operator of the ``.pte`` beyond
    ``pte_gap/RECIPE`` on the first such prompt, or why it cannot be said. ``gap(recipe, prompt)``
    gives the report (the cached ``.pte`` by default)."""
    lines = []
    for recipe in subject.chain_recipes():
        prompts = pte_moved_alone(moves, recipe)
        if not prompts:
            continue
        if gap_tolerance(recipe) is None:
            lines.append(f"{recipe}:pte moved and {recipe}:exported did not, on {len(prompts)} prompt(s); its "
                         f"operators are not compared: no pte_gap/{recipe} tolerance is calibrated (harness/tolerances.py)")
            continue
        progress(f"{recipe}:pte moved alone: comparing the .pte's operators with the program it was lowered from ...")
        report = (gap or (lambda r, p: _cached_gap(subject, r, p, progress)))(recipe, prompts[0])
        lines.append(f"{recipe}, {prompts[0]!r}: " + report.line(f"{recipe} .pte"))
    return lines
