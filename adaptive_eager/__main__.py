"""``python -m adaptive_eager``: the ``adaptive-eager`` command."""

import sys

from .cli import main

sys.exit(main())
