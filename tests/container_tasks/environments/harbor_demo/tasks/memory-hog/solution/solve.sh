#!/bin/bash
python3 -c 'b = bytearray(512 << 20); b[::4096] = b"x" * len(b[::4096]); print("held")'
if [ $? -eq 137 ]; then echo killed; else echo held; fi > /app/outcome.txt
