"""The frozen app's entry point: both executables of the bundle (`SpecDeck` and `specdeck`) start here."""

import multiprocessing

# First, before any other import: in the engine worker (started with the "spawn" context) this runs the
# worker and exits instead of starting a second copy of the app.
multiprocessing.freeze_support()

import sys  # noqa: E402

from app.ceiling.child import PROBE_FLAG  # noqa: E402

if __name__ == "__main__":
    # The hardware probes' child processes (app.ceiling.probe): no window, no Qt, no subcommand parsing.
    if sys.argv[1:2] == [PROBE_FLAG]:
        from app.ceiling.probe import main as probe_main

        sys.exit(probe_main(sys.argv[2:]))
    from ui.launch import main

    sys.exit(main())
