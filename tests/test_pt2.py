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
