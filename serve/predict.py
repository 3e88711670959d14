"""``lorm-predict``: classify sentences or images with an exported model, a line of output each.

Inputs: the arguments after the export; else ``--file FILE`` (one per line; ``-``: standard input); else
standard input. A text model takes sentences, an image model image paths. Each output line is the label,
its probability among the classes learned so far, and the input, tab-separated (``--json``: one JSON object
per line). Inputs are read and classified ``--batch-size`` at a time, so a long stream starts answering at
once; the model runs on a GPU when one is present (``--device``).

``--eval FILE`` scores a labelled file instead (a CSV or JSONL of text and label, or a folder of class-named image
folders, as ``lorm-client --data`` reads them): accuracy per learned task and overall, the most frequent errors, and
the samples no prediction can get right, counted apart (``serve/evaluate.py``; ``--json``: one object).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TextIO

import torch

from client.splits import DatasetError
from serve.evaluate import Labelled, evaluate, format_text, read_labelled, summary
from serve.model import Classifier, ExportError, add_source_arguments

DEFAULT_TOP = 10  # --eval: the most frequent errors shown


def batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def _lines(stream: TextIO) -> Iterator[str]:
    for line in stream:
        text = line.rstrip("\r\n")
        if text.strip():
            yield text


def inputs(args: argparse.Namespace) -> Iterator[str]:
    if args.inputs:
        yield from args.inputs
    elif args.file and args.file != "-":
        with open(args.file, encoding="utf-8-sig") as f:
            yield from _lines(f)
    else:
        yield from _lines(sys.stdin)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lorm-predict",
        description="Classify sentences (or image paths) with a run's exported model (its results/ directory).",
    )
    parser.add_argument("export", type=Path, help="the export: a run's results/ directory, with model.json")
    parser.add_argument("inputs", nargs="*", help="sentences (or image paths); none: --file or standard input")
    parser.add_argument("--file", help="one input per line ('-': standard input)")
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per forward pass (default 32)")
    parser.add_argument("--device", default="auto", help="auto (a GPU when present), cpu, cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    add_source_arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per line: input, label, score, index (--eval: one object)"
    )
    parser.add_argument(
        "--eval",
        type=Path,
        metavar="FILE",
        help="score a labelled file instead: a .csv/.tsv/.jsonl/.ndjson of text and label, or a folder of class-named "
        "image folders, read as lorm-client --data reads them; prints accuracy per task and overall, the most "
        "frequent errors and the samples whose labels the model cannot predict (counted apart)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=None,
        help=f"with --eval: the (true, predicted) errors shown, most frequent first ({DEFAULT_TOP})",
    )
    parser.add_argument(
        "--label-column",
        default=None,
        metavar="NAME",
        help="with --eval: the label's CSV column or JSONL key (default: label, intent or category, the first found)",
    )
    args = parser.parse_intermixed_args(argv)  # options may come between the inputs too
    if args.inputs and args.file:
        parser.error("give inputs as arguments or --file, not both")
    if args.eval is None and (args.top is not None or args.label_column is not None):
        parser.error("--top and --label-column go with --eval FILE")
    if args.eval is not None and (args.inputs or args.file):
        parser.error("--eval FILE scores that file: give no inputs or --file with it")
    if args.top is not None and args.top < 0:
        parser.error(f"--top must be >= 0, got {args.top}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads:
        torch.set_num_threads(args.threads)
    labelled = None
    if args.eval is not None:  # read before the model is built, so that a bad row is named at once
        try:
            labelled = read_labelled(args.eval, args.label_column or "")
        except (DatasetError, OSError) as err:
            print(f"lorm-predict: {err}", file=sys.stderr)
            return 2
    try:
        model = Classifier(args.export, device=args.device, source=args.backbone, weights=args.weights)
    except (ExportError, OSError) as err:
        print(f"lorm-predict: {err}", file=sys.stderr)
        return 2
    if labelled is not None:
        return score(model, labelled, args)
    try:
        for chunk in batches(inputs(args), args.batch_size):
            for text, p in zip(chunk, model.predict(chunk)):
                if args.json:
                    print(json.dumps({"input": text, "label": p.label, "score": p.score, "index": p.index}))
                else:
                    print(f"{p.label}\t{p.score:.4f}\t{text}")
            sys.stdout.flush()
    except (OSError, TypeError, ValueError) as err:  # an unreadable image, a sentence for an image model
        print(f"lorm-predict: {err}", file=sys.stderr)
        return 1
    return 0


def score(model: Classifier, labelled: Labelled, args: argparse.Namespace) -> int:
    """``--eval``: print ``labelled``'s figures; 2 when the file cannot be scored (samples of another kind than the
    model reads, an image that does not decode)."""
    if labelled.kind != model.kind:
        wanted = "a folder of class-named image folders" if model.kind == "image" else "a .csv or .jsonl file"
        print(
            f"lorm-predict: {labelled.path} holds {labelled.kind} samples, and {args.export} classifies "
            f"{model.kind} samples: give it {wanted}",
            file=sys.stderr,
        )
        return 2
    top = DEFAULT_TOP if args.top is None else args.top
    try:
        figures = summary(evaluate(model, labelled, args.batch_size), model.card, args.export, labelled, top)
    except (OSError, ValueError) as err:  # an image that does not decode
        print(f"lorm-predict: {labelled.path}: {err}", file=sys.stderr)
        return 2
    print(json.dumps(figures) if args.json else format_text(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
