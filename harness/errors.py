"""Harness errors: one line that names the problem and the fix."""


class HarnessError(Exception):
    """A problem the user can fix. ``str(err)`` is one line: what is wrong, then what to do."""

    def __init__(self, problem: str, fix: str):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}; {fix}")
