"""The lab: runs the three experiments (quantization, KV pressure, speculative decoding)
against a real vLLM — a local child process or a Kubernetes Deployment — and writes a
report. `glassbox lab run PLAN.yaml`, `glassbox demo`; see docs/lab.md."""
