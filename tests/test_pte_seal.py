"""The .pte seal: ExecuTorch verifies a program's structure, not its data, so a flipped weight byte
loads and answers wrongly with exit 0 (tests/test_fuzz.py found it, about 1 flip in 120). Every
.pte the harness writes ends with the sha256 of the rest, checked before loading."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.export.pte import SEAL, SEAL_LEN, check_seal, seal
from harness.runtimes.executorch import PteRuntime

pytestmark = pytest.mark.mac


def test_written_programs_are_sealed_and_load(pipeline):
    path = pipeline("fp32").pte_path
    assert path.read_bytes()[-SEAL_LEN:].startswith(SEAL)
    assert check_seal(path) is True


def test_a_flipped_weight_byte_is_refused_before_loading(pipeline, tmp_path):
    data = bytearray(pipeline("fp32").pte_path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the constant data: the runtime alone would load it
    bad = tmp_path / "flipped.pte"
    bad.write_bytes(bytes(data))
    with pytest.raises(HarnessError, match="is damaged: its content no longer matches the sha256"):
        PteRuntime(bad)


def test_a_damaged_seal_is_refused_and_a_program_without_one_still_loads(pipeline, tmp_path):
    data = pipeline("fp32").pte_path.read_bytes()
    broken = tmp_path / "broken-seal.pte"
    broken.write_bytes(data[:-10] + b"zzzzzzzzz\n")
    with pytest.raises(HarnessError, match="its seal is unreadable"):
        check_seal(broken)
    plain = tmp_path / "unsealed.pte"  # a program from elsewhere: no seal to check
    plain.write_bytes(data[:-SEAL_LEN])
    assert check_seal(plain) is False
    PteRuntime(plain)


def test_sealing_twice_changes_nothing(pipeline):
    data = pipeline("fp32").pte_path.read_bytes()
    assert seal(data) == data
    assert seal(data[:-SEAL_LEN]) == data


def test_a_program_streamed_to_disk_is_the_bytes_sealed(pipeline, tmp_path):
    """write_pte streams a program manager piece by piece (its joined ``buffer`` is one more copy
    of the whole program, 4 GB at E2B size), hashing as it writes: the file must be exactly the
    sealed bytes, and a copy of a sealed .pte must be the same file, with or without its seal."""
    from harness.export.pte import write_pte

    data = pipeline("fp32").pte_path.read_bytes()
    body = data[:-SEAL_LEN]

    class Pieces:  # what write_pte needs of ExecuTorch's program manager, in uneven pieces
        _pte_data = body

        def write_to_file(self, f):
            for start in range(0, len(body), 1 << 20 | 7):
                f.write(body[start:start + (1 << 20 | 7)])

    streamed = write_pte(Pieces(), tmp_path / "streamed.pte")
    assert streamed.read_bytes() == data
    unsealed = tmp_path / "unsealed.pte"
    unsealed.write_bytes(body)
    assert write_pte(unsealed, tmp_path / "copied.pte").read_bytes() == data
    assert write_pte(streamed, tmp_path / "copied-sealed.pte").read_bytes() == data
    assert write_pte(body, tmp_path / "from-bytes.pte").read_bytes() == data
