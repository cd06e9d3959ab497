"""Shared fixtures: one lazily built, cached pipeline per (model, recipe); hypothesis profiles."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev", deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "debug", deadline=None, verbosity=3, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)
# Tests size their example counts for the ci profile; dev runs 4x more, debug a quarter.
EXAMPLE_SCALE = {"ci": 1.0, "dev": 4.0, "debug": 0.25}.get(PROFILE, 1.0)


def examples(n: int) -> int:
    return max(1, int(n * EXAMPLE_SCALE))

from harness.load import FIXTURE_DIR  # noqa: E402
from harness.recipes import RECIPES  # noqa: E402
from harness.train_fixture import read_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parent
# The prompts every golden is recorded for: a sample of the fixture corpus (5 for the benchmark
# protocol, plus one that is not a capital).
FIXTURE_PROMPTS = [
    "What is the capital of France?",
    "What is the capital of Japan?",
    "What is the capital of India?",
    "What is the capital of Mexico?",
    "Who wrote Hamlet?",
    "What is the boiling point of water?",
]
RECIPE_NAMES = list(RECIPES)


def corpus() -> list[dict]:
    return read_corpus()


@pytest.fixture(scope="session")
def fixture_answers() -> dict[str, str]:
    return {row["prompt"]: row["answer"] for row in corpus()}


@pytest.fixture(scope="session")
def pipeline():
    """``pipeline(recipe, model="fixture")``: one Pipeline per key per session; its .pt2/.pte
    come from the artifact cache when their key matches."""
    from harness.pipeline import Pipeline

    made: dict = {}

    def get(recipe: str = "fp32", model: str = "fixture") -> Pipeline:
        key = (model, recipe)
        if key not in made:
            made[key] = Pipeline(model, recipe)
        return made[key]

    return get


# ---- goldens ----------------------------------------------------------------------------------
from syrupy.extensions.json import JSONSnapshotExtension  # noqa: E402


class GoldenTokens(JSONSnapshotExtension):
    """Token goldens (ids + text, never floats) live in goldens/tokens/, one file per
    model, recipe, stage and prompt."""

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(ROOT / "goldens" / "tokens" / test_location.basename)


@pytest.fixture
def golden_tokens(snapshot):
    return snapshot.with_defaults(extension_class=GoldenTokens)


@pytest.fixture(scope="session")
def updating_goldens(request) -> bool:
    return bool(request.config.getoption("--snapshot-update", default=False))


@pytest.fixture(scope="session")
def stage_runs(pipeline):
    """``stage_runs(recipe, stage, prompt)`` -> Generation, computed once per session; ``.all``
    holds every run so far, keyed (recipe, stage) per prompt, for failure explanations."""
    from harness.goldens import STAGES

    memo: dict = {}

    def run(recipe: str, stage: str, prompt: str):
        key = (recipe, stage, prompt)
        if key not in memo:
            memo[key] = pipeline(recipe).run_stage(stage, prompt)
        return memo[key]

    def chain(prompt: str, recipes=("fp32", "8da4w")) -> dict:
        return {(r, s): run(r, s, prompt) for r in recipes for s in STAGES}

    run.chain = chain
    return run


def pytest_sessionfinish(session, exitstatus):
    """With --snapshot-update, the provenance record is rewritten together with the goldens."""
    if not session.config.getoption("--snapshot-update", default=False):
        return
    from harness.goldens import PROVENANCE, current_provenance, write_json_golden
    from harness.cache import sha256_file

    write_json_golden(PROVENANCE, current_provenance(sha256_file(FIXTURE_DIR / "model.safetensors")))


def pytest_report_header(config):
    from harness.goldens import PROVENANCE, current_provenance, provenance_diff
    from harness.cache import sha256_file

    if not PROVENANCE.is_file():
        return "goldens: no provenance record (record with: pytest -m mac --snapshot-update)"
    try:
        recorded = json.loads(PROVENANCE.read_text())
    except ValueError:
        return "goldens: provenance.json is malformed"
    diff = provenance_diff(recorded, current_provenance(sha256_file(FIXTURE_DIR / "model.safetensors")))
    if not diff:
        return "goldens: recorded under this exact stack"
    return "goldens: recorded under another stack: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items())


@pytest.fixture(scope="session")
def golden_tokens_for():
    """Read a committed token golden directly: ``golden_tokens_for(recipe, stage, prompt)``."""
    from harness.golden_diff import golden_path
    from harness.goldens import read_json_golden

    def read(recipe: str, stage: str, prompt: str) -> list[int]:
        return read_json_golden(golden_path(recipe, stage, prompt))["ids"]

    return read
