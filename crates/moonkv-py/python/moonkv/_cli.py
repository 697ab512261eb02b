"""The ``moonkv`` command of the installed package: ``moonkv up``, ``moonkv master``,
``moonkv node``, the client commands and ``moonkv events``, as the Rust binary has them."""

import signal
import sys


def main() -> None:
    # The command handles SIGINT and SIGTERM itself (a clean shutdown); Python's own SIGINT
    # handler would otherwise turn the same Ctrl-C into a KeyboardInterrupt afterwards.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from moonkv import _moonkv

    sys.exit(_moonkv._cli_main(sys.argv))


if __name__ == "__main__":
    main()
