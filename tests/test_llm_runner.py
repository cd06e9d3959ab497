"""The .pte in ExecuTorch's own LLM runner (TextLLMRunner, the C++ runner used on devices)."""

from __future__ import annotations

import pytest

from support import FIXTURE_DIR, FIXTURE_PROMPTS, RECIPE_NAMES
from harness.runtimes.llm_runner import TextLLMRuntime, runner_decode, runner_encode

pytestmark = pytest.mark.mac
TOKENIZER_JSON = FIXTURE_DIR / "tokenizer.json"


def _templated(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)


@pytest.mark.parametrize("prompt", FIXTURE_PROMPTS)
def test_runner_tokenizer_agrees_with_transformers(pipeline, prompt):
    p = pipeline("fp32")
    text = _templated(p.loaded.tokenizer, prompt)
    ours = p.prompt_ids(prompt)
    theirs = runner_encode(TOKENIZER_JSON, text)
    assert theirs == ours, f"runner tokenizer {theirs} vs transformers {ours} for {text!r}"
    assert runner_decode(TOKENIZER_JSON, theirs) == text


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_runner_reproduces_the_goldens(pipeline, golden_tokens_for, recipe):
    p = pipeline(recipe)
    runner = TextLLMRuntime(p.pte_path, TOKENIZER_JSON)
    for prompt in FIXTURE_PROMPTS:
        out = runner.generate_text(_templated(p.loaded.tokenizer, prompt), max_new_tokens=9)
        golden = golden_tokens_for(recipe, "pte", prompt)
        assert out.ids == golden, f"{recipe} {prompt!r}: runner {out.ids} {out.text!r}, golden {golden}"
        assert out.stats["prompt_tokens"] == len(p.prompt_ids(prompt))
        assert out.stats["decode_tok_s"] and out.stats["decode_tok_s"] > 0
