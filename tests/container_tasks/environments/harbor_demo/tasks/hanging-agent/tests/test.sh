#!/bin/sh
# Graded after the agent's time ran out: what it did before counts.
if [ -f /app/started ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
