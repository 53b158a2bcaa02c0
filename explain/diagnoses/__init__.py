"""The diagnoses: what an engineer who knows vLLM concludes from one scene, in words.

Each diagnosis is a small function, `Scene -> list[Finding]`, in a module of its own
(`kv_pool.py` holds `kv_pool`, its thresholds and its words), listed in `DIAGNOSES`
(`registry.py`); `explain()` runs them all and orders what they found (glassbox's own
blind spots first, then by severity). Another diagnosis is one more module and one more
line in `DIAGNOSES`, with what it reads added to the scene by each reader. A finding may
name the findings that usually explain it (`Finding.see`: an SLO burning names the pool,
decode and speculation findings); `explain()` keeps those the scene has. What several
share (the window as a figure, the decode steps, the guard for unread inputs) is
`common.py`.

The rules every diagnosis keeps:

- every number is a figure (`findings.py`): read as the source gave it, or computed by
  the derivation core (`core(derive.FUNCTION, …)`). No arithmetic here:
  `tests/explain/test_no_arithmetic.py` reads every module of this package and fails on
  any;
- a reading that is absent is never advised on: the finding says what is missing;
- the thresholds are the alerts' (alerts/glassbox-alerts.yaml), so that a finding and an
  alert agree on what is a storm, a saturated pool, a bypassed or a useless speculation.
"""

from __future__ import annotations

from vllm_glassbox.explain.diagnoses.common import Diagnosis
from vllm_glassbox.explain.diagnoses.registry import DIAGNOSES, explain, linked
from vllm_glassbox.explain.diagnoses.slo import BEHIND, BURNS
from vllm_glassbox.explain.scene import Blind

__all__ = ["BEHIND", "BURNS", "DIAGNOSES", "Blind", "Diagnosis", "explain", "linked"]
