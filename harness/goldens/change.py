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
    # "recipe:stage" -> {"prompts", "ids_changed", "max_logprob", "moved_prompts"}: how far each stage
    # moved (the matrix's columns), and on which prompts beyond its golden
    moves: dict = field(default_factory=dict)
    pte_localized: list[str] = field(default_factory=list)  # the .pte's first operator to move, where it moved alone

    @property
    def blockers(self) -> list[Change]:
        return [c for c in self.changes if not c.acceptable]
