"""Exceptions of gradsnap: one class per status code of the client library.

Every error a gradsnap call reports is a :class:`gradsnap.Error` whose ``code`` is the status
code's name (``"DATA_LOSS"``, ``"NOT_FOUND"``, ...) and whose message is the library's one-line
message. Bad Python arguments (wrong types, a closed client) raise ``TypeError`` or
``ValueError`` instead, before any I/O.
"""


class Error(Exception):
    """A gradsnap call failed; ``code`` names the status code (client.h, ERRORS)."""

    def __init__(self, message: str, code: str = "UNKNOWN"):
        super().__init__(message)
        self.code = code


class InvalidArgument(Error, ValueError):
    """A bad name, size, dtype, shape or option (INVALID_ARGUMENT)."""


class NotFound(Error, LookupError):
    """Unknown job, step, rank or tensor (NOT_FOUND)."""


class AlreadyExists(Error):
    """A checkpoint or shard exists with a different spec (ALREADY_EXISTS)."""


class FailedPrecondition(Error):
    """The checkpoint is in the wrong state, or the directory is open elsewhere."""


class DataLoss(Error):
    """A checksum or SHA-256 mismatch: the stored bytes are damaged (DATA_LOSS)."""


class ResourceExhausted(Error):
    """Out of disk, or the server's memory limit (RESOURCE_EXHAUSTED)."""


class Unauthenticated(Error):
    """No token, or a wrong one (UNAUTHENTICATED)."""


class PermissionDenied(Error):
    """A token for another job (PERMISSION_DENIED)."""


class Unavailable(Error):
    """A node does not answer, or the shard is being saved by another call (UNAVAILABLE)."""


class Aborted(Error):
    """A shard of the checkpoint is still being written (ABORTED)."""


class OutOfRange(Error):
    """A ranged read past the shard's payload (OUT_OF_RANGE)."""


class DeadlineExceeded(Error):
    """A call ran past its deadline (DEADLINE_EXCEEDED)."""


class Unimplemented(Error, NotImplementedError):
    """The operation is not built (UNIMPLEMENTED)."""


class Internal(Error):
    """An internal error (INTERNAL)."""


class Cancelled(Error):
    """The call was cancelled (CANCELLED)."""


_BY_CODE = {
    "INVALID_ARGUMENT": InvalidArgument,
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "FAILED_PRECONDITION": FailedPrecondition,
    "DATA_LOSS": DataLoss,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
    "UNAVAILABLE": Unavailable,
    "ABORTED": Aborted,
    "OUT_OF_RANGE": OutOfRange,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "UNIMPLEMENTED": Unimplemented,
    "INTERNAL": Internal,
    "CANCELLED": Cancelled,
}


def error_class(code: str) -> type:
    """The exception class of a status code's name; :class:`Error` for any other."""
    return _BY_CODE.get(code, Error)
