#!/bin/bash
echo '{"answer": 42, "unit": "none"}' > /app/answer.json
