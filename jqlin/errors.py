"""Errors jqlin raises on purpose. Each message names the argument or tensor at fault."""

from __future__ import annotations

__all__ = ["JqlinError", "UnsupportedSpecError", "CheckpointError", "UnknownFormatError"]


class JqlinError(ValueError):
    """Base of every error jqlin raises deliberately."""


class UnsupportedSpecError(JqlinError):
    """No kernel here honours the spec, or a forced kernel cannot honour it."""


class CheckpointError(JqlinError):
    """A checkpoint on disk is malformed, inconsistent or of an unsupported scheme."""


class UnknownFormatError(JqlinError, KeyError):
    """A format name that is not in `jqlin.formats`."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])
