"""`python -m kvviz`: the command line (see kvviz.cli.commands); Ctrl+C exits with status 130 however early it comes."""

import sys

try:
    from kvviz.cli.commands import main

    status = main()
except KeyboardInterrupt:  # before kvviz.cli.commands took Ctrl+C over
    if sys.stderr is not None:
        sys.stderr.write("kvviz: interrupted\n")
    status = 130
raise SystemExit(status)
