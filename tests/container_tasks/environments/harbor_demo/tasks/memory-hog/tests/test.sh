#!/bin/sh
# The memory limit held when the allocation was killed (SIGKILL: the kernel's OOM killer).
if [ "$(cat /app/outcome.txt 2>/dev/null)" = "killed" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
