"""The layer above coordinator and clients: the in-process engine (``lorm-sim``) and the benchmark grid
(``lorm-bench``).

It imports ``server`` (strategies, results) and ``client`` (runtime, worker); neither imports it.
"""
