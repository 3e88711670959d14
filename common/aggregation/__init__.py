"""How the methods fold a step's updates into running sums: the aggregators, shared by coordinator and client.

A step's aggregator comes from its method's factory (``Method.aggregator`` in ``common.methods``; built by
``common.aggregation.base.make_aggregator``), a pure function of ``(plan, model spec, run config)``. The coordinator
folds every client's update into it and hands it to the method's server half to solve; a client in a secure
step folds its own update into a fresh one, whose running sums are what it masks (``common/secagg/terms.py``),
so what a client masks is by construction what the coordinator would have folded.

- ``base.py``: the :class:`~common.aggregation.base.Aggregator` interface;
- ``validate.py``: what an update must satisfy before anything is folded (``UpdateRejected``);
- ``lora.py``, ``dense.py``, ``features.py``: the aggregators and factories of the LoRA methods, the full
  fine-tuning baselines (and the prompt learners' FedAvg), and the feature-statistics steps. A method with a
  slice of its own (``common/methods/<name>.py``) keeps its aggregator there.
"""
