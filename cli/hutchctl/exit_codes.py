"""Exit statuses: rabbitmqctl's, which are the BSD sysexits values."""

OK = 0
USAGE = 64  # bad arguments, unknown command or option
DATAERR = 65  # input the broker or the tool rejects (no such vhost to delete, unreadable file)
NOUSER = 67  # the named user does not exist
UNAVAILABLE = 69  # broker unreachable, or the operation failed on the broker
SOFTWARE = 70  # the object already exists, or the broker answered something unexpected
TEMPFAIL = 75  # the operation timed out
NOPERM = 77  # the broker refused our credentials, or did not authorise the operation for our user
CONFIG = 78  # the --config file is unreadable or invalid
