"""`python -m loadtest ARGS`: `semgate loadtest ARGS`, through the same entry point."""

import sys

from gateway.cli import main

sys.exit(main(["loadtest", *sys.argv[1:]]))
