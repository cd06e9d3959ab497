"""The other side of the teeth: benign moves an upgrade can bring must NOT fail the goldens, and the
refresh gate must call them numerics. A quantized stage amplifies an epsilon upstream (dynamic INT8
activation rounding moves a code by one step), so its tolerances are calibrated on these moves,
not only on run-to-run noise (harness/tolerances.py says what each measured):

- ``per_layer_input_scale`` x 0.6: it sits in front of an RMSNorm and cancels in exact arithmetic;
- every weight nudged by a relative 1e-6 (a new release's rounding of a conversion);
- one thread instead of two (another summation order in every GEMM).

Each move reruns the stages that execute Python model code (hf_generate, eager) for every golden
prompt of every recipe; the exported program and the .pte are the same code path as eager.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from support import RECIPE_NAMES
from harness.goldens.checks import check_logit_golden, check_token_golden
from harness.goldens.store import GOLDEN_PROMPTS, MAX_NEW_TOKENS

pytestmark = pytest.mark.mac
MOVED_STAGES = ("hf_generate", "eager")


def _rescale_per_layer_inputs(model):
    model.model.per_layer_input_scale = model.model.per_layer_input_scale * 0.6


def _nudge_weights(model):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 1e-6)


MOVES = {"per_layer_input_scale x0.6": _rescale_per_layer_inputs, "weights x(1+1e-6)": _nudge_weights,
         "one thread": None}


def _moved_runs(pipeline, move: str) -> dict:
    """(recipe, stage, prompt) -> Generation under the move, for the stages that run model code."""
    from harness.pipeline import Pipeline

    base = pipeline("fp32").loaded
    fn = MOVES[move]
    loaded = base
    if fn is not None:
        model = copy.deepcopy(base.model)
        fn(model)
        loaded = dataclasses.replace(base, model=model)
    threads = torch.get_num_threads()
    if fn is None:
        torch.set_num_threads(1)
    try:
        runs = {}
        for recipe in RECIPE_NAMES:
            p = Pipeline(loaded, recipe)
            for prompt in GOLDEN_PROMPTS:
                for stage in MOVED_STAGES:
                    runs[(recipe, stage, prompt)] = p.run_stage(stage, prompt, MAX_NEW_TOKENS)
        return runs
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=list(MOVES))
def moved(request, pipeline):
    return request.param, _moved_runs(pipeline, request.param)


def test_a_benign_move_passes_every_golden(moved, pipeline):
    move, runs = moved
    tok = pipeline("fp32").loaded.tokenizer
    problems = []
    for (recipe, stage, prompt), gen in runs.items():
        problems += [p for p in (check_token_golden(recipe, stage, prompt, gen, tok),
                                 check_logit_golden(recipe, stage, prompt, gen)) if p]
    assert not problems, f"{move}: {len(problems)} golden(s) fail; first: {problems[0]}"


def test_the_gate_calls_a_benign_move_numerics(moved, computed_goldens):
    from harness.goldens.refresh import assess

    move, runs = moved
    c = dataclasses.replace(computed_goldens, runs={**computed_goldens.runs, **runs})
    blockers = assess(c, llamacpp=False).blockers
    assert not blockers, f"{move}: the gate blocks: " + "; ".join(b.line() for b in blockers[:3])
