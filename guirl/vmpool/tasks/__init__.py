"""OSWorld tasks: loading and checking task files, running their setup, and scoring them with
getters and metrics (semantics in docs/osworld-compat.md)."""
