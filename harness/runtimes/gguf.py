"""GGUF artifacts for llama.cpp, the independent implementation the harness checks against.

llama.cpp's own converter does the conversion: ``convert_hf_to_gguf.py`` with its ``conversion/``
package and ``gguf-py``, taken from the sdist of the *installed* llama-cpp-python (which vendors
the llama.cpp it was built from), so the converter and the runtime are always the same llama.cpp.
They are extracted once into the artifact cache (``<cache>/llama.cpp-<version>/``). Quantization
goes through the binding (``llama_model_quantize``), i.e. llama.cpp's ``llama-quantize`` code.

Conditions for llama.cpp to reproduce transformers on a Gemma 4 (checked before converting, so a
violation is a one-line error and never an abort inside llama.cpp):

- the tokenizer is Gemma-style BPE with byte fallback, and its vocabulary equals the model's
  ``vocab_size`` (llama.cpp sizes the output layer from the tokenizer's token list);
- with KV sharing, llama.cpp (``src/llama-model.cpp``, the ``reuse`` callback for GEMMA4) makes a
  shared *full* layer read the KV of layer ``n_kv - 1`` and a shared *sliding* layer that of layer
  ``n_kv - 2`` (``n_kv`` = the first shared layer), while transformers reads the last non-shared
  layer of the same type. They agree only when those two layers are the last full / sliding ones,
  as in E2B; otherwise llama.cpp either aborts (``GGML_ASSERT(map_layer_ids.find(il_reuse) !=
  map_layer_ids.end())`` in ``src/llama-kv-cache.cpp``: the reused layer is in the other cache) or
  silently attends to another layer's KV.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.atomic import atomic_path
from harness.cache import ArtifactCache, cache_key
from harness.errors import HarnessError
from harness.runtimes.llamacpp_setup import (capture_llama_log, converter_dir, gguf_py, import_llama_cpp,
                                              llama_cpp_version, log_reason)

GGUF_MAGIC = b"GGUF"
OUTTYPES = ("f32", "f16", "bf16", "q8_0")  # what convert_hf_to_gguf.py writes itself
QUANT_TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
               "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
CONVERT_TIMEOUT_S = 3600



# ---- pre-conversion checks -------------------------------------------------------------------------
def tokenizer_vocab_size(tokenizer_json: Path) -> int:
    spec = json.loads(Path(tokenizer_json).read_text())
    ids = list(spec.get("model", {}).get("vocab", {}).values()) + [t["id"] for t in spec.get("added_tokens", [])]
    return max(ids) + 1 if ids else 0


def kv_sharing_problem(layer_types: list[str], n_shared: int) -> str | None:
    """None when llama.cpp's fixed KV-reuse rule picks the layer transformers picks for every
    shared layer, else a description of the first disagreement."""
    n = len(layer_types)
    if not n_shared:
        return None
    n_kv = n - n_shared
    if n_kv < 2:
        return f"only {n_kv} layer(s) own a KV cache; llama.cpp needs at least 2"
    for il in range(n_kv, n):
        kind = layer_types[il]
        sliding = kind == "sliding_attention"
        target = n_kv - (2 if sliding else 1)  # llama.cpp's rule
        own = [i for i in range(n_kv) if layer_types[i] == kind]
        want = own[-1] if own else None  # transformers' rule
        if target != want:
            return (f"shared layer {il} ({kind}) reads layer {want}'s KV in transformers but layer {target}'s "
                    f"({layer_types[target]}) in llama.cpp, which expects layer {n_kv - 1} (the last with its "
                    f"own KV) full attention and layer {n_kv - 2} sliding, as in Gemma 4 E2B")
    return None


def check_convertible(hf_dir: Path) -> dict:
    """A one-line HarnessError unless llama.cpp can convert ``hf_dir`` and then agree with
    transformers on it; returns the (text) config."""
    from harness.models.load import check_model_dir

    hf_dir = Path(hf_dir)
    check_model_dir(hf_dir)
    tok = hf_dir / "tokenizer.json"
    if not tok.is_file():
        raise HarnessError(f"model directory {hf_dir} has no tokenizer.json, which llama.cpp's converter needs "
                           "(the GGUF carries the tokenizer)",
                           "copy the checkpoint's tokenizer files (tokenizer.json, tokenizer_config.json) into it")
    try:
        raw = json.loads((hf_dir / "config.json").read_text())
        n_tok = tokenizer_vocab_size(tok)
    except (ValueError, KeyError, TypeError) as e:
        raise HarnessError(f"{hf_dir}: config.json or tokenizer.json is not valid ({e})",
                           "restore the checkpoint's files") from e
    cfg = raw.get("text_config") or raw
    vocab = cfg.get("vocab_size")
    if vocab is not None and n_tok != vocab:
        raise HarnessError(f"{hf_dir}: the tokenizer has {n_tok} tokens but the model's vocab_size is {vocab}; "
                           "llama.cpp sizes the output layer from the tokenizer",
                           "pad the tokenizer to vocab_size with <unused_N> tokens (see harness.models.bench.padded_tokenizer)")
    problem = kv_sharing_problem(list(cfg.get("layer_types") or []), int(cfg.get("num_kv_shared_layers") or 0))
    if problem:
        raise HarnessError(f"{hf_dir}: llama.cpp cannot run this KV-sharing layout: {problem}",
                           "use a layer_types order whose last two KV-owning layers are sliding, then full")
    return cfg


# ---- GGUF verification ------------------------------------------------------------------------------
@dataclass
class GGUFInfo:
    path: Path
    architecture: str | None
    n_tensors: int
    bytes: int
    fields: dict


def _field_value(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - an odd field type is not a reason to reject the file
        return None


def check_gguf(path) -> GGUFInfo:
    """Parse the header and tensor table with llama.cpp's own gguf reader and check that every
    tensor's data lies inside the file. A one-line HarnessError for a missing file, a file that is
    not GGUF, or a truncated or corrupt one."""
    path = Path(path)
    redo = "re-convert it (harness.runtimes.gguf.gguf_for rebuilds a cached one; delete a stale file first)"
    if not path.exists():
        raise HarnessError(f"GGUF file {path} does not exist", "convert the model first: harness.runtimes.gguf.gguf_for(MODEL, 'f32')")
    if not path.is_file():
        raise HarnessError(f"{path} is not a file", "pass the .gguf file itself")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != GGUF_MAGIC:
        what = "an empty file" if not head else f"starts with {head[:4]!r}"
        if head[4:8].startswith(b"ET"):
            what += " (an ExecuTorch .pte program)"
        elif head[:2] == b"PK":
            what += " (a zip archive, e.g. a .pt2)"
        raise HarnessError(f"{path} is not a GGUF file ({what}, not the magic b'GGUF')",
                           "pass a GGUF produced by llama.cpp's converter; " + redo)
    gguf = gguf_py()
    try:
        reader = _BoundsCheckingReader.make(gguf)(str(path))
    except _Truncated as e:
        raise HarnessError(f"GGUF file {path} is truncated: {e}", redo) from None
    except Exception as e:  # noqa: BLE001 - the reader signals corruption with many exception types
        msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise HarnessError(f"GGUF file {path} is corrupt or truncated ({size} bytes; gguf reader: {msg})", redo) from None
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise HarnessError(f"GGUF file {path} is truncated: tensor {t.name} ends at byte {end:,}, "
                               f"the file has {size:,}", redo)
    if not reader.tensors:
        raise HarnessError(f"GGUF file {path} holds no tensors", redo)
    arch = _field_value(reader, "general.architecture")
    fields = {k: _field_value(reader, k) for k in reader.fields
              if not k.startswith("tokenizer.ggml.") and not k.startswith("GGUF.")}
    info = GGUFInfo(path, arch, len(reader.tensors), size, fields)
    if arch == "gemma4":
        swa = fields.get("gemma4.attention.sliding_window_pattern")
        shared = fields.get("gemma4.attention.shared_kv_layers") or 0
        if isinstance(swa, list) and shared:
            problem = kv_sharing_problem(["sliding_attention" if s else "full_attention" for s in swa], int(shared))
            if problem:
                raise HarnessError(f"GGUF file {path}: llama.cpp cannot run this KV-sharing layout: {problem}",
                                   "convert a model whose last two KV-owning layers are sliding, then full")
    return info


class _Truncated(Exception):
    pass


class _BoundsCheckingReader:
    """A GGUFReader that checks each tensor's extent before mapping it, so a short file reads as
    'truncated: tensor X ends at byte N' instead of a numpy reshape error."""

    _made: dict = {}

    @classmethod
    def make(cls, gguf):
        if gguf.GGUFReader in cls._made:
            return cls._made[gguf.GGUFReader]

        class Reader(gguf.GGUFReader):
            def _build_tensors(self, start_offs, fields):
                size = len(self.data)
                try:
                    for field in fields:
                        _nl, name_data, _nd, dims, raw_dtype, offset_tensor = field.parts
                        n_elems = 1
                        for dim in dims.tolist():
                            n_elems *= int(dim)
                        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_dtype[0]))]
                        end = int(start_offs + offset_tensor[0]) + n_elems * type_size // block
                        if end > size:
                            name = bytes(name_data).decode("utf-8", "replace")
                            raise _Truncated(f"tensor {name} ends at byte {end:,}, the file has {size:,}")
                except (ValueError, KeyError, TypeError):
                    pass  # an unknown layout or type: leave the diagnosis to the reader itself
                return super()._build_tensors(start_offs, fields)

        cls._made[gguf.GGUFReader] = Reader
        return Reader


# ---- conversion and quantization --------------------------------------------------------------------
def converter_command(hf_dir: Path, out: Path, outtype: str = "f32", conv: Path | None = None) -> tuple[list[str], dict]:
    conv = conv or converter_dir()
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(conv / "gguf-py"), str(conv), env.get("PYTHONPATH", "")) if p)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(conv / "convert_hf_to_gguf.py"), str(hf_dir), "--outfile", str(out), "--outtype", outtype]
    return cmd, env


def convert(hf_dir, out_gguf, outtype: str = "f32", progress=None) -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py`` on a Hugging Face Gemma 4 directory, in a subprocess,
    written atomically and verified."""
    hf_dir, out_gguf = Path(hf_dir), Path(out_gguf)
    if outtype not in OUTTYPES:
        raise HarnessError(f"unknown GGUF outtype {outtype!r}",
                           f"use one of {', '.join(OUTTYPES)} (quantized types go through quantize())")
    check_convertible(hf_dir)
    conv = converter_dir(progress=progress)
    (progress or (lambda m: None))(f"converting {hf_dir} to GGUF ({outtype}) with llama.cpp's converter ...")
    with atomic_path(out_gguf, verify=check_gguf) as tmp:
        cmd, env = converter_command(hf_dir, tmp, outtype, conv)
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=CONVERT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"llama.cpp's converter ran over {CONVERT_TIMEOUT_S} s on {hf_dir}",
                               "run it by hand to see where: " + _shell(cmd[:-4] + [str(out_gguf), "--outtype", outtype])) from None
        if out.returncode != 0:
            raise HarnessError(f"llama.cpp's converter failed on {hf_dir} (exit {out.returncode}: "
                               f"{_last_error(out.stderr or out.stdout)})",
                               "fix the checkpoint, or rerun it by hand to see the traceback: "
                               + _shell(cmd[:-4] + ["--outfile", str(out_gguf), "--outtype", outtype]))
        if tmp.stat().st_size == 0:
            raise HarnessError(f"llama.cpp's converter wrote nothing for {hf_dir}",
                               "rerun it by hand: " + _shell(cmd[:-4] + ["--outfile", str(out_gguf)]))
    return out_gguf


def _shell(cmd: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(c) for c in cmd)


def _last_error(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    for line in reversed(lines):  # the exception line of a traceback, else the last ERROR log line
        if not line.startswith(("File ", "^", "~", "Writing", "INFO:", "WARNING:")):
            return line[:240]
    return lines[-1][:240] if lines else "no output"


def quantize(f32_gguf, out, qtype: str = "q4_0", threads: int | None = None) -> Path:
    """llama.cpp's quantizer (``llama_model_quantize``) on an F32/F16 GGUF, atomic and verified."""
    f32_gguf, out = Path(f32_gguf), Path(out)
    if qtype not in QUANT_TYPES:
        raise HarnessError(f"unknown llama.cpp quantization {qtype!r}", f"use one of {', '.join(QUANT_TYPES)}")
    check_gguf(f32_gguf)
    llama_cpp = import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = int(threads or os.cpu_count() or 1)
    params.ftype = getattr(llama_cpp, QUANT_TYPES[qtype])
    with atomic_path(out, verify=check_gguf) as tmp:
        with capture_llama_log(llama_cpp) as log:
            rc = llama_cpp.llama_model_quantize(str(f32_gguf).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise HarnessError(f"llama.cpp could not quantize {f32_gguf} to {qtype} (rc {rc}: {log_reason(log)})",
                               "re-convert the F32 GGUF and try again")
    return out


# ---- cached GGUFs per model ---------------------------------------------------------------------------
def resolve_model_dir(spec) -> Path:
    """The checkpoint directory a model spec names (harness.models.spec: one resolver)."""
    from harness.models.spec import resolve

    return resolve(spec).directory()


def _builder_hash() -> str:
    """The code that converts and quantizes: this module and the converter's setup."""
    from harness.runtimes import llamacpp_setup

    h = hashlib.sha256()
    for path in (Path(__file__), Path(llamacpp_setup.__file__)):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def gguf_for(model, kind: str = "f32", cache: ArtifactCache | None = None, progress=None,
             source: str = "f32") -> Path:
    """The cached GGUF of ``model`` (a spec or a directory): ``f32`` or ``bf16`` (converted), or a
    llama.cpp quantization (``q4_0``, ...) of the ``source`` conversion (``bf16`` for a BF16
    checkpoint too large to widen: E2B's F32 GGUF is 18.5 GB). Keyed by the directory's content,
    the kind (and a non-F32 source), the llama-cpp-python version (= the converter's) and this
    module's source."""
    from harness.models.load import _dir_identity

    converted = ("f32", "bf16")
    if kind not in converted + tuple(QUANT_TYPES):
        raise HarnessError(f"unknown GGUF kind {kind!r}", f"use f32, bf16 or one of {', '.join(QUANT_TYPES)}")
    if source not in converted:
        raise HarnessError(f"unknown GGUF source {source!r}", "quantize from f32 or bf16")
    hf_dir = resolve_model_dir(model)
    check_convertible(hf_dir)
    cache = cache or ArtifactCache()
    version = llama_cpp_version()
    extra = {"source": source} if kind not in converted and source != "f32" else {}
    key = cache_key("gguf", model=_dir_identity(hf_dir), kind=kind, llama_cpp_python=version, builder=_builder_hash(),
                    **extra)
    if kind in converted:
        def build(path: Path):
            t0 = time.perf_counter()
            convert(hf_dir, path, kind, progress=progress)
            return {"convert_seconds": round(time.perf_counter() - t0, 2), "llama_cpp_python": version,
                    "model_dir": str(hf_dir)}
    else:
        def build(path: Path):
            src = gguf_for(model, source, cache=cache, progress=progress)
            (progress or (lambda m: None))(f"quantizing {src.name} to {kind} with llama.cpp ...")
            t0 = time.perf_counter()
            quantize(src, path, kind)
            return {"quantize_seconds": round(time.perf_counter() - t0, 2), "llama_cpp_python": version,
                    "model_dir": str(hf_dir), "source": source}
    path = cache.get_or_build(f"gguf-{kind}", key, f"model-{kind}.gguf", build)
    check_gguf(path)  # cheap (the header and tensor table), and puts the vendored gguf-py on sys.path
    return path
