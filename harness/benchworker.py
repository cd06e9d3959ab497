"""``python -m harness.benchworker RUNTIME ARTIFACT THREADS PROMPT_JSON NEW_TOKENS``: load one
runtime in a fresh process, generate once, print load time and memory as one JSON line.

``python -m harness.benchworker --serve RUNTIME ARTIFACT THREADS``: load one runtime, print its
load time, then answer each JSON line ``{"prompt": [...], "new_tokens": n}`` on stdin with one
timed Sample (``harness.benchrun.IsolatedRunner`` drives it).

``python -m harness.benchworker --runner PTE TOKENIZER_JSON NEW_TOKENS ROUNDS`` with a JSON list of
texts on stdin: ExecuTorch's C++ LLM runner's own figures as one JSON line."""

import json
import sys

from harness.benchrun import child_main, serve_main

if __name__ == "__main__":
    if sys.argv[1:2] == ["--runner"]:
        from harness.benchsuite import runner_figures_here

        pte, tok, new_tokens, rounds = sys.argv[2:]
        print(json.dumps(runner_figures_here(pte, tok, json.load(sys.stdin), int(new_tokens), int(rounds))))
        sys.exit(0)
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve_main(sys.argv[2:]))
    sys.exit(child_main(sys.argv[1:]))
