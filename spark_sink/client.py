"""HTTP client of the broker's offset-addressed logs, the dead-letter log
and any stream queue (stdlib only: it runs on Spark executors as well as on
the driver).

    GET {url}/api/hutch/dead-letters/{vhost}?start=N&limit=M
    GET {url}/api/hutch/streams/{vhost}/{stream}?start=N&limit=M
    -> {"first_offset": F, "next_offset": X, "records": [{"offset": ..., ...}, ...]}

Offsets below `first_offset` were deleted by retention; `next_offset` is the
offset the next record will get; records come in offset order, with gaps only
where the broker found a damaged record.
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

DEFAULT_URL = "http://127.0.0.1:15672"
PAGE_SIZE = 1000  # records per request (the broker answers at most 10,000)


class DeadLetterLogError(RuntimeError):
    """The broker refused or failed a request; the message says which and why."""


class DeadLetterClient:
    """Reads the dead-letter log of `vhost`, or the stream queue `stream` there."""

    def __init__(self, url: str = DEFAULT_URL, vhost: str = "/", username: str = "guest",
                 password: str = "guest", timeout: float = 30.0, stream: str | None = None) -> None:
        where = urllib.parse.quote(vhost, safe="")
        if stream is None:
            self.endpoint = "%s/api/hutch/dead-letters/%s" % (url.rstrip("/"), where)
        else:
            self.endpoint = "%s/api/hutch/streams/%s/%s" % (url.rstrip("/"), where, urllib.parse.quote(stream, safe=""))
        token = base64.b64encode(("%s:%s" % (username, password)).encode("utf-8")).decode("ascii")
        self._auth = "Basic " + token
        self.timeout = timeout

    def page(self, start: int, limit: int) -> dict:
        request = urllib.request.Request(
            "%s?start=%d&limit=%d" % (self.endpoint, start, limit),
            headers={"Authorization": self._auth, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise DeadLetterLogError("%s: HTTP %d %s" % (self.endpoint, exc.code, detail)) from None
        except urllib.error.URLError as exc:
            raise DeadLetterLogError("%s: %s" % (self.endpoint, exc.reason)) from None

    def bounds(self) -> tuple[int, int]:
        """(first_offset, next_offset) now."""
        answer = self.page(0, 0)
        return answer["first_offset"], answer["next_offset"]

    def records(self, start: int, end: int, page_size: int = PAGE_SIZE) -> Iterator[dict]:
        """Every record with an offset in [start, end), in order. Offsets
        already deleted by retention are skipped, so a range read twice gives
        the same records as long as the broker keeps them."""
        position = start
        while position < end:
            answer = self.page(position, min(page_size, end - position))
            records = [r for r in answer["records"] if r["offset"] < end]
            if not records:
                if answer["first_offset"] > position:
                    position = answer["first_offset"]  # retention got there first
                    continue
                return
            yield from records
            position = records[-1]["offset"] + 1
