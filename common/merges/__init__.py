"""The closed-form merges, pure math in float64: RegMean and LoRM's LoRA merges (``regmean``), the
dense task-vector merges (``dense``), the VeRA and (IA)^3 vector merges (``vectors``), the Gram statistics they
and the closed-form heads sum (``grams``), the one least-squares solve they end in (``solve``), and the running
sums secure aggregation adds up (``sums``)."""
