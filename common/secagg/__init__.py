"""Secure aggregation: the primitives (Shamir shares, key agreement, the fixed-point ring), the rounds
of one session, signed keys, and the per-client terms each method masks (``terms``)."""
