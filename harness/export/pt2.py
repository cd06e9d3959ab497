"""Save/load ``.pt2`` through an open file handle, verified after writing.

The deployment log lost hours to ``torch.export.save(ep, pathlib.Path)`` writing an archive
without its zip central directory (>2 GB, torch 2.11) while reporting success. Here every save
goes through an open handle into a temp file, is checked (zip central directory present, the
archive reloads), and only then renamed into place.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from harness.atomic import atomic_path
from harness.errors import HarnessError


def check_zip(path: Path) -> None:
    """The archive's own zip central directory must end the file and list the program.

    ``zipfile.is_zipfile`` alone is not enough: a cut archive can still contain the end record
    of a zip nested inside one of its entries."""
    size = Path(path).stat().st_size
    problem = None
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            end = max((i.header_offset for i in z.infolist()), default=0)
    except (zipfile.BadZipFile, OSError, ValueError):
        problem = "zip central directory missing"
    else:
        if "archive/models/model.json" not in names and not any(n.endswith("models/model.json") for n in names):
            problem = "zip central directory damaged: the exported program's entries are not listed"
        elif end >= size:
            problem = "zip central directory points past the end of the file"
    if problem:
        raise HarnessError(
            f"{path} is not a complete .pt2 archive ({problem}: truncated write?)",
            "delete it and export again",
        )


def load_pt2(path: Path):
    import torch

    path = Path(path)
    if not path.is_file():
        raise HarnessError(f".pt2 file {path} does not exist", "export it first (harness export)")
    check_zip(path)
    try:
        with open(path, "rb") as f:
            return torch.export.load(f)
    except Exception as e:  # torch raises RuntimeError/KeyError/... for damaged archives
        raise HarnessError(f"{path} could not be loaded as an ExportedProgram ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:120]})", "delete it and export again") from e


def save_pt2(ep, path: Path, writer=None, keep: dict | None = None) -> Path:
    """Write ``ep`` to ``path`` atomically through an open handle, then verify it.

    ``writer(ep, fileobj)`` defaults to ``torch.export.save``; tests substitute a truncating
    writer to show a damaged archive is caught at write time. ``keep``: the program the
    verification reloaded goes there as ``keep["program"]``, so that a caller who wants the
    reloaded program (the lowering does) need not load the file a second time."""
    import torch

    writer = writer or torch.export.save
    path = Path(path)

    def verify(tmp: Path) -> None:
        program = load_pt2(tmp)  # checks the zip central directory, then reloads the program
        if keep is not None:
            keep["program"] = program

    with atomic_path(path, verify=verify) as tmp:
        with open(tmp, "wb") as f:
            writer(ep, f)
    return path
