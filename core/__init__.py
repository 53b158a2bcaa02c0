"""The floor under every wing: vLLM's pages and logs read, and every derived number."""
