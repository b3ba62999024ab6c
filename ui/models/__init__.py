"""Choosing and loading models: the picker and the sampling form."""
