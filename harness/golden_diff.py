"""``harness goldens diff``: rerun every golden stage on this stack and print what changed
against the committed goldens (prompt, stage, first diverging token, margin) and the provenance
before and after. Run it after an upgrade, before deciding on ``--snapshot-update``."""

from __future__ import annotations

from harness.errors import HarnessError
from harness.goldens import (
    GOLDENS_DIR, PROVENANCE, STAGES, check_tokens, current_provenance, explain, provenance_diff,
    read_json_golden, slug,
)

from harness.recipes import RECIPES as _RECIPES

RECIPES = tuple(_RECIPES)


def committed_prompts() -> list[str]:
    """Prompts that have committed goldens, recovered from the corpus by their slugs."""
    from harness.train_fixture import read_corpus

    folder = GOLDENS_DIR / "tokens" / "test_goldens"
    if not folder.is_dir():
        raise HarnessError(f"no token goldens in {folder}", "record them with: pytest -m mac --snapshot-update")
    names = {p.name for p in folder.glob("*.json")}
    return [r["prompt"] for r in read_corpus()
            if f"test_token_golden[{slug(r['prompt'])}-pte-fp32].json" in names]


def golden_path(recipe: str, stage: str, prompt: str):
    return GOLDENS_DIR / "tokens" / "test_goldens" / f"test_token_golden[{slug(prompt)}-{stage}-{recipe}].json"


def diff(progress=print) -> tuple[list[str], dict]:
    from harness.cache import sha256_file
    from harness.load import FIXTURE_DIR
    from harness.pipeline import Pipeline

    recorded = read_json_golden(PROVENANCE) if PROVENANCE.is_file() else {}
    now = current_provenance(sha256_file(FIXTURE_DIR / "model.safetensors"))
    pipes = {r: Pipeline("fixture", r, progress=progress) for r in RECIPES}
    lines = []
    for prompt in committed_prompts():
        runs = {(r, s): pipes[r].run_stage(s, prompt) for r in RECIPES for s in STAGES}
        tok = pipes["fp32"].loaded.tokenizer
        for recipe in RECIPES:
            for stage in STAGES:
                golden = read_json_golden(golden_path(recipe, stage, prompt))
                report = check_tokens(golden["ids"], runs[(recipe, stage)], tok, f"{recipe}:{stage}")
                if report:
                    lines.append(f"- {prompt!r}: {report}\n  localized: {explain(recipe, stage, runs, tok)}")
    return lines, provenance_diff(recorded, now) | {"_recorded": recorded, "_now": now}


def main(progress=print) -> int:
    lines, prov = diff(progress)
    recorded, now = prov.pop("_recorded"), prov.pop("_now")
    print("provenance (recorded -> now):")
    for key in sorted(set(recorded) | set(now)):
        mark = "  changed" if key in prov else ""
        print(f"  {key}: {recorded.get(key)} -> {now.get(key)}{mark}")
    if not lines:
        print("\nno golden changed: every stage still says exactly what it said")
        return 0
    print(f"\n{len(lines)} golden(s) changed:")
    print("\n".join(lines))
    print("\nAccept (pytest -m mac --snapshot-update) only if the first diverging stage is one you "
          "upgraded and its margin there is a near-tie; a clear-margin change is a regression to report.")
    return 1
