"""The lab: the benchmark grid (``lorm-bench``) and the figures made from its cells, beside the product rather
than in it. A grid is planned (``grid.py``) from the command line (``benchmark.py``); its cells (``cells.py``) run
one after another or in child processes (``runner.py``), a stored cell read with the code and defaults that ran it
(``provenance.py``) to find a twin or a changed configuration (``twins.py``); the finished cells become rows
(``rows.py``, beside the paper's figures: ``paper.py`` and ``paper_faa.json``), the grid's report (``report.py``,
``plots.py``), and RESULTS' summary and cost tables (``results_summary.py``: ``summary_table.py``,
``cost_table.py``, ``summary_plots.py``). The lab may import every package of the project; no product package
(server, client, common, engine, serve, proto, deploy) imports it (``tests/test_layers.py``)."""
