"""ExecuTorch's own LLM runner (the C++ ``TextLLMRunner``, through its Python binding): the way a
``.pte`` is driven on a device. It reads the program's metadata methods, tokenizes with
pytorch_tokenizers' C++ ``HFTokenizer``, prefills the prompt in one call (``enable_dynamic_shape``)
with ``cache_position = arange(start, start + n)``, then decodes one token per call.

What it needs from us, found by running it on the fixture:
- a ``tokenizer.json`` its HFTokenizer accepts: no ``Split`` pre-tokenizer with ``MergedWithNext``
  (the fixture has no pre-tokenizer; ``harness.training.fixture`` asserts that is exact);
- the already chat-templated prompt, ``<bos>`` included: the runner applies no template and its
  ``num_bos`` is ignored by HFTokenizer without a post-processor;
- ``import executorch.kernels.quantized`` before loading (``embedding_byte`` for INT8 tables).
The runner's token callback gives text pieces, not ids; ids are recovered by looking each piece
up in the tokenizer's vocabulary (exact for whole-token pieces; a piece that is not a vocabulary
entry raises rather than guessing).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness.errors import HarnessError
from harness.runtimes.base import Generation, Runtime, register


def _vocab(tokenizer_json: Path) -> dict[str, int]:
    spec = json.loads(Path(tokenizer_json).read_text())
    vocab = dict(spec["model"]["vocab"])
    vocab.update({t["content"]: t["id"] for t in spec.get("added_tokens", [])})
    return vocab


def runner_tokenizer(tokenizer_json: Path):
    """The runner's own tokenizer (pytorch_tokenizers' C++ HFTokenizer)."""
    from pytorch_tokenizers.pytorch_tokenizers_cpp import HFTokenizer

    tok = HFTokenizer()
    try:
        tok.load(str(tokenizer_json))
    except Exception as e:
        raise HarnessError(f"ExecuTorch's tokenizer cannot load {tokenizer_json} ({e})",
                           "use a tokenizer.json without a Split(MergedWithNext) pre-tokenizer") from e
    return tok


def runner_encode(tokenizer_json: Path, text: str) -> list[int]:
    return list(runner_tokenizer(tokenizer_json).encode(text, 0, 0))


def runner_decode(tokenizer_json: Path, ids: list[int]) -> str:
    """Decode with the runner's tokenizer, special tokens kept (``decode(token, skip_special)``)."""
    tok = runner_tokenizer(tokenizer_json)
    return "".join(tok.decode(int(i), False) for i in ids)


@register
class TextLLMRuntime(Runtime):
    """``TextLLMRunner(pte, tokenizer.json)``, greedy; it owns its loop and gives text pieces, its
    own stats (C++ timings), and ids recovered from the pieces."""

    kind = "llm-runner"
    owns_loop = True

    def __init__(self, artifact, tokenizer_json: Path | None = None, threads: int | None = None):
        import executorch.kernels.quantized  # noqa: F401  (embedding_byte)

        from harness.oplib import load_custom_ops

        load_custom_ops()  # llama::custom_sdpa / update_cache kernels of fast-recipe programs
        from executorch.extension.llm.runner import TextLLMRunner

        from harness.export.pte import check_header

        if tokenizer_json is None:
            raise HarnessError("the llm-runner runtime needs the model's tokenizer.json",
                               "pass tokenizer_json=PATH (the fixture's: harness/models/fixture/tokenizer.json)")
        if threads:
            from harness.runtimes.executorch import set_threads

            set_threads(threads)
        t0 = time.perf_counter()
        self.artifact = Path(artifact)
        check_header(self.artifact)
        runner_tokenizer(tokenizer_json)  # a clear error before the runner's generic one
        self.tokenizer_json = Path(tokenizer_json)
        self.vocab = _vocab(self.tokenizer_json)
        self.runner = TextLLMRunner(str(artifact), str(tokenizer_json))
        self.load_s = time.perf_counter() - t0

    def generate(self, prompt_ids, max_new_tokens: int, eos_ids=frozenset(), keep_prefill_logits: bool = False,
                 keep_logits: bool = True) -> Generation:
        """The runner is given text: the ids decoded with its own tokenizer (specials kept), and it
        must tokenize them back to the same number of ids, or the comparison would be of another
        prompt. No logits: the runner keeps them. It stops at the program's EOS ids."""
        if keep_prefill_logits:
            raise HarnessError("TextLLMRunner gives no logits", "use the executorch runtime for logits")
        ids = [int(i) for i in prompt_ids]
        gen = self.generate_text(runner_decode(self.tokenizer_json, ids), max_new_tokens)
        if gen.stats.get("prompt_tokens") != len(ids):
            raise HarnessError(f"TextLLMRunner read {gen.stats.get('prompt_tokens')} prompt tokens where "
                               f"{len(ids)} ids were given (its tokenizer splits the decoded text differently)",
                               "give it the chat-templated text with generate_text()")
        gen.prompt_ids = ids
        return gen.cut_at_eos(frozenset(eos_ids)) if eos_ids else gen

    def generate_text(self, templated_prompt: str, max_new_tokens: int = 9, map_ids: bool = True) -> Generation:
        """Greedy generation from text; ``map_ids=False`` keeps only the runner's stats: no token
        callback, because the binding turns each piece into a Python str and a random-weight model's
        byte-fallback pieces are not valid UTF-8 on their own (UnicodeDecodeError)."""
        from executorch.extension.llm.runner import GenerationConfig

        self.runner.reset()
        pieces: list[str] = []
        stats: list = []
        config = GenerationConfig(temperature=0.0, echo=False, max_new_tokens=max_new_tokens)
        self.runner.generate(templated_prompt, config, token_callback=pieces.append if map_ids else None,
                             stats_callback=stats.append)
        ids = []
        for piece in pieces if map_ids else ():
            key = piece.replace(" ", "\u2581")
            if key not in self.vocab:
                raise HarnessError(f"runner piece {piece!r} is not a vocabulary entry",
                                   "compare text instead for byte-fallback output")
            ids.append(self.vocab[key])
        s = _stats(stats[-1]) if stats else {}
        return Generation(prompt_ids=[], ids=ids, pieces=pieces, stats=s, ttft_s=s.get("ttft_s"),
                          decode_s=s.get("decode_s"))


def _stats(s) -> dict:
    """The runner's own C++ timings: prefill/decode tok/s, time to first token, load time."""
    raw = json.loads(s.to_json_string())
    scale = raw.get("SCALING_FACTOR_UNITS_PER_SECOND", 1000)
    first = (s.first_token_ms - s.inference_start_ms) / scale
    prefill_s = (s.prompt_eval_end_ms - s.inference_start_ms) / scale
    decode_s = (s.inference_end_ms - s.prompt_eval_end_ms) / scale
    return {
        "prompt_tokens": s.num_prompt_tokens,
        "generated_tokens": s.num_generated_tokens,
        "ttft_s": first,
        "prefill_tok_s": s.num_prompt_tokens / prefill_s if prefill_s > 0 else None,
        "decode_tok_s": s.num_generated_tokens / decode_s if decode_s > 0 else None,
        "decode_s": decode_s,
        "load_s": (s.model_load_end_ms - s.model_load_start_ms) / scale,
        "raw": raw,
    }
