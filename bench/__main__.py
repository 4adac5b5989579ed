"""``python -m bench`` is ``python -m bench.run``."""

import sys

from .run import main

sys.exit(main())
