"""How the property tests draw their cases, said once: the same examples in every run (a failure
in CI is a failure here), no example database and no home directory left in the checkout, no
deadline (a loaded 2-core machine is not a slow test). Each test file picks how many examples."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(tempfile.mkdtemp(prefix="reproduce-hypothesis-"))

# The verdicts that pass a run's figures on (the others say the figures are not evidence).
PASSING = ("reproduced", "slower", "faster", "unstable")


def examples(max_examples: int) -> settings:
    """Settings for a property test drawing MAX_EXAMPLES cases, derandomized."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
