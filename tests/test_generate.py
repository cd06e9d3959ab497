"""The generate stage: prefill then decode, one cache slot more per step, stop at EOS."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.mac


def test_decode_positions_grow_one_slot_per_step(pipeline):
    p = pipeline("fp32")
    ids = p.prompt_ids("What is the capital of France?")
    gen = p.generate(ids, stage="eager", max_new_tokens=9)
    n = len(ids)
    assert gen.cache_positions == [0] + list(range(n, n + len(gen.ids) - 1))


def test_generation_stops_at_end_of_turn(pipeline):
    p = pipeline("fp32")
    gen = p.generate("What is the capital of France?", stage="eager", max_new_tokens=30)
    turn_end = p.loaded.tokenizer.convert_tokens_to_ids("<turn|>")
    assert gen.stopped_on_eos and gen.ids[-1] == turn_end and gen.ids.count(turn_end) == 1


def test_max_new_tokens_is_honoured(pipeline):
    gen = pipeline("fp32").generate("What is the capital of France?", stage="eager", max_new_tokens=3)
    assert len(gen.ids) == 3 and not gen.stopped_on_eos
