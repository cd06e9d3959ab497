"""The upgrade step of ``tox -e refresh``: install the newest installable release of some packages
(or the versions asked for), print each one's version before and after, and fail (exit 3) when
nothing changed, so that a stack is never diffed against itself and called clean.

    python -m harness.goldens.upgrade [--no-deps] 'transformers' ['torchao==0.17.0' ...]

pip takes the newest release whose requirements it can meet: on a machine whose registry lacks
``kernels>=0.19.1`` that is not transformers 5.25, and without this check the refresh printed
"no golden changed" for the pinned stack. ``--no-deps`` installs a release beside the pinned stack
without its new requirements (how 5.25 installs here).
"""

from __future__ import annotations

import re
import subprocess
import sys


def name_of(spec: str) -> str:
    return re.split(r"[<>=!~\[; ]", spec.strip(), maxsplit=1)[0]


def installed_versions(names, python: str = sys.executable) -> dict[str, str | None]:
    """Each package's installed version, read by a fresh interpreter (after pip changed it)."""
    code = ("import json, sys\nfrom importlib import metadata\nout = {}\nfor n in sys.argv[1:]:\n"
            "    try: out[n] = metadata.version(n)\n    except metadata.PackageNotFoundError: out[n] = None\n"
            "print(json.dumps(out))")
    import json

    done = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def pip_install(specs, no_deps: bool, python: str = sys.executable) -> tuple[int, str]:
    cmd = [python, "-m", "pip", "install", "--quiet", "--upgrade", *(["--no-deps"] if no_deps else []), *specs]
    done = subprocess.run(cmd, capture_output=True, text=True)
    return done.returncode, (done.stderr or done.stdout).strip()


def upgrade(specs, no_deps: bool = False, say=print, install=pip_install, versions=installed_versions) -> int:
    names = [name_of(s) for s in specs]
    before = versions(names)
    rc, text = install(specs, no_deps)
    if rc != 0:
        last = (text.splitlines() or ["(no output)"])[-1]
        say(f"upgrade: pip could not install {' '.join(specs)}: {last}")
        say("upgrade: nothing to diff; pin an installable release (REFRESH_TRANSFORMERS===V), or add "
            "REFRESH_PIP_FLAGS=--no-deps to install it beside the pinned stack")
        return 3
    after = versions(names)
    for n in names:
        mark = "" if before[n] != after[n] else "  (unchanged)"
        say(f"upgrade: {n} {before[n]} -> {after[n]}{mark}")
    if before == after:
        say("upgrade: nothing was upgraded: pip's newest installable release is the one already installed, "
            "so a diff would compare this stack with itself. Name a release (REFRESH_TRANSFORMERS===5.25.0, "
            "REFRESH_PIP_FLAGS=--no-deps where its new requirements are not in the registry).")
        return 3
    return 0


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m harness.goldens.upgrade", description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", metavar="SPEC")
    ap.add_argument("--no-deps", action="store_true")
    args = ap.parse_args(argv)
    return upgrade([s for s in args.specs if s.strip()], no_deps=args.no_deps)


if __name__ == "__main__":
    sys.exit(main())
