"""Bring-your-own text files read as ``(text, label)`` rows: CSV (RFC 4180 quoting, the delimiter found by the
header) and JSONL, UTF-8 with or without a byte-order mark, and every row that cannot be read a ``DatasetError``
naming the file and line. ``client.text_datasets.textfile`` reads a run's files with ``text_rows``, as do a
client's own data (``client.owned``), the evaluation of an export (``serve.evaluate``) and the engine's tokens.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

from client.splits import DatasetError

LABEL_NAMES = ("label", "intent", "category")  # the label's column (CSV) or key (JSONL), first found


def _label_name(found: list[str], chosen: str, where: str) -> str:
    if chosen:
        if chosen not in found:
            raise DatasetError(f"{where}: the setting data.label_column = {chosen!r} is not among {found}")
        return chosen
    name = next((n for n in LABEL_NAMES if n in found), None)
    if name is None:
        raise DatasetError(
            f"{where}: no label column: expected one of {list(LABEL_NAMES)} (or set data.label_column), got {found}"
        )
    return name


CSV_DELIMITERS = (",", ";", "\t")  # the delimiters a CSV header may use, in the order tried


def _decoded(path: Path) -> str:
    """The whole file as text, UTF-8 with or without a byte-order mark (spreadsheets write one)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(
            f"{path} line {line}: not UTF-8 ({exc.reason} at byte {exc.start}); save the file as UTF-8 "
            '(in a spreadsheet: "CSV UTF-8")'
        ) from exc


def _sample(where: str, text: object, label: object) -> tuple[str, str]:
    """``(text, label)`` of one row, or an error: a row without a text or a label is no sample, and leaving
    it out would drop data without a word."""
    if not isinstance(text, str):
        raise DatasetError(f"{where}: the text must be a string, got {json.dumps(text)}")
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise DatasetError(f"{where}: the label must be a string or an integer, got {json.dumps(label)}")
    if not text.strip():
        raise DatasetError(f"{where}: empty text")
    if not str(label).strip():
        raise DatasetError(f"{where}: empty label")
    return text, str(label)


def _csv_delimiter(text: str, suffix: str) -> str:
    """The delimiter under which the header (the first non-blank line) names a ``text`` column.

    Only the delimiter is looked for; the quoting is RFC 4180's in every file. A dialect sniffed from a
    sample of rows decides ``doublequote`` by the rows that happen to fall in the sample, and with the wrong
    answer every ``""`` inside a quoted field splits it. Without a ``text`` column under any delimiter:
    tab for ``.tsv``, else the one that splits the header most (the error then names those columns).
    """
    header = next((line for line in io.StringIO(text, newline="") if line.strip()), "")
    columns: dict[str, list[str]] = {}
    for delimiter in CSV_DELIMITERS:
        try:
            columns[delimiter] = next(csv.reader([header], csv.excel, delimiter=delimiter, strict=True), [])
        except csv.Error:
            continue
    naming = [d for d in columns if "text" in columns[d]]
    if naming:
        return max(naming, key=lambda d: len(columns[d]))
    if suffix == ".tsv":
        return "\t"
    return max(columns, key=lambda d: len(columns[d]), default=",")


def _csv_error(exc: csv.Error) -> str:
    """What the csv module's error means in a file that is otherwise readable."""
    message = str(exc)
    if "unexpected end of data" in message:
        return f"a quote opened in the row that starts here never closes ({message})"
    if "field larger than field limit" in message:
        return f"a field of over {csv.field_size_limit()} characters starts here: most likely a quote that never closes"
    if "expected after" in message:
        return (
            f'text after a closing quote ({message}): a field that starts with " ends with it, '
            'and a " inside it is written ""'
        )
    return message


def _csv_records(path: Path, text: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` of every record, ``line`` the one it starts on (a quoted field may hold line breaks).

    Blank lines, and rows whose every field is empty (spreadsheets save formatted empty rows so), are no
    records. ``strict``: a quote that never closes, or text after a closing one, is an error here instead of
    a field that silently swallows the rows after it.
    """
    reader = csv.reader(io.StringIO(text, newline=""), csv.excel, delimiter=delimiter, strict=True)
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DatasetError(f"{path} line {start}: {_csv_error(exc)}") from exc
        if any(field.strip() for field in fields):
            yield start, fields


def _csv_rows(path: Path, text: str, label_column: str) -> list[tuple[str, str]]:
    delimiter = _csv_delimiter(text, path.suffix.lower())
    records = _csv_records(path, text, delimiter)
    header = next(records, (0, []))[1]
    if "text" not in header:
        raise DatasetError(f"{path}: a CSV file needs a text column, got {header}")
    label = _label_name(header, label_column, str(path))
    text_at, label_at = header.index("text"), header.index(label)
    rows = []
    for line, fields in records:
        if len(fields) != len(header):
            raise DatasetError(
                f"{path} line {line}: {len(fields)} field{'s' if len(fields) != 1 else ''}, expected "
                f"{len(header)} ({', '.join(header)}); a field that holds {delimiter!r}, a quote or a line "
                'break must be quoted ("..."), with each " inside it written ""'
            )
        rows.append(_sample(f"{path} line {line}", fields[text_at], fields[label_at]))
    return rows


def _jsonl_rows(path: Path, text: str, label_column: str) -> list[tuple[str, str]]:
    rows = []
    # Lines end at \n only: a JSON string may hold U+2028 and other characters that str.splitlines breaks at.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not JSON ({exc.msg}): {line[:80]!r}") from exc
        if not isinstance(item, dict):
            raise DatasetError(f"{where}: expected a JSON object with text and label, got {line[:80]!r}")
        label = _label_name(list(item), label_column, where)
        if "text" not in item:
            raise DatasetError(f"{where}: no text key, got keys {list(item)}")
        rows.append(_sample(where, item["text"], item[label]))
    return rows


def text_rows(path: Path, label_column: str = "") -> list[tuple[str, str]]:
    """``(text, label)`` rows of a CSV or JSONL file, UTF-8 with or without a byte-order mark, in file order.

    CSV (``.csv``, ``.tsv``): a header with ``text`` and a label column (``label``, ``intent`` or
    ``category``, or ``label_column``), other columns ignored; the delimiter (comma, semicolon or tab) is the
    one under which the header names ``text``; quoting is RFC 4180's, as Python's csv module, pandas and
    spreadsheets write it (``"`` around a field that holds a delimiter, a quote or a line break, ``""`` for a
    quote inside it). JSONL (``.jsonl``, ``.ndjson``): one object a line with the same keys. A row that
    cannot be read (a wrong number of fields, a quote that never closes, an empty text or label) is a
    ``DatasetError`` naming the file and the line it starts on; blank lines are skipped.
    """
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return _csv_rows(path, _decoded(path), label_column)
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_rows(path, _decoded(path), label_column)
    raise DatasetError(f'{path}: expected a .csv (columns text,label) or .jsonl file ({{"text": .., "label": ..}})')
