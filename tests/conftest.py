"""Test-wide settings: deterministic property tests under CI.

Locally, hypothesis explores new examples on every run. Under CI (``CI`` set) it uses a
derandomized profile, so a green run is reproducible and CI never fails on an example
nobody has seen; the examples it runs are still the generated ones, not a fixed list.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
