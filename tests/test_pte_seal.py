"""The .pte seal: ExecuTorch verifies a program's structure, not its data, so a flipped weight byte
loads and answers wrongly with exit 0 (tests/test_fuzz.py found it, about 1 flip in 120). Every
.pte the harness writes ends with the sha256 of the rest, checked before loading."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.build.pte import SEAL, SEAL_LEN, check_seal, seal
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
