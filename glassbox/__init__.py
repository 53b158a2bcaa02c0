"""vllm-glassbox: observability that opens vLLM's black box."""

__version__ = "0.1.0"
