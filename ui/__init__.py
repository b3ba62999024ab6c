"""SpecDeck's desktop app: every Qt widget, signal and thread. Imports ``app``; ``app`` never imports this."""
