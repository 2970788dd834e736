"""Errors meant for users: the message names the file/key/row and the fix."""


class UserError(ValueError):
    """Bad input or configuration. The CLI prints the message on one line and exits 1."""
