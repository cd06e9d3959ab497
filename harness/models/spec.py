"""One resolver for what a user may name as a model: ``fixture`` (the committed, trained tiny
Gemma 4), ``bench`` (the benchmark-size config with seeded random weights), ``FILE.json`` (any
Gemma4TextConfig with seeded random weights, materialised like ``bench``), or a checkpoint
directory (flat ``gemma4_text`` or the multimodal ``gemma4`` layout). Every stage that takes a
model spec (load, the GGUF converter, the memory pre-flight) goes through ``resolve``, so a spec
means the same weights everywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.models.bench import BENCH_CONFIG, bench_model_dir
from harness.models.load import FIXTURE_DIR, LoadedModel, load_directory, load_fixture, read_config_file


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "fixture" | "config" | "directory"
    text: str  # what the user wrote
    path: Path  # the fixture or checkpoint directory, or the config file
    name: str  # the short name in tables and cache entries

    def config(self) -> dict:
        """The text config, without materialising weights (the pre-flight reads only this)."""
        if self.kind == "config":
            return read_config_file(self.path)
        raw = json.loads((self.path / "config.json").read_text())
        return dict(raw.get("text_config") or raw)

    def directory(self) -> Path:
        """A checkpoint directory holding these weights (a config is materialised once, cached)."""
        if self.kind == "config":
            read_config_file(self.path)  # a one-line error before any work
            return bench_model_dir(config_path=self.path)
        return self.path

    def load(self) -> LoadedModel:
        if self.kind == "fixture":
            return load_fixture()
        if self.kind == "config":
            directory = self.directory()  # its name holds the cache key: config, seed, code, libraries
            return load_directory(directory, name=self.name, identity=directory.name)
        return load_directory(self.path)


def resolve(spec) -> ModelSpec:
    s = str(spec)
    if s == "fixture":
        return ModelSpec("fixture", s, FIXTURE_DIR, "fixture")
    if s == "bench":
        return ModelSpec("config", s, BENCH_CONFIG, "bench")
    path = Path(s)
    if path.suffix == ".json":
        if not path.is_file():
            raise HarnessError(f"config file {s} does not exist", "pass an existing Gemma4TextConfig JSON")
        return ModelSpec("config", s, path, f"config:{path.stem}")
    return ModelSpec("directory", s, path, s)


def load_model(spec) -> LoadedModel:
    """``fixture``, ``bench``, ``FILE.json`` or a checkpoint directory, loaded in FP32."""
    return resolve(spec).load()
