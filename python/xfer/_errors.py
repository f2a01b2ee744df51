"""The exceptions xfer raises: one class per engine status code, under XferError.

Each also derives from the builtin exception a Python user would catch for that kind of failure
(TimeoutError for TIMEOUT, ConnectionError for CONNECTION_LOST, ValueError for bad input...).
"""

import builtins


class XferError(Exception):
    """An engine call failed. .code is the status code's name (e.g. "TIMEOUT"), .message the
    engine's reason; .landed, for a failed transfer, the indices of the descriptors that landed
    whole (WRITE: in the peer's memory; READ: in local memory)."""

    code = "INTERNAL"

    def __init__(self, message="", code=None, landed=()):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.landed = list(landed)

    def __str__(self):
        return f"{self.code}: {self.message}" if self.message else self.code


XferError.__module__ = "xfer"


def _error(name, code, *bases, doc):
    return type(name, (XferError, *bases), {"code": code, "__doc__": doc, "__module__": "xfer"})


InvalidArgumentError = _error("InvalidArgumentError", "INVALID_ARGUMENT", ValueError,
                              doc="Bad input: a null or unknown handle, a zero length, a bad name.")
TimeoutError = _error("TimeoutError", "TIMEOUT", builtins.TimeoutError,
                      doc="A deadline passed.")
NotConnectedError = _error("NotConnectedError", "NOT_CONNECTED", ConnectionError,
                           doc="No session to that peer (connect() first, or auto_connect=True).")
AlreadyConnectedError = _error("AlreadyConnectedError", "ALREADY_CONNECTED",
                               doc="connect() to a peer that already has a session.")
UnsupportedError = _error("UnsupportedError", "UNSUPPORTED",
                          doc="The build, the machine or the peer cannot do this.")
ResourceExhaustedError = _error("ResourceExhaustedError", "RESOURCE_EXHAUSTED",
                                doc="Out of memory, file descriptors, request slots, or the "
                                    "peer's notification queue is full.")
RemoteAccessDeniedError = _error("RemoteAccessDeniedError", "REMOTE_ACCESS_DENIED", PermissionError,
                                 doc="The remote range is not inside one of the peer's regions.")
ConnectionLostError = _error("ConnectionLostError", "CONNECTION_LOST", ConnectionError,
                             doc="The peer died, hung, restarted or said goodbye.")
CanceledError = _error("CanceledError", "CANCELED",
                       doc="The request was canceled, or the engine closed under it.")
InternalError = _error("InternalError", "INTERNAL",
                       doc="A bug or an unexpected system error; the message says which.")
DataCorruptedError = _error("DataCorruptedError", "DATA_CORRUPTED",
                            doc="The bytes were damaged: a descriptor's end-to-end checksum did "
                                "not match where it landed (checksum=True; the message names "
                                "it, .landed leaves it out), or a tcp batch's checksum did not "
                                "match twice (tcp_checksum=True).")

BY_CODE = {cls.code: cls for cls in (
    InvalidArgumentError, TimeoutError, NotConnectedError, AlreadyConnectedError,
    UnsupportedError, ResourceExhaustedError, RemoteAccessDeniedError, ConnectionLostError,
    CanceledError, InternalError, DataCorruptedError)}
