"""``python -m circle_fx`` is the ``circle-fx`` command line."""
import sys

from .cli import main

sys.exit(main())
