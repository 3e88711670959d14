"""Record-level differential privacy of the closed-form heads' statistics: the Gaussian mechanism's
calibration by ``dp_accounting``, its noise and the clipping it assumes (``gaussian.py``), and the ledger that refuses
an over-budget release and states a run's guarantee (``ledger.py``); the settings are ``common.run.settings.DpSettings``
(the ``dp`` section).

The adjacency (``gaussian.ADJACENCY``): two data sets are neighbours when one record is replaced by another of the
same label; the counts a run releases exactly are then the same on both, and a record's label is not protected. The
mechanism perturbs the sufficient statistics once (Analyze Gauss; AdaSSP). Each sample's features, after the feature
map (layers, norm, random projection), are scaled down to L2 norm at most ``C = dp.clip`` before they enter any sum
(``FeatureMap.clip``), so replacing one record ``x`` by ``x'`` of the same class changes

- the Gram ``G = sum_i x_i x_i^T`` ``(F', F')`` by ``x x^T - x' x'^T``, of Frobenius norm at most ``sqrt(2) C^2``
  (both are positive semi-definite of norm ``|x|^2 <= C^2``; its ``K`` diagonal blocks with ``ridge.blocks`` by at
  most that too);
- the class sums ``S: (C, F')`` by ``x - x'`` in one row: L2 norm ``<= 2 C``;
- the class counts not at all: **public**, never noised; neither head reads them (cosine NCM's rows are
  ``S_c / |S_c|``, the ridge head is ``S (G + lam I)^-1``), and the coordinator sees them.

Every entry of a statistic gets ``N(0, sigma^2)`` noise, ``sigma = sensitivity / mu_k``; the Gram's is symmetric,
``N(0, sigma^2 / 2)`` off the diagonal (``gaussian.add_gram_noise``). Gaussian mechanisms compose exactly into one
(Gaussian differential privacy, Dong, Roth and Su 2019): releases of ``mu_k`` are one of ``mu = sqrt(sum_k
mu_k^2)``, so a budget ``(epsilon, delta)`` is the ``mu = 1 / sigma`` of the analytic Gaussian mechanism of
sensitivity 1 (Balle and Wang 2018, ``dp_accounting.get_sigma_gaussian``), split between the statistics by shares
of ``mu^2`` (``dp.gram_share``).

Composition over the run: every record belongs to one task, and only that task's features step reads it, so
the steps compose in parallel and the run's guarantee is each step's. ``ledger.PrivacyLedger`` keeps the ``mu^2``
each task's records have spent and refuses a release that would take them over the budget.
"""
