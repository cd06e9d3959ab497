"""The options that say whose goldens a ``goldens`` command works on: --model, --goldens,
--recipe, --prompts (README, 'Your own model')."""

from __future__ import annotations

import os
from pathlib import Path

SKIP_HELP = ("run even if the memory pre-flight estimates more than the memory available "
             "(also HARNESS_SKIP_MEMORY_CHECK=1)")


def golden_target_args(p, update: bool) -> None:
    """--model/--goldens/--prompts/--recipe: whose goldens, where (README, 'Your own model')."""
    p.add_argument("--model", default="fixture",
                   help="fixture (the harness's own, in goldens/), or your Gemma 4 checkpoint directory")
    p.add_argument("--goldens", metavar="DIR",
                   help="the goldens directory (default: the repository's goldens/, or HARNESS_GOLDENS_DIR); "
                        "commit it in your own repository")
    p.add_argument("--recipe", action="append", metavar="RECIPE",
                   help=("recipes to record (repeatable; default 8da4w-fast, or those already recorded)" if update
                         else "check that RECIPE's goldens are recorded (every recorded recipe is diffed)"))
    if update:
        p.add_argument("--prompts", metavar="FILE.jsonl",
                       help='your prompts, one {"prompt": "..."} per line (default: those recorded, else the '
                            "default set, one longer than the sliding window)")
    p.add_argument("--skip-memory-check", action="store_true", help=SKIP_HELP)


def golden_subject(args):
    """Point the goldens at --goldens, then resolve --model (with --prompts/--recipe)."""
    from harness.goldens.subject import subject_for

    if args.goldens:
        os.environ["HARNESS_GOLDENS_DIR"] = str(Path(args.goldens).resolve())
    if args.skip_memory_check:
        os.environ["HARNESS_SKIP_MEMORY_CHECK"] = "1"
    return subject_for(args.model, getattr(args, "prompts", None), args.recipe)
