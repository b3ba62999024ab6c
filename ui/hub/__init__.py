"""Models from the Hugging Face Hub in the window: the Find models view (``find_models``) and its place in the
window (``window_side``)."""
