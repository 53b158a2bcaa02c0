"""The lab's talk to the vLLM under test: completions and counter snapshots (`client.py`),
its page polled from a process of its own (`poller.py`), the key of a vLLM started with
`--api-key` (`credentials.py`)."""
