"""The coordinator's secure state grows by each client's record: a call appends what it added (fsync'd), the whole
state is written only when a round closes, and a restarted coordinator replays the records onto it."""

from __future__ import annotations

from test_secagg_hostile import N, Party, secure_run

from server.checks import Options
from server.coordinator import Coordinator
from server.store import SECAGG_LOG, Store, step_key


def test_each_call_appends_its_record_and_a_round_close_saves_the_whole(tmp_path):
    coord, plan = secure_run(tmp_path)
    folder = tmp_path / "state" / "staging" / step_key(0, 0)
    parties = [Party(coord, i, plan) for i in range(N)]
    for p in parties[:-1]:
        before = (folder / "secagg.json").read_bytes() if (folder / "secagg.json").exists() else None
        p.call("advertise", keys=p.session.advertise())
        after = (folder / "secagg.json").read_bytes() if (folder / "secagg.json").exists() else None
        assert after == before  # not rewritten by a client's call
    lines = (folder / SECAGG_LOG).read_bytes().splitlines()
    assert len(lines) == N - 1 and all(str(p.i).encode() in line for p, line in zip(parties, lines))
    # A restarted coordinator holds every advertise appended so far
    resumed = Coordinator(coord.config, tmp_path / "state", Options())
    assert resumed.step is not None
    assert sorted(resumed.step.intake.secure.session.keys) == list(range(N - 1))
    last = Party(resumed, N - 1, plan)
    last.call("advertise", keys=last.session.advertise())
    assert last.call("roster")["roster"]  # the roster closed: the state saved whole, its log emptied
    assert (folder / "secagg.json").exists() and not (folder / SECAGG_LOG).exists()


def test_a_torn_last_record_is_left_out(tmp_path):
    store = Store(tmp_path)
    store.save_secagg("k", {"session": {}})
    store.append_secagg("k", {"field": "keys", "index": "0"})
    with open(tmp_path / "staging" / "k" / SECAGG_LOG, "ab") as log:
        log.write(b'{"field": "ke')  # a crash mid-write: never acknowledged
    state, records = store.load_secagg("k")
    assert state == {"session": {}} and records == [{"field": "keys", "index": "0"}]
