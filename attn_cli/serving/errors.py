"""What a server answers when it refuses a request."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the server refuses: the message names the field at fault and how to fix it, and
    `status` is the HTTP status it is answered with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
