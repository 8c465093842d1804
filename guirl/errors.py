"""Errors shared across packages."""


class InputError(ValueError):
    """Bad input a person gave (a task file, a solution file): the message names the file and the field."""


class RunError(RuntimeError):
    """A run could not finish: an actor did not start or kept crashing, every env worker ended early."""
