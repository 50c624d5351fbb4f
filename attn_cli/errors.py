"""The error type the command line shows as a single line instead of a traceback."""


class UserError(Exception):
    """Something the user can fix: the message says what, where, and how. The library's own such
    errors (DataError, TokenizerError, CheckpointError, TrainingDiverged) subclass it, so that the
    command line catches them all without importing the modules, torch among them, that raise them."""
