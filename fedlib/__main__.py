"""``python -m fedlib``: the ``fedlib`` command (what the workflow's rules call)."""

import sys

from fedlib.cli import main

sys.exit(main())
