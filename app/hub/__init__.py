"""Models from the Hugging Face Hub: search, a repository's GGUF files grouped by quant with a fit verdict and a
predicted speed read from their remote headers, and the resumable, verified download into the models folder."""
