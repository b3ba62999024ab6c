"""The chat: the message list and the panel around it."""
