"""`python -m loadtest`: the same commands as `semgate loadtest`."""

import sys

from loadtest.cli import main

sys.exit(main())
