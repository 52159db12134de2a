"""Errors the user sees as one line and an exit code (never a traceback)."""


class PlannerError(Exception):
    exit_code = 1


class BadInput(PlannerError):
    """Unknown names, malformed files, impossible fixed degrees: exit 2."""
    exit_code = 2


class NothingFits(PlannerError):
    """No candidate fits in memory: exit 3. Carries the best candidate it saw."""
    exit_code = 3

    def __init__(self, message, best=None):
        super().__init__(message)
        self.best = best
