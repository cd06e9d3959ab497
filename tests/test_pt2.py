"""``.pt2`` save/load through an open handle, verified at write time (the log's truncated archive)."""

from __future__ import annotations

import io

import pytest
import torch

from harness.errors import HarnessError
from harness.export.pt2 import load_pt2, save_pt2

pytestmark = pytest.mark.mac


def test_pt2_round_trip_gives_identical_logits(pipeline, tmp_path):
    p = pipeline("fp32")
    ep = p.exported
    path = save_pt2(ep, tmp_path / "copy.pt2")
    again = load_pt2(path)
    ids = torch.tensor([p.prompt_ids("What is the capital of Japan?")])
    pos = torch.arange(ids.shape[1])
    with torch.no_grad():
        a = ep.module()(input_ids=ids, cache_position=pos)
        b = again.module()(input_ids=ids, cache_position=pos)
    assert torch.equal(a, b)


def _truncating_writer(ep, f):
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    data = buf.getvalue()
    f.write(data[: len(data) - 4096])  # the central directory is at the end: cut it off


def test_archive_without_central_directory_is_caught_at_write_time(pipeline, tmp_path):
    ep = pipeline("fp32").exported
    target = tmp_path / "model.pt2"
    target.write_bytes(b"previous good artifact")
    with pytest.raises(HarnessError, match="central directory"):
        save_pt2(ep, target, writer=_truncating_writer)
    assert target.read_bytes() == b"previous good artifact", "a failed save must not replace the old file"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt2"], "no partial file may be left behind"


def test_truncated_pt2_on_disk_gets_a_clear_error(pipeline, tmp_path):
    good = pipeline("fp32").pt2_path.read_bytes()
    bad = tmp_path / "cut.pt2"
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(HarnessError, match="export again"):
        load_pt2(bad)


def test_the_program_lowered_is_the_reload_that_verified_the_file(tmp_path, monkeypatch):
    """A .pt2 just written is loaded once, by its verification, and that reload is the program the
    pipeline lowers (the demo spent 3 to 6 s loading it a second time); from the cache it is loaded
    once as before. Either way it is a program read from the file, not the one in memory."""
    from harness.cache import ArtifactCache
    from harness.export import pt2
    from harness.export.pipeline import BuildPipeline

    loads = []
    real = pt2.load_pt2

    def counting(path):
        loads.append(path)
        return real(path)

    monkeypatch.setattr(pt2, "load_pt2", counting)
    cache = ArtifactCache(tmp_path / "cache")
    built = BuildPipeline("fixture", "fp32", cache=cache)
    program = built.exported
    assert len(loads) == 1 and loads[0].name.endswith(".partial"), loads  # the verification's reload
    assert str(program.graph_module.code) == str(real(built.pt2_path).graph_module.code)
    built.__dict__.pop("exported")  # as the lowering lets go of it; asked for again, it is read again
    assert built.exported is not program, "the kept reload was handed out twice"
    assert len(loads) == 2 and loads[1] == built.pt2_path
    cached = BuildPipeline("fixture", "fp32", cache=cache)
    cached.exported
    assert [e[2] for e in cache.events] == ["build", "hit"] and len(loads) == 3 and loads[2] == cached.pt2_path
