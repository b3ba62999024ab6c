"""The model library: bounded GGUF reading, discovery, compatibility, drafter ranking, pair statistics, demo models."""
