"""The OpenAI-compatible server on the speculative engine, its /metrics, and clients for remote engines."""
