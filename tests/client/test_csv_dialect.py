"""Text files read back exactly as Python's csv module, pandas and spreadsheets write them, whatever rows fall
in the first 64 KB; a row that cannot be read is an error naming its file and line, never a dropped sample."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest

from client.datasets import load_dataset
from client.owned import OwnData, load_owned
from client.splits import DatasetError
from client.text_rows import text_rows
from common.run.config import RunConfig

from own_data import owned_config

# Sentences with a quoted phrase and a comma, or a line break: written as Python's csv module, pandas or a
# spreadsheet write them (quotes doubled), a dialect sniffed from them has doublequote=False, which splits each
# at its comma and takes the tail for the label.
SENTENCES = [
    ('the app says "error, try again" when I log in', "tech_support"),
    ('he said "no, thanks", then left', "refuse"),
    ("cancel it, please", "cancel"),
    ('is the "express" option, the one for 9.99, faster?', "shipping"),
    ("first line\nsecond line, after a break", "multiline"),
    ('play "hello, goodbye" by the beatles', "music"),
]
# And the others a guessed dialect may misread: quotes without a comma, apostrophes, a semicolon and a tab
# inside a field, leading spaces, letters beyond ASCII.
ROWS = [
    *SENTENCES,
    ('why is my order still "pending"?', "order_status"),
    ('"quoted" from start to "end"', "quote"),
    ("it's 'fine', isn't it", "smalltalk"),
    ("one; two;\tthree", "list"),
    ("  two leading spaces, kept", "spaces"),
    ("crème brûlée, s'il vous plaît", "dessert"),
    ("a plain sentence", "plain"),
]


def write_csv(path: Path, rows: list[tuple[str, str]], *, bom: bool = False, **dialect: object) -> Path:
    with path.open("w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
        writer = csv.writer(f, **dialect)  # type: ignore[arg-type]
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("columns", [("id", "text", "label"), ("label", "text"), ("text", "label")])
def test_a_file_written_by_pythons_csv_module_reads_back_exactly(tmp_path, columns):
    path = tmp_path / "python.csv"
    with path.open("w", newline="", encoding="utf-8") as f:  # csv.excel: "" inside quotes, \r\n line ends
        writer = csv.writer(f)
        writer.writerow(columns)
        for i, (text, label) in enumerate(SENTENCES):
            writer.writerow([{"id": i, "text": text, "label": label}[name] for name in columns])
    assert text_rows(path) == SENTENCES


@pytest.mark.parametrize("name, delimiter", [("semicolons.csv", ";"), ("tabs.csv", "\t"), ("tabs.tsv", "\t")])
def test_the_delimiter_is_the_headers(tmp_path, name, delimiter):
    assert text_rows(write_csv(tmp_path / name, ROWS, delimiter=delimiter)) == ROWS


def test_a_file_written_as_pandas_to_csv_writes_it_reads_back_exactly(tmp_path):
    path = tmp_path / "pandas.csv"
    with path.open("w", newline="", encoding="utf-8") as f:  # DataFrame.to_csv(path): its index first, "" header
        writer = csv.writer(f, quoting=csv.QUOTE_MINIMAL, doublequote=True, lineterminator="\n")
        writer.writerow(["", "text", "label"])
        writer.writerows([i, text, label] for i, (text, label) in enumerate(SENTENCES))
    assert text_rows(path) == SENTENCES


def test_a_spreadsheet_export_reads_back_exactly(tmp_path):
    """Saved as "CSV UTF-8" where the decimal mark is a comma: a byte-order mark, semicolons, CRLF line ends,
    a line break inside a cell kept as LF, every text cell quoted and the others not."""
    path = write_csv(tmp_path / "export.csv", ROWS, bom=True, delimiter=";", lineterminator="\r\n")
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbftext;label\r\n") and b"line\nsecond" in raw
    assert text_rows(path) == ROWS
    every_text_quoted = tmp_path / "quoted.csv"
    write_csv(every_text_quoted, ROWS, bom=True, delimiter=";", lineterminator="\r\n", quoting=csv.QUOTE_NONNUMERIC)
    assert text_rows(every_text_quoted) == ROWS


def test_quoted_rows_only_after_the_first_64_kb_read_exactly(tmp_path):
    plain = [(f"plain sentence number {i}", f"plain{i % 3}") for i in range(2500)]  # about 80 KB, no quotes
    path = write_csv(tmp_path / "late.csv", plain + ROWS)
    assert path.stat().st_size > 64 * 1024 + 1000
    assert text_rows(path) == plain + ROWS


def test_jsonl_reads_back_exactly_with_any_character_inside_a_string(tmp_path):
    rows = [*ROWS, ("a line separator \u2028 and a paragraph separator \u2029 inside", "separators")]
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps({"text": t, "label": c}, ensure_ascii=False) for t, c in rows]
    path.write_bytes(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8-sig"))
    assert text_rows(path) == rows


@pytest.mark.parametrize(
    "content, line, match",
    [
        ("text,label\nhi,greet\nhello, there,greet\n", 3, r"3 fields, expected 2 \(text, label\)"),
        ("text,label\nhi,greet\nno label here\n", 3, r"1 field, expected 2 \(text, label\)"),
        ('text,label\nhi,greet\n"hello, there,greet\nbye,leave\n', 3, "quote"),
        ('text,label\n"hello" there,greet\n', 2, "quote"),
        ("text,label\nhi,greet\n,greet\n", 3, "empty text"),
        ("text,label\nhi,greet\nhello,\n", 3, "empty label"),
        ("text,label\nhi,greet\n   ,greet\n", 3, "empty text"),
        ('text,label\n"two\nlines",x\n\nbad,row,here\n', 5, "3 fields"),  # counted in lines of the file
        ("text;label\r\nhi;greet\r\nhello;there;greet\r\n", 3, "3 fields"),
    ],
)
def test_a_row_that_cannot_be_read_is_an_error_naming_its_file_and_line(tmp_path, content, line, match):
    path = tmp_path / "bad.csv"
    path.write_bytes(content.encode())
    with pytest.raises(DatasetError, match=match) as err:
        text_rows(path)
    assert str(err.value).startswith(f"{path} line {line}: ")


def test_a_quote_that_never_closes_in_a_large_file_names_the_line_it_opens_on(tmp_path):
    plain = "".join(f"plain sentence number {i},plain\n" for i in range(5000))  # 160 KB: past csv's field limit
    path = tmp_path / "big.csv"
    path.write_text('text,label\nhi,greet\n"an unclosed quote, here,greet\n' + plain)
    with pytest.raises(DatasetError, match=f"{path} line 3: .*a quote that never closes"):
        text_rows(path)


def test_labels_of_the_test_file_in_no_class_are_named_five_and_counted(tmp_path):
    train = write_csv(tmp_path / "train.csv", [("hi", "greet"), ("bye", "leave")])
    test = write_csv(tmp_path / "test.csv", [(f"text {k}", f"other{k}") for k in range(8)])
    config = RunConfig(
        dataset="textfile", num_tasks=1, settings={"data": {"train_file": str(train), "test_file": str(test)}}
    )
    with pytest.raises(DatasetError, match=r"unknown labels \['other0', .*'other4'\] and 3 more \(not among"):
        load_dataset(config)


@pytest.mark.parametrize(
    "item, match",
    [
        ({"text": "", "label": "greet"}, "empty text"),
        ({"text": "hi", "label": ""}, "empty label"),
        ({"text": None, "label": "greet"}, "text"),
        ({"text": "hi", "label": None}, "label"),
        ({"text": "hi"}, "no label"),
        (["hi", "greet"], "JSON object"),
    ],
)
def test_a_jsonl_line_that_cannot_be_read_is_an_error_naming_its_line(tmp_path, item, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "hi", "label": "greet"}) + "\n\n" + json.dumps(item) + "\n")
    with pytest.raises(DatasetError, match=match) as err:
        text_rows(path)
    assert str(err.value).startswith(f"{path} line 3: ")


def test_an_unreadable_encoding_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\nhi,greet\ncrème,dessert\n".encode("latin-1"))
    with pytest.raises(DatasetError, match=r"latin1\.csv line 3: not UTF-8"):
        text_rows(path)


def test_a_file_of_only_a_header_has_no_rows_and_trailing_blank_lines_are_no_rows(tmp_path):
    assert text_rows(write_csv(tmp_path / "empty.csv", [])) == []
    (tmp_path / "blank.csv").write_text("text,label\nhi,greet\n\n\n")
    assert text_rows(tmp_path / "blank.csv") == [("hi", "greet")]


def test_own_data_with_quoted_sentences_loses_no_row_and_reports_no_fragment_as_a_label(tmp_path, caplog):
    """The user's case: a client's file of sentences with quoted phrases and commas, saved by pandas (its index
    first); every row trains, and no tail of a sentence is reported as a label in no task."""
    rows = [
        ('set an alarm "for work, early" at 7', "alarm"),
        ('what is my "savings, checking" balance', "balance"),
        ('say "hello, friend" to me', "greeting"),
        ('play "the long way round, live" loudly', "music"),
    ] * 3
    path = tmp_path / "client.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["", "text", "label"])
        writer.writerows([i, text, label] for i, (text, label) in enumerate(rows))
    with caplog.at_level(logging.WARNING, logger="lorm.client"):
        splits = load_owned(owned_config(), [["alarm", "balance"], ["greeting", "music"]], OwnData(str(path)))
    assert [r.getMessage() for r in caplog.records] == []
    assert splits.train_x == [text for text, _ in rows]
    assert splits.train_y.tolist() == [0, 1, 2, 3] * 3
