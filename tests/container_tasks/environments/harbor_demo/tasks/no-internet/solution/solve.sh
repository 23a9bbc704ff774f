#!/bin/bash
if python3 -c 'import urllib.request; urllib.request.urlopen("http://deb.debian.org/debian/", timeout=5).read()' > /app/index.html 2>/dev/null; then
  echo ok > /app/result.txt
else
  echo blocked > /app/result.txt
fi
