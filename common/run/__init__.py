"""A run's configuration: ``RunConfig`` (``config``), the methods' typed settings (``settings``), the
paper's presets, the Dirichlet partition and the accuracy metrics."""
