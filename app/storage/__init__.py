"""Files SpecDeck keeps: atomic writes, settings, chat history."""
