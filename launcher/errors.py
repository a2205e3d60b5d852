"""Errors that map to the CLI's exit codes.

Every failure a user can cause or meet is one of these, so that the CLI prints one clear
paragraph and exits with the documented code instead of a traceback.
"""

from __future__ import annotations


class ReproduceError(Exception):
    """Base: a failure with a user-facing message and an exit code."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} {self.hint}"


class BadInput(ReproduceError):
    """Usage errors, invalid recipes or profiles, missing files: exit 2, nothing started."""

    exit_code = 2


class InfraError(ReproduceError):
    """Provisioning, connection or node failures: exit 3."""

    exit_code = 3


class CheckFailed(ReproduceError):
    """The run happened but a check or the verdict failed (regression, failed preflight): exit 1."""

    exit_code = 1


class Interrupted(ReproduceError):
    """The user pressed Ctrl-C or the launcher got SIGTERM: exit 130."""

    exit_code = 130


class Cancelled(Interrupted):  # noqa: N818 - named for what happened, as Interrupted is
    """The run was cancelled from outside the process that follows it (`reproduce cancel`):
    exit 130 as an interrupt, but nobody interrupted this process, so a nightly goes on with
    its next recipe."""


class Detached(Interrupted):  # noqa: N818 - named for what happened, as Interrupted is
    """After Ctrl-C the person chose to detach: the run goes on on its node. What they asked
    for, so not an error: exit 0, and the message says how to follow, take back or stop it."""

    exit_code = 0
