#!/bin/bash
# The machine must reach nothing outside: no route, no name resolution, no host loopback services.
python3 - <<'PY'
import socket

reached = []
for host, port in (("deb.debian.org", 80), ("1.1.1.1", 53), ("10.0.2.2", 22)):
    try:
        socket.create_connection((host, port), timeout=3).close()
        reached.append(f"{host}:{port}")
    except OSError:
        pass
blocked = not reached
said = open("/app/result.txt").read().strip() if __import__("os").path.exists("/app/result.txt") else ""
with open("/logs/verifier/reward.txt", "w") as f:
    f.write("1" if blocked and said == "blocked" else "0")
print("reached:", reached, "said:", said)
PY
