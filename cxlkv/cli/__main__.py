"""``python -m cxlkv.cli``: the ``cxlkv`` command line."""

import sys

from cxlkv.cli import main

sys.exit(main())
