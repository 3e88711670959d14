"""bench/lexical_heads.py: the words' hashed n-gram vectors have length 1 and count each n-gram
once per occurrence, and the joint kernel is the arc-cosine kernel of ``[z, w sqrt(F) h]`` written out densely."""

from __future__ import annotations

import math

import pytest
import torch

from tolerance import assert_close_to_dtype

TEXTS = ["what is my balance", "what is the weather", "set an alarm for me", "is my balance low", "book a table"]


def test_ngram_vectors_count_each_ngram_and_have_length_one(lex):
    h = lex.ngram_counts(["a b a b", "a"], 2).to_dense()
    assert_close_to_dtype(h.norm(dim=1), torch.ones(2, dtype=lex.DTYPE), lex.DTYPE, terms=4)
    # "a b a b": a x2, b x2, "a b" x2, "b a" x1 -> squared counts 4 + 4 + 4 + 1; one bucket each (no collision)
    assert torch.count_nonzero(h[0]) == 4
    assert sorted(round(float(v) ** 2 * 13) for v in h[0][h[0] != 0]) == [1, 4, 4, 4]
    assert torch.count_nonzero(h[1]) == 1


@pytest.mark.parametrize("weight", [0.0, 0.7])
def test_the_joint_kernel_is_the_arccos_kernel_of_the_concatenation(lex, fh, weight, monkeypatch):
    monkeypatch.setattr(lex, "ROWS", 2)  # five rows: chunks of 2, 2 and 1
    z = torch.randn(5, 6, generator=torch.Generator().manual_seed(5), dtype=lex.DTYPE)
    h = lex.ngram_counts(TEXTS, 2)
    joint = lex.Joint(z, h, weight)
    dense = torch.cat([z, weight * math.sqrt(6) * h.to_dense()], 1)
    assert_close_to_dtype(joint.kernel(joint), fh.arccos_kernel(dense, dense), lex.DTYPE, terms=12)
    part = joint.rows(torch.tensor([3, 1]))
    assert_close_to_dtype(part.kernel(joint), fh.arccos_kernel(dense[[3, 1]], dense), lex.DTYPE, terms=12)
