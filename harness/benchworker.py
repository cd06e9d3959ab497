"""``python -m harness.benchworker RUNTIME ARTIFACT THREADS PROMPT_JSON NEW_TOKENS``: load one
runtime in a fresh process, generate once, print load time and memory as one JSON line."""

import sys

from harness.benchrun import child_main

if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
