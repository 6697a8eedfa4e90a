"""Import torchvision for its model builders, where its compiled ops do not load.

A torchvision wheel built for a CUDA torch cannot load its custom ops (``nms`` and the
rest) on a CPU-only torch: its fake-kernel registrations fail at import, and so does every
later import that probes torchvision (transformers does, for its image processors). The
model builders need none of those ops, so the registrations are stubbed out and the
import retried.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def load_torchvision() -> bool:
    """Import torchvision (stubbing its op registrations if they fail); False if absent."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: PLC0415
    except RuntimeError:
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("stub")
        import torchvision  # noqa: F401, PLC0415
    return True
