"""The one error type the command line shows as a single line instead of a traceback."""


class UserError(Exception):
    """Something the user can fix: the message says what, where, and how."""
