#!/bin/sh
python3 -c "import urllib.request; print(urllib.request.urlopen('http://notes:8000/note.txt').read().decode().strip())" > /app/note.txt
