"""The command lines: `guirl` (`main`), `bin/launch_cluster` (`cluster`) and `guirl replay` (`replay`)."""

from guirl.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
