"""The exit statuses of every `specdeck` subcommand, in one place (the README quotes them)."""

EXIT_ERROR = 1  # bad input, a refused model or a failed check: the message says what to change
EXIT_BAD_OPTIONS = 2  # doctor and serve: options refused before any work, as argparse refuses a bad option
EXIT_ENGINE_CRASHED = 3  # llama.cpp died in the worker (and, in chat, could not be brought back)
EXIT_CANCELLED = 130  # Ctrl-C, as a shell reports it; what was measured is still saved
