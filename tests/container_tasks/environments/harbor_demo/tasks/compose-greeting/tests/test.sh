#!/bin/sh
if [ "$(cat /srv/greeting.txt 2>/dev/null)" = "hello from compose" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
