"""What ``goldens diff`` says of the model's components (harness/goldens/activations.py computes
them): the activation changes the gate weighs, and the localization line per recipe. The ``.pte``'s
own line, where it moved alone, is harness/goldens/pte_gap.py's."""

from __future__ import annotations

from harness.goldens.change import Change
from harness.goldens.store import activation_golden_path, read_json_golden


def activation_changes(c) -> list[Change]:
    """A component beyond its tolerance is numerics (the tokens and logits judge behaviour): it is
    named, first in forward order, by the localization line (``localization_lines``)."""
    out = []
    for (recipe, prompt), record in c.activations.items():
        if (recipe, prompt) not in c.localized:
            path = activation_golden_path(recipe, prompt, c.subject.key)
            if not path.is_file():
                out.append(Change("new", f"{prompt!r} {recipe}:eager activations", "no activation golden yet", True))
            elif read_json_golden(path) != record:  # recorded after this computation, and not from it
                out.append(Change("activations", f"{prompt!r} {recipe}:eager", "recorded after this computation "
                                  "and not from it: rerun the diff to localize", True))
        elif c.localized[(recipe, prompt)][1]:
            out.append(Change("activations", f"{prompt!r} {recipe}:eager", c.localized[(recipe, prompt)][0], True))
    return out


def localization_lines(c) -> list[str]:
    """Per recipe, one line: the prompt whose first moved component comes earliest in forward order
    (or, where nothing moved, that every component is within bounds)."""
    by_recipe: dict[str, list] = {}
    for (recipe, _prompt), (line, _moved, rank) in c.localized.items():
        by_recipe.setdefault(recipe, []).append((rank, line))
    return [min(rows)[1] for rows in by_recipe.values()]
