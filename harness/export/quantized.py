"""The streamed quantized model, kept in the artifact cache.

Reading a checkpoint of E2B's size and quantizing it module by module (harness/export/stream.py)
took about 70 s on 2 Zen 4 cores (2026-12-07; the cache hit, 5.14 GB mapped: 3.6 s), and every run
that needs the eager model paid it again: a ``goldens diff`` after ``goldens update``, the scale tier. Here the result is an artifact like the
``.pt2`` and the ``.pte``: keyed by the checkpoint's identity (its content hash), its text config and
the recipe, and, as every key, by the harness's build code and the library versions
(harness/cache.py), so an upgrade of torchao, transformers or torch quantizes afresh.

The file is ``torch.save`` of the tensors by name (a torchao tensor with its codes, scales, zero
points and attributes; a tied weight once, under both names) and of the plain module attributes the
quantization changed (``padding_idx``); the whole module does not pickle (transformers' activations
hold a ``functools.partial`` of a builtin). Read back, the model is built on the meta device from
the checkpoint's config, as the streamed load builds it, and given those tensors, memory-mapped:
their pages come from the file as they are touched. Verified after writing: a digest of every tensor's
bytes and of every module's type and attributes is taken, the model in memory let go (so the two are
never held at once), the file read back and its digest compared; from then on the model in use is
the one read back, so the run that builds the entry runs what later runs load. The file is trusted
as the cache's own (``weights_only=False``: torchao's tensor classes and their attributes pickle),
and its sha256 is checked on every lookup (harness/cache.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.errors import HarnessError
from harness.recipes import Recipe

STAGE = "quantized"
FILENAME = "model.pt"


def flat_tensors(model) -> dict:
    """Every tensor of ``model`` by name: a torchao tensor as its inner tensors (codes, scales, zero
    points) plus its attributes and type; tied weights under each of their names."""
    out = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        inner = getattr(t, "tensor_data_names", None)
        if inner:
            for n in inner:
                out[f"{name}:{n}"] = getattr(t, n)
            out[f"{name}:attrs"] = tuple(str(getattr(t, a)) for a in t.tensor_attribute_names) + (type(t).__name__,)
        else:
            out[name] = t
    return out


def tensor_differences(a, b) -> list[str]:
    """Names of the tensors in which two models differ (present in one only, or not equal bit for bit)."""
    import torch

    fa, fb = flat_tensors(a), flat_tensors(b)
    diff = sorted(set(fa) ^ set(fb))
    for k in sorted(set(fa) & set(fb)):
        x, y = fa[k], fb[k]
        if isinstance(x, tuple):
            same = x == y
        else:
            same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        if not same:
            diff.append(k)
    return diff


def quantized_key(directory, recipe: Recipe) -> str:
    from harness.cache import cache_key
    from harness.export.stream import text_config
    from harness.models.load import _dir_identity

    return cache_key(STAGE, model=_dir_identity(Path(directory)),
                     config=text_config(directory).to_json_string(use_diff=False), recipe=recipe.as_dict())


_PLAIN = (int, float, str, bool, type(None))


def _attributes(module) -> dict:
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and isinstance(v, _PLAIN)}


def skeleton(directory):
    """The model as the streamed load builds it before reading a tensor: parameters on meta."""
    from transformers import Gemma4ForCausalLM

    from harness.export.stream import parameters_on_meta, text_config

    with parameters_on_meta():
        model = Gemma4ForCausalLM(text_config(directory))
    return model.eval()


def contents(model, directory) -> dict:
    """What the file holds: every tensor by name and the module attributes a fresh build lacks."""
    fresh = dict(skeleton(directory).named_modules())
    changed = {}
    for name, module in model.named_modules():
        was = _attributes(fresh[name]) if name in fresh else {}
        moved = {k: v for k, v in _attributes(module).items() if was.get(k, object()) != v}
        if moved:
            changed[name] = moved
    return {"tensors": dict(list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))),
            "attributes": changed}


def read_back(path: Path, directory):
    import torch

    from harness.export.stream import _set

    saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    model = skeleton(directory)
    modules = dict(model.named_modules())
    for name, tensor in saved["tensors"].items():
        owner, _, leaf = name.rpartition(".")
        _set(modules[owner], leaf, tensor)
    for name, attrs in saved["attributes"].items():
        for k, v in attrs.items():
            setattr(modules[name], k, v)
    model.requires_grad_(False)
    return model


def fingerprint(model) -> dict:
    """A digest of everything the file must give back: each tensor's dtype, shape and bytes (a
    torchao tensor's inner tensors and attributes), each module's type and plain attributes."""
    import hashlib

    import torch

    out = {}
    for name, t in flat_tensors(model).items():
        if isinstance(t, tuple):
            out[name] = repr(t)
            continue
        h = hashlib.sha256(f"{t.dtype} {list(t.shape)}".encode())
        flat = t.detach().contiguous().reshape(-1)
        if flat.numel():
            h.update(memoryview(flat.view(torch.uint8).numpy()))
        out[name] = h.hexdigest()
    for name, module in model.named_modules():
        out[f"{name}:type"] = f"{type(module).__module__}.{type(module).__qualname__}"
        out[f"{name}:attributes"] = repr(sorted(_attributes(module).items()))
    return out


def write_verified(box: list, path: Path, directory):
    """``torch.save`` what makes the model in ``box`` to ``path``; let go of the model (``box`` is
    emptied: at E2B size it is 5 GB, and the read-back maps as much again); read it back and compare
    it all with the digest taken before. The model read back, which is what a later run gets."""
    import gc

    import torch

    from harness.rss import return_freed_memory

    model = box.pop()
    want = fingerprint(model)
    torch.save(contents(model, directory), path)
    del model
    gc.collect()
    return_freed_memory()
    back = read_back(path, directory)
    got = fingerprint(back)
    moved = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    if moved:
        path.unlink(missing_ok=True)
        raise HarnessError(f"the quantized model written to {path} reads back different ({len(moved)} tensors, "
                           f"e.g. {moved[0]})", "report it: the artifact cache cannot hold this model")
    return back


def load_quantized_cached(directory, recipe: Recipe, cache, progress=None, load=None):
    """``(model, summary)``: the checkpoint quantized by ``recipe``, from the cache or streamed (and
    then cached). ``summary`` is the streamed load's, with ``cached`` saying which it was; ``load`` is
    harness/export/stream.py's ``load_quantized`` unless a test passes another."""
    from harness.export.stream import load_quantized

    say = progress or (lambda m: None)
    load = load or load_quantized
    key = quantized_key(directory, recipe)
    built: dict = {}

    def build(path: Path):
        model, summary = load(directory, recipe, progress=progress)
        box = [model]
        del model
        t0 = time.time()
        built["model"] = write_verified(box, path, directory)
        summary = {**summary, "write_seconds": round(time.time() - t0, 1)}
        say(f"the quantized model kept in the artifact cache ({path.stat().st_size / 1e9:.2f} GB, written, read "
            f"back and compared in {summary['write_seconds']} s)")
        built["summary"] = summary
        return {"summary": summary}

    t0 = time.time()
    path = cache.get_or_build(STAGE, key, FILENAME, build)
    if built:
        return built["model"], {**built["summary"], "cached": False}
    model = read_back(path, directory)
    summary = {**cache.meta(STAGE, key).get("summary", {}), "cached": True, "seconds": round(time.time() - t0, 1)}
    say(f"the quantized model came from the artifact cache ({path.stat().st_size / 1e9:.2f} GB, {summary['seconds']} s)")
    return model, summary
