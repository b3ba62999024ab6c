"""The model library: GGUF bytes (gguf_format) and their meaning (gguf_reader), the one model-file check,
discovery and its header cache, compatibility, drafter ranking, pair statistics, demo models."""
