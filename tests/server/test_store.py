"""The coordinator's store writes a strategy's tensors as they are, without copying the ones it need not, and
reads a staged evaluation report back whole."""

import json

import torch
from safetensors.torch import load_file

from common.wire.messages import EvalReport
from server.store import Store, own_storage, step_key


def test_shared_and_sliced_tensors_are_cloned_and_whole_ones_written_in_place(tmp_path):
    big = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    tensors = {"a": big, "alias": big.view(4, 3), "row": big[1], "column": big[:, 0], "empty": torch.zeros(0)}
    out = own_storage(tensors)
    assert out["a"].data_ptr() == big.data_ptr()  # owns its storage whole: not copied
    for name in ("alias", "row", "column"):
        assert out[name].untyped_storage().data_ptr() != big.untyped_storage().data_ptr(), name
    assert all(torch.equal(out[k], tensors[k]) for k in tensors)
    store = Store(tmp_path)
    store.commit({"step": 1}, tensors)  # safetensors refuses shared storage: this would raise without the clones
    back = load_file(str(next(tmp_path.glob("gen-*")) / "strategy.safetensors"))
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors)


def test_a_staged_eval_report_reads_back_whole(tmp_path):
    store, key = Store(tmp_path), step_key(2, 3)
    report = EvalReport("run", "c1", 1, 2, [3, 4, 5], [10, 10, 10])
    store.stage_eval(key, report, "idem-1")
    assert store.staged_indices(key) == [1]
    assert store.load_eval(key, 1) == report
    assert json.loads((tmp_path / "staging" / key / "1.json").read_text())["idempotency_key"] == "idem-1"
