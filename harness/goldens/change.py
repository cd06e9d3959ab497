"""What ``goldens diff`` found: each change against the recorded goldens (``Change``), with the
gate's verdict on it, and the whole assessment (``Assessment``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Change:
    kind: str  # tokens, logits, prompt, quality, quantize, activations, llamacpp, format, new, stale
    where: str  # prompt / recipe / stage, for people
    detail: str
    acceptable: bool
    why: str = ""

    def line(self) -> str:
        verdict = "numerics (acceptable)" if self.acceptable else f"BLOCKS the refresh: {self.why}"
        return f"- [{self.kind}] {self.where}: {self.detail} -> {verdict}"


@dataclass
class Assessment:
    changes: list[Change] = field(default_factory=list)
    recorded: dict = field(default_factory=dict)
    now: dict = field(default_factory=dict)
    # "recipe:stage" -> {"prompts", "ids_changed", "max_logprob"}: how far each stage moved (the matrix's columns)
    moves: dict = field(default_factory=dict)

    @property
    def blockers(self) -> list[Change]:
        return [c for c in self.changes if not c.acceptable]
