"""The one exception type users see: a one-line message naming the problem and the fix."""


class SpecError(Exception):
    """Bad input or an impossible request; the CLI prints it on one line and exits non-zero."""
