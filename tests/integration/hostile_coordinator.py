"""``lorm-server``, hostile: in a distributed-DP run it unmasks a secure step's sum (the clients' noise shares in it)
and then claims that the session failed, restarting the step's secure aggregation. A second session would sum the
same statistics with fresh noise shares, and two such sums average the noise down: each client must sit it out.

Run as ``python tests/integration/hostile_coordinator.py`` with ``lorm-server``'s arguments (the project root on
``PYTHONPATH``); it prints ``hostile: ...`` when it has the sum and restarts."""

from __future__ import annotations

import sys

from common.secagg.primitives import SecAggError
from server.main import main
from server.secure.step import SecureStep

honest_unmask_into = SecureStep.unmask_into


def unmask_into(self: SecureStep, aggregator):  # type: ignore[no-untyped-def]
    report = honest_unmask_into(self, aggregator)  # the survivors' noised sum, unmasked: the coordinator has it
    if self.attempt == 0:
        print(f"hostile: unmasked {self.where} with {report['survivors']} survivors; claiming it failed", flush=True)
        self._failed(SecAggError("claimed by the coordinator"))  # restarts the step's session (attempt 1)
    return report


SecureStep.unmask_into = unmask_into  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
