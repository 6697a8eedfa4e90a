"""``python -m torchfit.cli``: the same as the ``torchfit`` command."""

import sys

from torchfit.cli.app import main

sys.exit(main())
