"""Where the lab's vLLM runs: the backends' contract (`backend.py`), a local child process
(`local.py`, `server_process.py`) and a Kubernetes Deployment (`kubernetes.py`,
`restore_protocol.py`, `rollout_status.py`), and what they need: the plan's targets
(`targets.py`), vLLM's flags by name (`args.py`), the tiny models of the CPU demo
(`tinymodel.py`), a Prometheus for the demo and the tests (`prometheus_process.py`)."""
