"""syrupy as the snapshot engine of the token goldens, on the harness's own data-keyed files.

``token_snapshot(recipe, stage, prompt) == token_record(...)`` is a syrupy assertion whose snapshot
is ``goldens/tokens/MODEL/RECIPE/STAGE/PROMPT.json``, byte for byte the file `harness goldens update`
writes (``encode_json(token_record(...))``): the goldens stay where they are and what they are.

What syrupy does not get to do: write or delete a golden. Under ``pytest --snapshot-update`` a
snapshot that differs (or is missing) is only noted here (``REQUESTED``); at the end of the session
conftest.py runs the gate of ``harness goldens update`` on the whole set, which writes every golden
and the provenance when every change is numerics, and nothing otherwise (the session then fails
with the gate's lines). So a ``-k`` subset can never update part of the set: the gate recomputes all
of it. Discovery returns nothing, so syrupy never takes a golden for an unused snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path

from syrupy.data import SnapshotCollection, SnapshotCollections
from syrupy.extensions.base import AbstractSyrupyExtension

from harness.goldens.store import encode_json, token_golden_path

REQUESTED: list[str] = []  # golden files syrupy asked to write in this session (--snapshot-update)


def snapshot_index(recipe: str, stage: str, prompt: str, model: str = "fixture") -> str:
    """The snapshot's name: the golden's data key (model, recipe, stage, prompt), never a test name."""
    return json.dumps([model, recipe, stage, prompt])


class TokenGoldenExtension(AbstractSyrupyExtension):
    file_extension = "json"

    @classmethod
    def get_location(cls, *, test_location, index) -> str:
        model, recipe, stage, prompt = json.loads(index)
        return str(token_golden_path(recipe, stage, prompt, model))

    @classmethod
    def matches_test_location(cls, *, test_location, snapshot_location: str) -> bool:
        return True  # keyed by data: the location never names the test

    def serialize(self, data, *, exclude=None, include=None, matcher=None) -> str:
        return encode_json(data).decode()

    def read_snapshot_data_from_location(self, *, snapshot_location: str, snapshot_name: str, session_id: str):
        path = Path(snapshot_location)
        return path.read_bytes().decode() if path.is_file() else None

    def discover_snapshots(self, *, test_location, ignore_extensions=None) -> SnapshotCollections:
        return SnapshotCollections()  # never "unused": the gate owns which goldens exist

    def read_snapshot_collection(self, *, snapshot_location: str) -> SnapshotCollection:
        return SnapshotCollection(location=snapshot_location)

    def delete_snapshots(self, *, snapshot_location: str, snapshot_names) -> None:
        raise RuntimeError(f"{snapshot_location}: goldens are removed only by `harness goldens update`")

    @classmethod
    def write_snapshot_collection(cls, *, snapshot_collection, name_order=None) -> None:
        REQUESTED.append(snapshot_collection.location)  # written, or not, by the gate at session end
