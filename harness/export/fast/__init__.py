"""The fast export path (recipe ``8da4w-fast``): Gemma 4's decoder rewritten around ExecuTorch's
LLM custom ops so that almost everything is delegated to XNNPACK. One concern per module:

- ``decoder.py``: the export wrapper. ``forward(input_ids[1, s], cache_position[s]) -> logits[1, s, V]``
  as harness/program.py has it, reusing the transformers model's own submodules and weights (so
  torchao's quantization applies exactly as for ``8da4w``). Attention is ``llama::custom_sdpa``
  (a tiled flash-attention kernel that reads the cache in place, GQA without repeat_kv), the KV
  cache is written with ``llama::update_cache`` / ``update_cache_with_indices`` (the op library:
  harness/oplib.py), sliding layers keep a ring buffer of ``sliding_window`` slots, and the glue
  (RMSNorm, RoPE's rotate_half, reshapes) is written in the forms XNNPACK's partitioner takes;
- ``embedding.py``: the token table (tied to ``lm_head``) INT4 in ``lm_head``'s own groups;
- ``tied.py``: that table stored once, read by the lookup (``embedding_4bit``) and by ``lm_head``
  (``harness::q4_linear``, the harness's own kernel, with the logit softcapping fused);
- ``budget.py``: what is left outside XNNPACK, with a reason and a count for each operator.

Numerics differ from transformers' eager attention only by summation order (flash attention, rsqrt
vs pow(-0.5), mean over 4-D): greedy ids equal the ``8da4w`` goldens (tests/test_fast_path.py).
"""
