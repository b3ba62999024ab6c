"""The soak harness: a script that drives the real window (``SPECDECK_AUTOPILOT``) and the watch that reports
what held the GUI thread. Loaded only when that variable asks for it, never at a plain start."""

AUTOPILOT_ENV = "SPECDECK_AUTOPILOT"  # the autopilot's script, as JSON; unset at a plain start
