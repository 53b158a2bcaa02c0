"""A bystander that records when the machine kept it off the CPU, run beside the real
stacks (tests/realstack.py: stall_watch) as a process of its own at normal priority.

It prints a header once it watches, then sleeps SLEEP_SECONDS at a time and prints
"START END" (unix seconds) whenever it woke more than STALL_SECONDS after it went to
sleep: for that span nothing let it run. On this machine's two cores under vLLM's load
every process is stopped so for 0.2-4.4 s now and then; a scrape that fails in such a
span is the machine's failure, not its target's.

    python tests/stall_watch.py
"""

from __future__ import annotations

import time

SLEEP_SECONDS = 0.05
STALL_SECONDS = 0.2
HEADER = "# unix seconds from and to which the watch was kept off the CPU"


def main() -> None:
    before = time.time()
    print(HEADER, flush=True)
    while True:
        time.sleep(SLEEP_SECONDS)
        now = time.time()
        if now - before > STALL_SECONDS:
            print(before, now, flush=True)  # exact: repr of the floats
        before = now


if __name__ == "__main__":
    main()
