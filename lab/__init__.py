"""The lab: runs its four kinds of experiment (quantization, KV pressure, speculative
decoding, rate sweeps) against a real vLLM — a local child process or a Kubernetes
Deployment — and writes a report. `glassbox lab run PLAN.yaml`, `glassbox demo`; see
docs/lab.md and docs/code-map.md for its layers."""
