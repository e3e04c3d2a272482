"""Where a job's result goes: a table in the terminal, Parquet, CSV, or
(for the report) an HTML file."""
from __future__ import annotations

import datetime
import os

from pyspark.sql import DataFrame

FORMATS = ("table", "parquet", "csv", "html")


def text_table(columns: list[str], rows: list[tuple], max_width: int = 40) -> str:
    """Rows as an aligned plain-text table (numbers right-aligned)."""
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in rows if row[i] is not None)
               and bool(rows) for i in range(len(columns))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    out.append("(%d row%s)" % (len(rows), "" if len(rows) == 1 else "s"))
    return "\n".join(out)


def _cell(value: object, max_width: int) -> str:
    if value is None:
        text = ""
    elif isinstance(value, datetime.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    elif isinstance(value, float):
        text = "%.2f" % value
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", "replace")
    else:
        text = str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= max_width else text[:max_width - 1] + "\u2026"


def write(df: DataFrame, fmt: str, path: str | None) -> str:
    """Write a result; returns what to print (the table, or where it went)."""
    if fmt == "table":
        rows = [tuple(r) for r in df.collect()]
        return text_table(df.columns, rows)
    if not path:
        raise ValueError("--output is needed for --format %s" % fmt)
    if fmt == "parquet":
        df.write.mode("overwrite").parquet(path)
    elif fmt == "csv":
        df.coalesce(1).write.mode("overwrite").option("header", True).csv(path)
    else:
        raise ValueError("unknown format %r (one of %s)" % (fmt, ", ".join(FORMATS)))
    return "wrote %s to %s" % (fmt, os.path.abspath(path))
