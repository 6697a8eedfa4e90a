"""The ``torchfit`` command: ``plan``, ``gpus``, ``models``.

Errors a user can fix (an unknown model, Hub id or card, a bad size, a gated repository,
no network) print one line with the close matches and exit with status 2, without a
traceback.
"""

from torchfit.cli.app import main

__all__ = ["main"]
