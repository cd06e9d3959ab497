"""The Pi 5 bundle for a user's checkpoint: ``harness bench bundle DIR --model CKPT --recipe R``.

What the device needs to check that model: the native runner for its architecture (as in the
fixture's bundle, harness/bench/bundle.py), the recipe's ``.pte``, the checkpoint's tokenizer, and
its goldens: every recorded prompt as the goldens hold it (the chat-templated text and its ids)
with the ids the ``native`` stage recorded (``goldens update --model CKPT``), which the device's
runner must say token for token.

The ``.pte`` is the artifact cache's own, hard-linked into the bundle (3.6 GB at E2B size is not
written twice; copying the bundle to the Pi copies the file). Where the cache is on another file
system it is copied, and the manifest says so. Before the bundle is written, its own runner says
the goldens here: under qemu as a Cortex-A76 for an aarch64 bundle whose ``.pte`` is small enough
to emulate (``EMULATE_BYTES``); at E2B size qemu would take hours, and the manifest records it as
not checked here, and why.
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.bench.bundle import CHECK_CPUS, Staging, check_bundle
from harness.errors import HarnessError

EMULATE_BYTES = 512 << 20  # a .pte above this is not checked under qemu before writing (hours at E2B size)


def model_section(subject, recipe: str) -> dict:
    """The recorded prompts with their ids and native-stage goldens (the ``pte`` stage's where the
    goldens predate the native stage)."""
    from harness.goldens.checks import golden_margin, is_near_tie
    from harness.goldens.store import golden_ids, logit_golden_path, prompt_golden_path, read_json_golden, token_golden_path

    key = subject.key
    stage = "native" if token_golden_path(recipe, "native", subject.prompts[0], key).is_file() else "pte"
    prompts = []
    for prompt in subject.prompts:
        record = read_json_golden(prompt_golden_path(prompt, key))
        golden = golden_ids(recipe, stage, prompt, key)
        # another ISA's kernels may flip a near-tie (the device is held to the golden exactly up to
        # the first position whose recorded top-2 margin is one: refresh/near_tie)
        logits = read_json_golden(logit_golden_path(recipe, "pte", prompt, key))
        exact = next((i for i in range(len(golden)) if is_near_tie(golden_margin(logits, i))), len(golden))
        prompts.append({"prompt": prompt, "templated": record["rendered"], "ids": record["ids"],
                        "golden": golden, "exact_upto": exact})
    return {"id": key, "directory": subject.spec, "recipe": recipe, "goldens_stage": stage, "prompts": prompts,
            "max_new_tokens": max(len(p["golden"]) for p in prompts)}


def build_model_bundle(out: Path, model: str, recipe: str = "8da4w-fast", arch: str = "aarch64",
                       progress=print) -> Path:
    from harness.export.preflight import checked_pipeline
    from harness.goldens.subject import recorded_subject_problem, subject_for
    from harness.program import ExportSettings, eos_ids
    from harness.runtimes.arm import ARCHES
    from harness.versions import library_versions

    if arch not in ARCHES:
        raise HarnessError(f"no device runner for architecture {arch!r}", f"pass --arch {' or --arch '.join(ARCHES)}")
    subject = subject_for(model)
    problem = recorded_subject_problem(subject, [recipe])
    if problem:
        raise HarnessError(*problem)
    section = model_section(subject, recipe)
    staging = Staging(out)
    try:
        runner = staging.put_runner(arch, progress)
        pipe = checked_pipeline(subject.spec, recipe, ExportSettings(max_context=subject.max_context),
                                progress=progress, until="lower")
        pte = pipe.pte_path  # the cache's (a hit when the goldens were recorded on this stack)
        name = f"model-{recipe}.pte"
        section.update(pte=name, pte_bytes=pte.stat().st_size, pte_stored=staging.put(pte, name, link=True),
                       tokenizer="model-tokenizer.json", eos_ids=eos_ids(pipe.loaded))
        staging.put(Path(subject.spec) / "tokenizer.json", section["tokenizer"])
        del pipe
        manifest = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "libraries": library_versions(),
                    "runner": runner, "fixture": None, "bench": None, "model": section}
        if section["pte_bytes"] > EMULATE_BYTES and arch == "aarch64":
            why = (f"a {section['pte_bytes'] / 1e9:.1f} GB .pte under qemu would take hours: "
                   "`pytest -m pi5 --pi5-bundle DIR` on the device checks it")
            manifest["checked"] = [{"arch": arch, "cpu": CHECK_CPUS[arch][0], "checked": False, "why": why}]
        else:
            manifest["checked"] = [check_bundle(staging.dir, manifest, {}, cpu, progress) for cpu in CHECK_CPUS[arch]]
        progress(f"bundle: {name} is a {section['pte_stored']} of the artifact cache's .pte")
        return staging.finish(manifest)
    except BaseException:
        staging.abort()
        raise
