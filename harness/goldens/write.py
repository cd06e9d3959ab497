"""Writing a model's goldens: the whole set computed on this stack (``Computed``), swapped in at
once so that a crash or a SIGKILL leaves the old set or the new, never a mix."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.goldens.store import activation_golden_path, encode_json, goldens_dir, logit_golden_path, logit_record, prompt_golden_path, provenance_path, quality_golden_path, quantize_golden_path, token_golden_path, token_record
from harness.goldens.subject import Subject, fixture_subject


@dataclass
class Computed:
    """Everything the goldens record, as this stack computes it."""
    runs: dict  # (recipe, stage, prompt) -> Generation
    prompts: dict  # prompt -> prompt record
    quality: dict  # recipe -> quality record
    quantized: dict  # recipe -> quantize record (torchao's codes and scales)
    tokenizer: object
    provenance: dict
    subject: Subject = field(default_factory=fixture_subject)
    stage_stats: dict = field(default_factory=dict)  # "recipe:stage" -> seconds and peak RSS
    activations: dict = field(default_factory=dict)  # (recipe, prompt) -> activation record (harness/goldens/activations.py)
    # (recipe, prompt) -> (the localization line against the recorded activation golden, whether a component
    # moved, the first mover's index in forward order)
    localized: dict = field(default_factory=dict)

    def files(self) -> dict[Path, object]:
        """Every golden file of this subject (path -> JSON data) but its provenance."""
        key, compact = self.subject.key, self.subject.logit_format == "compact"
        out: dict[Path, object] = {}
        for (recipe, stage, prompt), gen in self.runs.items():
            out[token_golden_path(recipe, stage, prompt, key)] = token_record(prompt, gen.ids, self.tokenizer)
            if gen.step_logits:  # the native runner reports ids, not logits: its golden is its tokens
                out[logit_golden_path(recipe, stage, prompt, key)] = logit_record(gen, compact=compact)
        for prompt, record in self.prompts.items():
            out[prompt_golden_path(prompt, key)] = record
        for recipe, record in self.quality.items():
            out[quality_golden_path(recipe, key)] = record
        for recipe, record in self.quantized.items():
            out[quantize_golden_path(recipe, key)] = record
        for (recipe, prompt), record in self.activations.items():
            out[activation_golden_path(recipe, prompt, key)] = record
        return out


SUBTREES = ("tokens", "logits", "prompts", "quality", "quantize", "activations")


def subject_files(root: Path, key: str) -> list[Path]:
    """Every golden file of one model under ``root`` (``SUBTREE/KEY/...``), its provenance included."""
    out = [p for sub in SUBTREES if (root / sub / key).is_dir() for p in sorted((root / sub / key).rglob("*"))
           if p.is_file()]
    prov = root / provenance_path(key).relative_to(goldens_dir())
    return out + ([prov] if prov.is_file() else [])


def write_goldens(c: Computed, provenance: dict) -> None:
    """This model's whole set, provenance included, swapped in at once: a new goldens directory is
    built beside the old one (this model's files written, fsynced and read back; every other
    model's hard-linked unchanged), then the two directories are exchanged in one ``renameat2``
    (RENAME_EXCHANGE). A kill at any instant leaves the old set or the new, never a mix; where the
    file system cannot exchange, two renames, and a kill between them leaves the old set under
    ``.NAME-old``, which ``recover()`` (every diff and update, first) puts back."""
    root = goldens_dir().resolve()
    recover(root)
    stage_dir = root.parent / f".{root.name}-new.{os.getpid()}"
    shutil.rmtree(stage_dir, ignore_errors=True)
    files = {path.resolve().relative_to(root): data for path, data in c.files().items()}
    files[provenance_path(c.subject.key).resolve().relative_to(root)] = provenance
    mine = {p.relative_to(root) for p in subject_files(root, c.subject.key)} if root.is_dir() else set()
    try:
        if root.is_dir():
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if path.is_file() and rel not in mine and rel not in files:
                    (stage_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.link(path, stage_dir / rel)
        for rel, data in files.items():
            target = stage_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            blob = encode_json(data)
            with open(target, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            if target.read_bytes() != blob:
                raise HarnessError(f"golden {target} did not read back as written", "check the disk and retry")
        _fsync_dir(stage_dir)
    except BaseException:
        shutil.rmtree(stage_dir, ignore_errors=True)
        raise
    if not root.exists():
        stage_dir.rename(root)
    elif exchange(stage_dir, root):
        shutil.rmtree(stage_dir, ignore_errors=True)  # now the old set
    else:
        old_dir = root.parent / f".{root.name}-old"
        shutil.rmtree(old_dir, ignore_errors=True)
        root.rename(old_dir)
        stage_dir.rename(root)
        shutil.rmtree(old_dir, ignore_errors=True)
    _fsync_dir(root.parent)


def recover(root: Path | None = None) -> None:
    """Put back a goldens directory left under ``.NAME-old`` by a write killed between its two
    renames (the fallback where the file system cannot exchange), and drop half-built new ones."""
    from harness.atomic import _pid_alive

    root = (root or goldens_dir()).resolve()
    old_dir = root.parent / f".{root.name}-old"
    if not root.exists() and old_dir.is_dir():
        old_dir.rename(root)
    for stale in root.parent.glob(f".{root.name}-new.*") if root.parent.is_dir() else ():
        pid = stale.name.rsplit(".", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    rc = fn(AT_FDCWD, os.fsencode(str(a)), AT_FDCWD, os.fsencode(str(b)), RENAME_EXCHANGE)
    return rc == 0


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_writable(root: Path) -> None:
    """Before minutes of work: the goldens directory (or, for a first record, where it would be
    made) must take a new file and a new directory beside it, which the swap needs."""
    import tempfile

    root = Path(root)
    parent = root.resolve().parent
    probe_dirs = [parent] + ([root] if root.exists() else [])
    for d in probe_dirs:
        try:
            if not d.is_dir():
                raise NotADirectoryError(d)
            fd, name = tempfile.mkstemp(prefix=".harness-probe-", dir=d)
            os.close(fd)
            os.unlink(name)
        except OSError as e:
            raise HarnessError(f"the goldens directory {root} is not writable ({d}: {e.strerror or type(e).__name__})",
                               "pass --goldens DIR on a writable file system (its parent must be writable too)") from None
