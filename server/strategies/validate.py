"""TEMPORARY re-export while the test ports finish (issue 42): moved to ``common/aggregation/validate.py``."""

from common.aggregation.validate import *  # noqa: F403
from common.aggregation.validate import PSD_RTOL, UpdateRejected, check_declared, check_gram, field_of  # noqa: F401
