"""Making artifacts (the name as in ``optimum-cli export``; it was ``harness/build/``, a name that
``.gitignore`` files and structure or coverage tools take for generated output): quantize → export (``.pt2``) → lower → serialize (``.pte``), the fast
recipe's decoder rewrite (``fast/``), the cached ``BuildPipeline`` that strings them together and
the memory pre-flight that runs before each stage. Every file here (with ``harness/models``,
``recipes.py`` and ``program.py``) goes into the build hash, so what is here decides what a cached
artifact contains; nothing here runs or checks an artifact (that is ``harness/runtimes``).
"""
