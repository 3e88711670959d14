"""``lorm-predict``: classify sentences or images with an exported model, a line of output each.

Inputs: the arguments after the export; else ``--file FILE`` (one per line; ``-``: standard input); else
standard input. A text model takes sentences, an image model image paths. Each output line is the label,
its probability among the classes learned so far, and the input, tab-separated (``--json``: one JSON object
per line). Inputs are read and classified ``--batch-size`` at a time, so a long stream starts answering at
once; the model runs on a GPU when one is present (``--device``).
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

from serve.model import Classifier, ExportError, add_source_arguments


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
    parser.add_argument("--json", action="store_true", help="one JSON object per line: input, label, score, index")
    args = parser.parse_intermixed_args(argv)  # options may come between the inputs too
    if args.inputs and args.file:
        parser.error("give inputs as arguments or --file, not both")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model = Classifier(args.export, device=args.device, source=args.backbone, weights=args.weights)
    except (ExportError, OSError) as err:
        print(f"lorm-predict: {err}", file=sys.stderr)
        return 2
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


if __name__ == "__main__":
    sys.exit(main())
