#!/bin/sh
printf '%s' "$GREETING" > /srv/greeting.txt
