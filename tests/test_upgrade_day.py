"""Upgrade day against real releases: transformers' hub kernels stay off whatever the release's
default, and `goldens diff` / `goldens update` / `verify` exit 0 or 1 only as verdicts, 2 on any error."""

from __future__ import annotations

import os

import pytest

from support import run_cli

pytestmark = pytest.mark.mac


@pytest.fixture
def kernels_by_default(monkeypatch):
    """transformers 5.25's default, simulated on the installed release: ``from_pretrained`` treats
    an absent ``use_kernels`` as True, and turning kernels on would fetch them from the Hub (here: it
    raises, as 5.25 does without the `kernels` package; nothing can be downloaded). Records what
    every load asked for."""
    from transformers import PreTrainedModel

    asked = []
    original_from_pretrained = PreTrainedModel.from_pretrained.__func__
    original_set = PreTrainedModel.set_use_kernels

    def from_pretrained(cls, *args, **kw):
        kw.setdefault("use_kernels", os.environ.get("USE_HUB_KERNELS", "YES").upper() not in ("0", "OFF", "NO", "FALSE"))
        return original_from_pretrained(cls, *args, **kw)

    def set_use_kernels(self, use_kernels, *args, **kw):
        asked.append(bool(use_kernels))
        if use_kernels:
            raise ValueError("Kernels are not available. Please install a compatible version (0.19.1 <= version < 0.20.0)")
        return original_set(self, use_kernels, *args, **kw)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(from_pretrained))
    monkeypatch.setattr(PreTrainedModel, "set_use_kernels", set_use_kernels)
    return asked


def _module_types(model) -> list[str]:
    return sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()})


def test_a_transformers_that_defaults_to_hub_kernels_loads_the_stock_modules(kernels_by_default, monkeypatch):
    from harness.models.load import FIXTURE_DIR, load_directory

    reference = load_directory(FIXTURE_DIR, name="fixture", identity="x")
    monkeypatch.setenv("USE_HUB_KERNELS", "YES")  # even where the user's environment turns them on
    kernels_by_default.clear()
    loaded = load_directory(FIXTURE_DIR, name="fixture", identity="x")
    assert kernels_by_default == [False], "every load must ask for use_kernels=False"
    assert _module_types(loaded.model) == _module_types(reference.model)
    assert all(t.startswith(("transformers.models.gemma4.", "transformers.activations.", "torch.nn.")) for t in _module_types(loaded.model))


def test_the_simulated_default_does_turn_kernels_on_without_the_harness(kernels_by_default, monkeypatch):
    """The simulation has teeth: a load that does not pass use_kernels=False fails under it."""
    from transformers import Gemma4ForCausalLM

    from harness.models.load import FIXTURE_DIR

    monkeypatch.setenv("USE_HUB_KERNELS", "YES")
    with pytest.raises(ValueError, match="Kernels are not available"):
        Gemma4ForCausalLM.from_pretrained(str(FIXTURE_DIR))


def test_the_harness_process_runs_with_hub_kernels_off_and_provenance_says_so():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import harness, os; print(os.environ['USE_HUB_KERNELS'])"],
                         env={**os.environ, "USE_HUB_KERNELS": "1"}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"
    from harness.goldens.provenance import STACK_KEYS, current_provenance

    prov = current_provenance()
    assert prov["USE_HUB_KERNELS"] == "0" and prov["use_kernels"] == "False"
    assert {"USE_HUB_KERNELS", "use_kernels"} <= set(STACK_KEYS)


def test_a_fusion_config_in_the_checkpoint_is_dropped_and_recorded(tmp_path):
    """transformers 5.24+ builds other modules from a config.json ``fusion_config``; the harness
    guards the stock ones, so it drops it and says so."""
    import json
    import shutil

    from harness.models.load import FIXTURE_DIR, load_directory

    for f in FIXTURE_DIR.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["fusion_config"] = {"rms_norm": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = load_directory(tmp_path)
    assert loaded.meta["dropped_fusion_config"] == ["rms_norm"]
    assert not getattr(loaded.config, "fusion_config", None)


@pytest.mark.parametrize("argv", [["goldens", "diff"], ["goldens", "update"]])
def test_an_exception_inside_the_golden_computation_exits_2_not_a_verdict(argv, monkeypatch, tmp_path):
    import shutil

    import harness.goldens.refresh as refresh
    from harness.goldens.store import goldens_dir

    copy = tmp_path / "goldens"
    shutil.copytree(goldens_dir(), copy)
    monkeypatch.setenv("HARNESS_GOLDENS_DIR", str(copy))

    def boom(*a, **kw):
        raise ValueError("Kernels are not available")

    monkeypatch.setattr(refresh, "compute", boom)
    rc, out, err = run_cli(argv)
    assert rc == 2, (rc, out, err)
    assert "internal error: ValueError: Kernels are not available" in err


def test_an_internal_error_of_other_commands_still_exits_1(monkeypatch):
    """Commands without a verdict keep 1 for a bug (docs/upgrade-day.md, 'Exit codes')."""
    import harness.training.synthetic as synthetic

    monkeypatch.setattr(synthetic, "make_checkpoint", lambda *a, **kw: 1 / 0)
    rc, out, err = run_cli(["make-checkpoint", "/nonexistent-never-written"])
    assert rc == 1 and "internal error: ZeroDivisionError" in err


def test_a_refresh_that_upgraded_nothing_says_so_and_fails():
    from harness.goldens.upgrade import upgrade

    lines = []
    rc = upgrade(["transformers"], say=lines.append, install=lambda specs, nd: (0, ""),
                 versions=lambda names: {"transformers": "5.24.0"})
    assert rc == 3
    assert "transformers 5.24.0 -> 5.24.0  (unchanged)" in lines[0]
    assert "nothing was upgraded" in lines[-1] and "itself" in lines[-1]


def test_a_refresh_prints_what_it_resolved_and_goes_on():
    from harness.goldens.upgrade import upgrade

    seen = iter([{"transformers": "5.24.0"}, {"transformers": "5.25.0"}])
    lines = []
    rc = upgrade(["transformers==5.25.0"], no_deps=True, say=lines.append,
                 install=lambda specs, nd: (0, "") if nd else (1, "needs kernels>=0.19.1"),
                 versions=lambda names: next(seen))
    assert rc == 0 and lines == ["upgrade: transformers 5.24.0 -> 5.25.0"]


def test_a_release_pip_cannot_install_is_one_line_and_no_diff():
    from harness.goldens.upgrade import upgrade

    lines = []
    rc = upgrade(["transformers==5.25.0"], say=lines.append,
                 install=lambda specs, nd: (1, "ERROR: No matching distribution found for kernels>=0.19.1"),
                 versions=lambda names: {"transformers": "5.24.0"})
    assert rc == 3 and "kernels>=0.19.1" in lines[0]
