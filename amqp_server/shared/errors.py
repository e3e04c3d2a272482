"""Why the process cannot start, for cli.server to report (exit status 1)."""


class ListenError(Exception):
    """The broker cannot start: a listener could not be opened (port in use,
    bad address, TLS files), the data directory could not be created or its
    definitions store opened, or uvloop was asked for and is not installed."""
