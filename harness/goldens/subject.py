"""Whose goldens: the committed fixture (the harness testing itself) or the user's own checkpoint
(what the harness guards). A ``Subject`` says which model, under which key its goldens live, for
which prompts and recipes, and along which stage chain.

- ``fixture``: key ``fixture``, the 7 golden prompts, fp32 and 8da4w, each through
  hf_generate → eager → exported → pte (fp32's first stage the quantize step's reference).
- a checkpoint directory: key ``NAME-HASH12`` (harness/models/identity.py), the default prompts
  (or ``--prompts FILE.jsonl``), the recipes asked for (default ``8da4w-fast``, the deploy path),
  and the chain ``reference-DTYPE:hf_generate`` (transformers in the checkpoint's own dtype, bf16
  for Gemma 4: FP32 at E2B is 18.5 GB of weights) → ``RECIPE:eager`` → ``exported`` → ``pte``.
  Its prompts and recipes are recorded in its provenance, so a later ``diff`` needs no flags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.goldens.store import GOLDEN_PROMPTS, MAX_NEW_TOKENS, UPDATE_COMMAND, chain, predecessor

DEFAULT_RECIPES = ("8da4w-fast",)
RECIPE_STAGES = ("eager", "exported", "pte", "native")  # native: the .pte through the torch-free runner (ids only)
SHORT_PROMPTS = (
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "Write one sentence about the sea.",
)
# Repeated until the chat-templated prompt is longer than the model's sliding window, so that
# prefill itself crosses the window edge (512 tokens for E2B).
PASSAGE = ("The Raspberry Pi 5 runs the exported model from a single file. It reads the prompt, fills "
           "its cache and then writes one token at a time, and every token it writes must be the one "
           "the reference wrote before the upgrade. ")
LONG_PREFIX = "Read this and say in one word what it is about. "
DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class Subject:
    spec: str  # "fixture" or the checkpoint directory
    key: str  # where its goldens live: tokens/KEY/..., provenance of KEY
    prompts: tuple[str, ...]
    recipes: tuple[str, ...]  # recipes with goldens of their own
    reference: str | None = None  # None: the fixture's fp32 chain; else "reference-bf16" etc.
    max_context: int = 128
    synthetic: bool = False  # generated weights (harness make-checkpoint), never real E2B

    @property
    def is_fixture(self) -> bool:
        return self.spec == "fixture"

    @property
    def logit_format(self) -> str:
        """``full`` (every logit, float32) for the fixture; ``compact`` for a user's checkpoint,
        whose 262,144-token vocabulary would make that 1 MB per position (harness/goldens/store.py)."""
        return "full" if self.is_fixture else "compact"

    def chain(self) -> list[tuple[str, str]]:
        if self.is_fixture:
            return chain(self.recipes)
        return [(self.reference, "hf_generate")] + [(r, s) for r in self.recipes for s in RECIPE_STAGES]

    def stages(self, recipe: str) -> list[str]:
        return [s for r, s in self.chain() if r == recipe]

    def chain_recipes(self) -> list[str]:
        return list(dict.fromkeys(r for r, _ in self.chain()))

    def predecessor(self, recipe: str, stage: str) -> tuple[str, str] | None:
        if self.is_fixture:
            return predecessor(recipe, stage)
        if recipe == self.reference:
            return None
        i = RECIPE_STAGES.index(stage)
        return (recipe, RECIPE_STAGES[i - 1]) if i else (self.reference, "hf_generate")

    def describe(self) -> str:
        return f"{self.key} ({self.spec})" if not self.is_fixture else "fixture"


def fixture_subject() -> Subject:
    from harness.recipes import GOLDEN_RECIPES

    return Subject("fixture", "fixture", tuple(GOLDEN_PROMPTS), tuple(GOLDEN_RECIPES))


# ---- prompts ----------------------------------------------------------------------------------
def read_prompt_file(path: Path) -> tuple[str, ...]:
    """``FILE.jsonl``: one JSON object per line with a non-empty ``"prompt"`` string (blank lines
    skipped); a malformed line is one error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise HarnessError(f"prompt file {path} does not exist", "pass a JSONL file, one {\"prompt\": \"...\"} per line")
    out: list[str] = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="strict").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise HarnessError(f"{path}:{n} is not valid JSON ({e.msg})",
                               'write one object per line: {"prompt": "..."}') from None
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise HarnessError(f"{path}:{n} has no non-empty \"prompt\" string",
                               'write one object per line: {"prompt": "..."}')
        if prompt in out:
            raise HarnessError(f"{path}:{n} repeats the prompt {prompt[:40]!r}", "list each prompt once")
        out.append(prompt)
    if not out:
        raise HarnessError(f"prompt file {path} has no prompts", 'add lines like {"prompt": "..."}')
    return tuple(out)


def templated_length(tokenizer, prompt: str) -> int:
    from harness.pipeline import encode_prompt

    return len(encode_prompt(tokenizer, prompt))


def long_prompt(tokenizer, sliding_window: int, max_positions: int) -> str:
    """The passage repeated until the templated prompt exceeds the sliding window (by 16 tokens at
    least), within the model's positions; the shortest such repetition."""
    limit = max_positions - MAX_NEW_TOKENS - 1
    text = LONG_PREFIX + PASSAGE
    while templated_length(tokenizer, text) <= sliding_window + 16:
        longer = text + PASSAGE
        if templated_length(tokenizer, longer) > limit:
            break
        text = longer
    return text.strip()


def default_prompts(tokenizer, config) -> tuple[str, ...]:
    window = int(getattr(config, "sliding_window", None) or 512)
    positions = int(getattr(config, "max_position_embeddings", None) or 131072)
    return SHORT_PROMPTS + (long_prompt(tokenizer, window, positions),)


def context_for(tokenizer, prompts) -> int:
    """The exported programs' context: a power of two holding the longest prompt and its answer."""
    need = max(templated_length(tokenizer, p) for p in prompts) + MAX_NEW_TOKENS
    size = 128
    while size < need:
        size *= 2
    return size


# ---- a checkpoint directory --------------------------------------------------------------------
def check_checkpoint(directory: Path):
    """The checks a user's checkpoint gets before any work, each one line: a Gemma 4 checkpoint
    (config, weights, shards), with a tokenizer whose ids fit the model's vocabulary. Returns
    (tokenizer, text config)."""
    from transformers import Gemma4TextConfig

    from harness.models.load import _load_tokenizer, check_model_dir

    check_model_dir(directory)
    try:
        raw = json.loads((directory / "config.json").read_text())
    except ValueError as e:
        raise HarnessError(f"{directory}/config.json is not valid JSON ({e})", "restore the checkpoint's config.json") from None
    if raw.get("model_type") not in ("gemma4", "gemma4_text"):
        raise HarnessError(f"{directory} is not a Gemma 4 checkpoint (config.json model_type {raw.get('model_type')!r})",
                           "pass a Gemma 4 checkpoint directory (model_type gemma4 or gemma4_text)")
    text = dict(raw.get("text_config") or raw)
    text.pop("model_type", None)
    config = Gemma4TextConfig(**text)
    tokenizer = _load_tokenizer(directory)
    vocab = int(config.vocab_size)
    size = len(tokenizer)
    if size > vocab:
        raise HarnessError(f"{directory}: the tokenizer has {size} tokens, the model's vocabulary {vocab}",
                           "use the tokenizer that came with this checkpoint")
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        tid = getattr(tokenizer, name, None)
        if tid is not None and not 0 <= int(tid) < vocab:
            raise HarnessError(f"{directory}: the tokenizer's {name[:-9]} id {tid} is outside the model's vocabulary ({vocab})",
                               "use the tokenizer that came with this checkpoint")
    return tokenizer, config


def checkpoint_subject(directory, prompts_file=None, recipes=None, recorded: dict | None = None) -> Subject:
    """The subject for a checkpoint directory: prompts from the file, else the recorded ones, else
    the defaults; recipes asked for, plus the recorded ones (an update with a new recipe adds it)."""
    from harness.models.identity import model_id
    from harness.models.load import checkpoint_dtype
    from harness.recipes import get_recipe
    from harness.training.synthetic import is_synthetic

    directory = Path(directory)
    tokenizer, config = check_checkpoint(directory)
    for r in recipes or ():
        if not get_recipe(r).quantizes:
            raise HarnessError(f"recipe {r} does not quantize: a checkpoint's goldens are for the recipes it ships",
                               "pass a quantizing recipe, e.g. --recipe 8da4w-fast")
    key = model_id(directory)
    if prompts_file is not None:
        prompts = read_prompt_file(prompts_file)
    elif recorded and recorded.get("prompts"):
        prompts = tuple(recorded["prompts"])
    else:
        prompts = default_prompts(tokenizer, config)
    chosen = tuple(dict.fromkeys([*(recorded or {}).get("recipes", ()), *(recipes or ())])) or DEFAULT_RECIPES
    dtype = checkpoint_dtype(directory)
    return Subject(str(directory), key, prompts, chosen, f"reference-{DTYPE_SHORT.get(dtype, dtype)}",
                   context_for(tokenizer, prompts), is_synthetic(directory))


def subject_for(model: str = "fixture", prompts_file=None, recipes=None) -> Subject:
    """``fixture`` or a checkpoint directory, as ``--model`` names it (with ``--prompts``/``--recipe``)."""
    if str(model) == "fixture":
        if prompts_file is not None:
            raise HarnessError("--prompts is for your own checkpoint; the fixture's prompts are the harness's own",
                               "pass --model DIR with --prompts, or drop --prompts")
        subject = fixture_subject()
        if recipes:
            unknown = [r for r in recipes if r not in subject.recipes]
            if unknown:
                raise HarnessError(f"the fixture has goldens for {', '.join(subject.recipes)}, not {', '.join(unknown)}",
                                   "drop --recipe (8da4w-fast is held to 8da4w's goldens by the tests)")
        return subject
    from harness.models.identity import model_id
    from harness.goldens.provenance import recorded_provenance

    directory = Path(model)
    from harness.models.load import check_model_dir

    check_model_dir(directory)
    recorded = recorded_provenance(model_id(directory))
    return checkpoint_subject(directory, prompts_file, recipes, recorded)


def recorded_subject_problem(subject: Subject, recipes=None) -> tuple[str, str] | None:
    """Why ``diff`` cannot compare this checkpoint (problem, fix), or None: no goldens for its id in
    this goldens directory (naming the ids that are there), or none for a recipe asked for."""
    from harness.goldens.provenance import recorded_provenance
    from harness.goldens.store import goldens_dir, model_provenance_dir

    if subject.is_fixture:
        return None
    recorded = recorded_provenance(subject.key)
    root = goldens_dir()
    if not recorded:
        others = sorted(p.stem for p in model_provenance_dir().glob("*.json")) if model_provenance_dir().is_dir() else []
        same_name = [o for o in others if o.rsplit("-", 1)[0] == subject.key.rsplit("-", 1)[0]]
        if same_name:
            return (f"the goldens in {root} were recorded for {', '.join(same_name)}, not {subject.key}: the same name, "
                    f"other content (its weights, config or tokenizer changed)",
                    f"record this checkpoint's with: {UPDATE_COMMAND} --model {subject.spec} --goldens {root}")
        return (f"{root} has no goldens for {subject.key}" + (f" (it has {', '.join(others)})" if others else ""),
                f"record them first with: {UPDATE_COMMAND} --model {subject.spec} --goldens {root}")
    missing = [r for r in recipes or () if r not in recorded.get("recipes", ())]
    if missing:
        return (f"the goldens of {subject.key} were recorded for {', '.join(recorded.get('recipes', ()))}, not "
                f"{', '.join(missing)}", f"diff those, or record {missing[0]} with: {UPDATE_COMMAND} --model "
                f"{subject.spec} --goldens {root} --recipe {missing[0]}")
    return None


def stages_label(subject: Subject) -> str:
    return " -> ".join(f"{r}:{s}" for r, s in subject.chain())

