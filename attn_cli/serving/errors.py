"""What a server answers when it refuses a request."""

from __future__ import annotations


def json_kind(value: object) -> str:
    """What a JSON value is, in JSON's words (a client sent JSON, not Python): "an array", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


class RequestError(ValueError):
    """A request the server refuses: the message names the field at fault and how to fix it, and
    `status` is the HTTP status it is answered with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
