"""python -m splitserve: the same as the `splitserve` command."""

import sys

from splitserve.cli import main

sys.exit(main())
