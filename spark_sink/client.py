"""HTTP client of the broker's offset-addressed logs, the dead-letter log
and any stream queue (stdlib only: it runs on Spark executors as well as on
the driver).

    GET {url}/api/hutch/dead-letters/{vhost}?start=N&limit=M
    GET {url}/api/hutch/streams/{vhost}/{stream}?start=N&limit=M
    -> {"first_offset": F, "next_offset": X, "records": [{"offset": ..., ...}, ...]}
    GET {url}/api/hutch/streams/{vhost}/{stream}?start=N&limit=M&format=arrow
    -> an Arrow IPC stream of one record batch (PyArrow needed on both ends)

Offsets below `first_offset` were deleted by retention; `next_offset` is the
offset the next record will get; records come in offset order, with gaps only
where the broker found a damaged record.
"""
from __future__ import annotations

import base64
import bisect
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator

DEFAULT_URL = "http://127.0.0.1:15672"
PAGE_SIZE = 1000  # records per request (the broker answers at most 10,000)
ARROW = "application/vnd.apache.arrow.stream"


class DeadLetterLogError(RuntimeError):
    """The broker refused or failed a request; the message says which and why."""


class ArrowRefused(DeadLetterLogError):
    """The broker does not serve format=arrow (no PyArrow there): HTTP 406."""


class DataLossError(DeadLetterLogError):
    """Records a read needed were deleted by retention before it got to them
    (raised when the failOnDataLoss option is true, its default)."""


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

    def _get(self, start: int, limit: int, form: str = "json"):
        """The open response to one page request (DeadLetterLogError when refused)."""
        query = "?start=%d&limit=%d" % (start, limit) + ("&format=arrow" if form == "arrow" else "")
        request = urllib.request.Request(self.endpoint + query, headers={
            "Authorization": self._auth, "Accept": ARROW if form == "arrow" else "application/json"})
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            refused = ArrowRefused if form == "arrow" and exc.code == 406 else DeadLetterLogError
            raise refused("%s: HTTP %d %s" % (self.endpoint, exc.code, detail)) from None
        except urllib.error.URLError as exc:
            raise DeadLetterLogError("%s: %s" % (self.endpoint, exc.reason)) from None

    def page(self, start: int, limit: int) -> dict:
        with self._get(start, limit) as response:
            return json.load(response)

    def arrow_page(self, start: int, limit: int):
        """(first_offset, next_offset, pyarrow.RecordBatch) of a stream's
        records from `start` (the broker's format=arrow)."""
        import pyarrow  # only where Arrow is asked for: the client is stdlib otherwise

        with self._get(start, limit, "arrow") as response:
            bounds = int(response.headers["X-Hutch-First-Offset"]), int(response.headers["X-Hutch-Next-Offset"])
            table = pyarrow.ipc.open_stream(response.read()).read_all()
        batch = table.combine_chunks().to_batches()
        return bounds[0], bounds[1], batch[0] if batch else pyarrow.RecordBatch.from_pylist([], schema=table.schema)

    def bounds(self) -> tuple[int, int]:
        """(first_offset, next_offset) now."""
        answer = self.page(0, 0)
        return answer["first_offset"], answer["next_offset"]

    def records(self, start: int, end: int, page_size: int = PAGE_SIZE,
                lost: Callable[[int, int, int], None] | None = None) -> Iterator[dict]:
        """Every record with an offset in [start, end), in order, as JSON
        objects. Offsets deleted by retention before they were read are
        reported to `lost(first lost, end of the loss, first offset kept)`
        (which may raise) and then skipped; a range read twice gives the same
        records as long as the broker keeps them."""
        def fetch(position: int, limit: int):
            answer = self.page(position, limit)
            return answer["first_offset"], [r["offset"] for r in answer["records"]], answer["records"]
        for records, keep in _pages(start, end, page_size, lost, fetch):
            yield from records[:keep]

    def arrow_batches(self, start: int, end: int, page_size: int = PAGE_SIZE,
                      lost: Callable[[int, int, int], None] | None = None) -> Iterator:
        """As `records`, a stream's records as pyarrow.RecordBatch pages."""
        def fetch(position: int, limit: int):
            first, _next, batch = self.arrow_page(position, limit)
            return first, batch.column("offset").to_pylist(), batch
        for batch, keep in _pages(start, end, page_size, lost, fetch):
            yield batch.slice(0, keep)


def _pages(start: int, end: int, page_size: int, lost, fetch) -> Iterator[tuple[object, int]]:
    """(page, how many of its records are below `end`) for the pages that
    `fetch(position, limit) -> (first_offset, offsets, page)` gives from
    `start` to `end`, reporting what retention deleted to `lost`."""
    position = start
    while position < end:
        first, offsets, page = fetch(position, min(page_size, end - position))
        # Offsets from `position` up to the first kept are gone, unless this
        # page holds them (first_offset is taken after the read).
        gone = min(first, end, offsets[0] if offsets else end)
        if gone > position and lost is not None:
            lost(position, gone, first)
        keep = bisect.bisect_left(offsets, end)
        if not keep:
            if first > position:
                position = first
                continue
            return
        yield page, keep
        position = offsets[keep - 1] + 1
