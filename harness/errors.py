"""The one exception type for mistakes a user can fix.

Anything raised as a UsageError reaches the user as a single line ``gembench: error: ...``
and exit status 2, with no traceback. The message must name the file, field, flag or rank at
fault and say what to do.
"""


class UsageError(Exception):
    """A mistake in the user's input: bad flag, bad config, unwritable path, too-large model."""

    exit_code = 2
