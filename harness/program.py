"""The program contract every stage and every runtime shares:
``forward(input_ids[1, s], cache_position[s]) -> logits[1, s, vocab]``.

One call serves prefill (``s`` = prompt length, positions ``0..s-1``) and decode (``s`` = 1 at the
next position). Here: the export settings (how many cache slots, the longest call), the example
inputs and dynamic shapes ``torch.export`` sees, and the constant metadata methods ExecuTorch's
LLM runner reads from a ``.pte``. (The guard every runtime applies before a call is
harness.runtimes.base.check_prompt.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ExportSettings:
    max_context: int = 128  # KV cache slots; positions 0 .. max_context - 1

    @property
    def max_seq(self) -> int:
        """Longest single call (prefill chunk) the program accepts."""
        return self.max_context - 1

    def as_dict(self) -> dict:
        return asdict(self)


def example_inputs(n: int = 4):
    import torch

    return {"input_ids": torch.ones(1, n, dtype=torch.long), "cache_position": torch.arange(n)}


def dynamic_shapes(settings: ExportSettings) -> dict:
    from torch.export import Dim

    seq = Dim("seq", min=1, max=settings.max_seq)
    return {"input_ids": {1: seq}, "cache_position": {0: seq}}


def eos_ids(loaded) -> list[int]:
    """Every id that ends a turn: the config's and generation config's EOS, and the tokenizer's turn/eos tokens."""
    ids: set[int] = set()
    for source in (loaded.model.generation_config, loaded.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is None:
            continue
        ids.update([eos] if isinstance(eos, int) else eos)
    tok = loaded.tokenizer
    if tok is not None:
        for name in ("<turn|>", "<end_of_turn>", "<eos>"):
            tid = tok.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != tok.unk_token_id:
                ids.add(tid)
    return sorted(ids)


def runner_metadata(loaded, settings: ExportSettings, recipe=None) -> dict:
    """Constant methods ExecuTorch's LLM runner reads, derived from the model, the export settings
    and the recipe (a ``fast`` recipe's program attends with llama::custom_sdpa on its own cache)."""
    cfg = loaded.config
    bos = getattr(cfg, "bos_token_id", None)
    if bos is None and loaded.tokenizer is not None:
        bos = loaded.tokenizer.bos_token_id
    return {
        "get_max_seq_len": settings.max_seq,
        "get_max_context_len": settings.max_context,
        "get_bos_id": int(bos if bos is not None else 2),
        "get_eos_ids": eos_ids(loaded),
        "get_vocab_size": int(cfg.vocab_size),
        "get_n_layers": int(cfg.num_hidden_layers),
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": recipe is not None and recipe.export == "fast",
        "enable_dynamic_shape": True,
    }
