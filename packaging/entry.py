"""The frozen app's entry point: both executables of the bundle (`SpecDeck` and `specdeck`) start here."""

import multiprocessing

# First, before any other import: in the engine worker (started with the "spawn" context) this runs the
# worker and exits instead of starting a second copy of the app.
multiprocessing.freeze_support()

import sys  # noqa: E402

from ui.launch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
