"""The live performance dashboard."""
