"""The built-in CPU backend: vLLM's token-in/token-out HTTP endpoints over a small transformers
Llama model (continuous batching, prefix cache, scripted replies), and the tiny model it serves.
Nothing on the client side imports it; it is a backend like any vLLM server."""
