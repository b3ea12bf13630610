"""`python -m modeltap`: the same as the `modeltap` command."""

import sys

from modeltap.cli import main

sys.exit(main())
