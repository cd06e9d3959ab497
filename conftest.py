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
    "dev", deadline=None, max_examples=50,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "debug", deadline=None, max_examples=10, verbosity=3, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

ROOT = Path(__file__).resolve().parent
FIXTURE_DIR = ROOT / "harness" / "fixture"
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
RECIPE_NAMES = ["fp32", "8da4w"]


def corpus() -> list[dict]:
    return [json.loads(l) for l in (FIXTURE_DIR / "corpus.jsonl").read_text().splitlines() if l.strip()]


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
