"""``python -m harness.bench.worker PTE TOKENIZER_JSON NEW_TOKENS ROUNDS`` with a JSON list of texts on
stdin: ExecuTorch's C++ LLM runner's own figures (harness.bench.suite.runner_figures_here) as one JSON
line, in a process of its own. (Every other runtime is isolated by harness.runtimes.process.)"""

import json
import sys

from harness.bench.suite import runner_figures_here

if __name__ == "__main__":
    if len(sys.argv) != 5:
        print("usage: python -m harness.bench.worker PTE TOKENIZER_JSON NEW_TOKENS ROUNDS < texts.json", file=sys.stderr)
        sys.exit(2)
    pte, tok, new_tokens, rounds = sys.argv[1:]
    print(json.dumps(runner_figures_here(pte, tok, json.load(sys.stdin), int(new_tokens), int(rounds))))
