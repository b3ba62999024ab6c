"""A client of a remote inference server (llama-server, vLLM, SGLang, another ``specdeck serve``): what it
serves and a chat with it (``client``), and its ``/metrics`` read as rates (``scrape``). The window's remote
route uses it; the server (``app.serve``) does not."""
