"""The held-out samples' share of a client's Gram is within its whole Gram (``check_share_within_gram``).

A ridge head's features step sends the client's Gram and, with a held-out rule, the held-out samples' share of it; the
fit that chooses lambda uses their difference. An honest client's difference is the Gram of its other samples, positive
semi-definite; an attacker's share that exceeds the whole (in any direction) would make it indefinite. The factors are
built as clients build them (``gram_factor``, ``block_gram_factor``), from rows of which the held-out ones are a subset.
"""

from __future__ import annotations

import pytest
import torch

from common.aggregation.features import check_share_within_gram
from common.aggregation.validate import UpdateRejected
from common.merges.grams import block_gram_factor, gram_factor

F64 = torch.float64


def rows(n: int, d: int, seed: int) -> torch.Tensor:
    """ReLU features of a random projection, as the ridge head's: non-negative, of a common scale."""
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(n, d, generator=g, dtype=F64) * 3.0 + 0.5)


def factors(x: torch.Tensor, held: torch.Tensor, blocks: int, share_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    def factor(part: torch.Tensor, k: int) -> torch.Tensor:
        return gram_factor(part) if k == 1 else block_gram_factor(part, k)

    return factor(x, blocks), factor(x[held], share_blocks)


# (samples, width, blocks, blocks of the share): fewer rows than the width (the QR test) and more (the Cholesky test),
# one block or two, the share in the blocks or whole (the average rule).
SHAPES = [(12, 48, 1, 1), (40, 8, 1, 1), (30, 64, 2, 2), (30, 64, 2, 1), (90, 16, 2, 1)]


@pytest.mark.parametrize("n, d, blocks, share_blocks", SHAPES)
def test_an_honest_share_passes_with_duplicated_and_degenerate_rows(n, d, blocks, share_blocks):
    x = rows(n, d, seed=n + d)
    x[1] = x[0]  # a duplicated sample, held out (index 0) and kept (1): the Gram is rank-deficient there
    x[:, 3] = 0.0  # a feature no sample has: a zero direction of both Grams
    held = torch.arange(n) % 4 == 0
    check_share_within_gram("f", *factors(x, held, blocks, share_blocks))
    # Every sample held out: the difference is zero, up to rounding, and still passes.
    check_share_within_gram("f", *factors(x, torch.ones(n, dtype=torch.bool), blocks, share_blocks))
    # Scaled features (a larger trace): the slack scales with them.
    check_share_within_gram("f", *factors(1e4 * x, held, blocks, share_blocks))


@pytest.mark.parametrize("n, d, blocks, share_blocks", SHAPES)
@pytest.mark.parametrize("attack", ["inflated", "new-direction", "all-held-inflated"])
def test_a_share_beyond_the_whole_gram_is_refused(n, d, blocks, share_blocks, attack):
    x = rows(n, d, seed=n + d)
    held = torch.arange(n) % 4 == 0
    if attack == "all-held-inflated":  # every sample held out, the share 1 % larger: the fit's Gram is -1 % of it
        held = torch.ones(n, dtype=torch.bool)
    whole, share = factors(x, held, blocks, share_blocks)
    if attack == "new-direction":  # a feature no sample has (a zero column of the whole) given a small share
        x[:, 3] = 0.0
        whole, share = factors(x, held, blocks, share_blocks)
        share = share.clone()
        cols = (slice(None), 3) if share.dim() == 2 else (0, slice(None), 3)
        share[cols] = 1e-3 * share.abs().max()
    else:
        share = share * (1.01 if attack == "all-held-inflated" else 1.5)
    with pytest.raises(UpdateRejected, match="exceeds the client's whole Gram") as err:
        check_share_within_gram("stat/holdout_gram_factor", whole, share)
    assert err.value.field == "stat/holdout_gram_factor"


def test_no_held_out_rows_pass():
    x = rows(10, 6, seed=1)
    check_share_within_gram("f", gram_factor(x), torch.zeros(0, 6, dtype=F64))
    check_share_within_gram("f", block_gram_factor(x, 2), torch.zeros(2, 0, 3, dtype=F64))
