"""The engine: llama.cpp wrapper, chat templates, sampling, drafters and the speculative loop."""
