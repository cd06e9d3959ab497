"""The ``harness`` command: argument guards and subcommands."""
