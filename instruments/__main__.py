"""``python -m instruments``: see ``instruments.cli``."""

import sys

from .cli import main

sys.exit(main())
