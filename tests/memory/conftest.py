import warnings

import pytest


@pytest.fixture(autouse=True, scope="session")
def _quiet_transformers():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*loss_type=None.*")
