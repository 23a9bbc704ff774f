#!/bin/sh
if [ "$(cat /app/note.txt 2>/dev/null)" = "the side service says hello" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
