"""rabbitmqctl 3.10's output formats: table (tab-separated), json and csv.

Two shapes of result exist in rabbitmqctl and each prints differently when
empty: an info-item stream (list_queues, list_exchanges, ...: nothing at all
when empty, JSON `[` and `]` on lines of their own) and a list of maps
(list_policies, list_permissions, ...: an empty line when empty, JSON `[]`).
The banner ("Listing queues for vhost / ...") is printed only by the table
formatter and not with -q; -s also drops the header row.
"""
from __future__ import annotations

import json
import sys

from cli.hutchctl.terms import json_value, text

FORMATTERS = ("table", "json", "csv")


class Output:
    __slots__ = ("formatter", "quiet", "headers", "stream")

    def __init__(self, formatter: str = "table", quiet: bool = False, headers: bool = True, stream=None):
        self.formatter = formatter
        self.quiet = quiet
        self.headers = headers
        self.stream = stream if stream is not None else sys.stdout

    def banner(self, line: str) -> None:
        """An informational line, shown only in table format without -q."""
        if self.formatter == "table" and not self.quiet:
            self.line(line)

    def message(self, line: str) -> None:
        """An informational message after a change (add_user's "Done. ..."), not shown with -q;
        a command's result ("Trace enabled ...") goes through `line`."""
        if not self.quiet:
            self.line(line)

    def line(self, line: str) -> None:
        self.stream.write(line + "\n")

    def raw(self, data: str) -> None:
        self.stream.write(data)

    def info_items(self, columns: list[str], rows: list[list]) -> None:
        """An info-item stream: `rows` are lists of values in `columns` order."""
        if self.formatter == "json":
            self._json_rows(columns, rows)
        elif rows:
            self._text_rows(columns, rows)

    def maps(self, columns: list[str], rows: list[list]) -> None:
        """A list of maps: like `info_items`, but an empty list still prints."""
        if rows:
            self.info_items(columns, rows)
        elif self.formatter == "json":
            self.line("[]")
        elif self.formatter == "table":
            self.line("")

    def _json_rows(self, columns: list[str], rows: list[list]) -> None:
        self.line("[")
        for index, row in enumerate(rows):
            record = {column: json_value(value) for column, value in zip(columns, row)}
            self.line(("," if index else "") + json.dumps(record, ensure_ascii=False, separators=(",", ":")))
        self.line("]")

    def _text_rows(self, columns: list[str], rows: list[list]) -> None:
        if self.formatter == "csv":
            render = _csv_line
        else:
            render = "\t".join
        if self.headers:
            self.line(render(columns))
        for row in rows:
            self.line(render([text(value) for value in row]))


def _csv_line(cells: list[str]) -> str:
    return ",".join('"' + cell.replace('"', '""') + '"' for cell in cells)
