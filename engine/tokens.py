"""The ``max_length`` of a run on the sites' own text: each site counts its own file, the run takes the largest.

With ``max_length=0`` a client counts the tokens a sentence keeps from its training split (the 99th percentile,
rounded up to a multiple of 8: ``client.runtime.chosen_max_length``). On the sites' own data each would count
its own sentences and their models would differ, so such a run fixes ``max_length`` up front (``RunConfig``
refuses 0). ``lorm-sim --count-tokens FILE`` gives a site, before any run, the number its client would
choose; the coordinator takes the largest of the sites' numbers, which keeps at least 99 % of every site's
sentences whole. What a site tells the operator so is one number about its data: the 99th-percentile
sentence's token count, rounded up to a multiple of 8 (its longest, when it reports that too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from client.runtime import chosen_max_length
from client.splits import DatasetError, Splits
from client.text_rows import text_rows
from common.run.config import RunConfig
from common.run.settings import DataSettings


def file_max_length(config: RunConfig, path: str) -> int:
    """What ``max_length=0`` chooses over the sentences of the text file ``path`` (every row, whatever its
    label) under ``config``'s backbone; it logs the file's longest sentence and the model's limit.
    ``DatasetError`` for a file of no sentences, or a backbone that reads no text."""
    if not Path(path).expanduser().is_file():
        raise FileNotFoundError(f"--count-tokens {path}: no such file (a site's .csv or .jsonl of text and label)")
    texts = [text for text, _ in text_rows(Path(path).expanduser(), config.section(DataSettings).label_column)]
    ids = np.zeros(len(texts), dtype=np.int64)
    chosen, lengths = chosen_max_length(config, Splits(texts, ids, [], ids[:0], ["any"]))
    if not lengths:
        raise DatasetError(f"{path}: nothing to count: no sentence, or backbone {config.backbone} reads no text")
    return chosen


def count_tokens(config: RunConfig, paths: list[str], say: Callable[[str], None]) -> int:
    """Say each file's number as it is counted, then the ``max_length`` to give the coordinator: the largest."""
    chosen = []
    for path in paths:
        chosen.append(file_max_length(config, path))
        say(f"{path}: max_length {chosen[-1]}")
    largest = max(chosen)
    say(
        f"the largest: {largest}; start the coordinator with --set max_length={largest} (with backbone "
        f"{config.backbone}: every file keeps at least 99 % of its sentences whole)"
    )
    return largest
