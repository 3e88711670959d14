"""Secure aggregation, the coordinator's verdicts on one step's unmask answers: whose share, box or deal was wrong.

:func:`rebuild` rebuilds a client's secret from shares its dealer committed to, and blames the dealer when
the secret fails its commitment. :class:`Verdicts`, a part of
:class:`~common.secagg.server_session.ServerSession` (which holds the fields it reads), names the answerers
that revealed another share than they were dealt, judges each complaint from the pair's two boxes
(``boxes.py``), and in the signed mode rebuilds a secret from its owner's signed shares alone, with a proof
against a dealer that dealt wrong (``blame.py``). No rule here blames an honest client.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from common.secagg.blame import blame_proof, check_entry, rebuilt_at, share_kind
from common.secagg.boxes import is_complaint, open_with, subkey
from common.secagg.primitives import SecAggError, combine
from common.secagg.rounds import (
    BOX_HEADER_BYTES,
    COMPLAINT,
    TAG_BYTES,
    Check,
    Culprits,
    Keys,
    share_commitment,
)


class Verdicts:
    """The judgments of :class:`~common.secagg.server_session.ServerSession` on its unmask answers (these
    fields are the session's)."""

    threshold: int
    context: bytes
    roster: dict[int, Keys] | None
    boxes: dict[int, dict[int, bytes]]
    revealed: dict[int, dict[int, bytes]]
    check: Check | None

    def _rebuild_signed(
        self,
        owner: int,
        answers: dict[int, bytes],
        survivors: list[int],
        check: Callable[[bytes], bool],
        what: str,
        positions: list[int],
    ) -> bytes:
        """Signed mode: ``owner``'s secret from the answers' shares, as in the honest mode (each share checked on
        arrival at the x-coordinate of its recipient's place, which the dealer signed: the same Lagrange
        coefficients for every owner). A secret that fails ``check`` is rebuilt again from ``threshold`` shares
        under the owner's signature alone: if that one passes, the owner's own answer was wrong and it is the
        secret; if not, :class:`Culprits` names the owner with the proof (:func:`blame_proof`), or without one when
        fewer than ``threshold`` other clients answered."""
        assert self.roster is not None
        _, size, _ = share_kind(owner, survivors)
        pieces = {a: [e[k : k + 16] for k in range(0, size, 16)] for a, e in answers.items()}
        try:
            return rebuild(pieces, positions, self.threshold, check, owner, what)
        except Culprits:
            pass  # the proof's path below: the owner's own answer may be the wrong share
        why = f"dealt shares of its {what} that rebuild to another value than it committed to"
        cert = self.roster[owner].certificate
        dealt: dict[int, tuple[bytes, int]] = {}
        for a, e in sorted(answers.items()):  # the proof's shares: each under the owner's signature, checked here
            if a != owner and len(dealt) < self.threshold:
                try:
                    dealt[a] = check_entry(self.check, cert, owner, a, e, survivors, self.context)
                except SecAggError:
                    continue  # a box its owner did not sign, which a dishonest recipient answered from anyway
        if len(dealt) < self.threshold:
            raise Culprits({owner: why})
        chosen = dict(sorted(dealt.items())[: self.threshold])
        secret = rebuilt_at(chosen, self.threshold)
        if check(secret):
            return secret
        proof = blame_proof(self.roster[owner], survivors, {a: answers[a] for a in chosen}, self.context)
        raise Culprits({owner: why + " (its own signatures prove it)"}, {owner: proof})

    def _wrong_shares(self, survivors: list[int]) -> dict[int, str]:
        """The answerers that revealed a share other than the one its dealer committed to dealing them. An
        honest answerer reveals exactly what it opened, which it checked against the same commitment."""
        liars: dict[int, str] = {}
        for a, answer in sorted(self.revealed.items()):
            for j, s in sorted(answer.items()):
                if j == a or is_complaint(s):
                    continue  # an answerer's share of its own secret has no box: a lie there is its own deal
                kind, what, header = ("seed", "own-mask seed", 0) if j in survivors else ("key", "mask key", 1)
                committed = self.boxes[j][a][header * TAG_BYTES : (header + 1) * TAG_BYTES]
                if share_commitment(kind, s, j, a, self.context) != committed:
                    liars[a] = f"revealed a wrong share of client {j}'s {what}"
        return liars

    def complaint_verdicts(self) -> tuple[dict[int, str], list[str]]:
        """Who is to blame for each complaint of the unmask answers: ``(blamed, unresolved)``, client -> why,
        and what could not be told. Client ``a`` complained about ``x``'s box, revealing the pair's box key
        ``K`` (honest mode); the coordinator holds both boxes of the pair, each committing to its sealer's key:

        1. ``x``'s box commits to ``K``: ``K`` is the key ``x`` sealed with, and the box is judged under it. It
           does not open (garbage, or shares unlike its header): ``x`` is blamed; it opens: the complaint is
           false and ``a`` is blamed (it reached the same verdict under the same key).
        2. Otherwise ``a``'s own box for ``x`` must commit to ``K`` and open under it, or ``a`` revealed another
           key than its own and is blamed. Then the pair disagrees on its key. ``x`` is blamed if it answered
           without complaining about ``a``: it opened ``a``'s box, so its key is ``K`` too, and it sealed under
           another (an honest ``x`` that used the pair's key would have fallen under 1). If ``x`` complained
           back or did not answer, nobody can be named, unless at least ``t`` clients complain so about ``x``
           (a coalition of ``t`` can unmask any input anyway: the protocol's bound).

        A complaint without a key (signed mode) is recorded as unresolved. No rule blames an honest client:
        an honest accuser's key is the pair's, its own box commits to it, and an honest dealer's box opens
        under it; an honest accused seals under the pair's key, so only rule 1 applies to it."""
        blamed: dict[int, str] = {}
        unresolved: list[str] = []
        disputed: dict[int, list[int]] = {}
        for a, answer in sorted(self.revealed.items()):
            for x, entry in sorted(answer.items()):
                if x == a or not is_complaint(entry):
                    continue
                root = entry[1:]
                if not root:
                    unresolved.append(f"client {a} reports that client {x}'s box does not open (no key revealed)")
                    continue
                theirs, mine = self.boxes[x][a], self.boxes[a][x]
                if hmac.compare_digest(theirs[2 * TAG_BYTES : BOX_HEADER_BYTES], subkey(root, b"commit")):
                    if open_with(root, x, a, theirs, self.context) is None:
                        blamed[x] = f"sealed shares for client {a} that do not open under the key it committed to"
                    else:
                        blamed[a] = f"complained about client {x}'s shares, which open under the pair's key"
                elif open_with(root, a, x, mine, self.context) is None:
                    blamed[a] = f"complained about client {x}'s shares revealing a key its own box did not use"
                elif x in self.revealed and not is_complaint(self.revealed[x].get(a, COMPLAINT)):
                    blamed[x] = (
                        f"sealed shares for client {a} that do not open under the pair's key (client {a}'s box for "
                        "it proves the key, and it opened that box without complaint)"
                    )
                else:
                    disputed.setdefault(x, []).append(a)
        for x, accusers in sorted(disputed.items()):
            if x in blamed:
                continue
            if len(accusers) >= self.threshold:
                blamed[x] = (
                    f"{len(accusers)} clients (the threshold {self.threshold}) found its boxes sealed under another key"
                )
            else:
                unresolved.append(f"clients {accusers} and client {x} disagree on their pairs' box keys")
        return blamed, unresolved


def rebuild(
    pieces: dict[int, list[bytes]],
    positions: list[int],
    threshold: int,
    check: Callable[[bytes], bool],
    owner: int,
    what: str,
) -> bytes:
    """The secret of client ``owner`` from the answers ``pieces`` (answerer -> its shares), checked by ``check``.

    Every share here is one ``owner`` committed to dealing (:meth:`ServerSession.result` left out any other,
    and named its answerer), so any ``threshold`` of them rebuild what ``owner`` dealt: a secret that fails
    the check means ``owner`` dealt shares of another secret than it committed to, and :class:`Culprits` names
    ``owner``, never an answerer. Fewer than ``threshold`` shares (complaints left the others out):
    ``SecAggError``."""
    if len(pieces) < threshold:
        raise SecAggError(
            f"client {owner}'s {what}: {len(pieces)} shares left, fewer than the threshold {threshold} (the others' "
            "boxes did not open)"
        )
    secret = combine(pieces, positions, threshold)
    if not check(secret):
        raise Culprits({owner: f"dealt shares of its {what} that rebuild to another value than it committed to"})
    return secret
