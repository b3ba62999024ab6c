"""SpecDeck: the engine and all logic. Plain Python; never imports Qt or ``ui``."""

__version__ = "0.1.0"
