#!/bin/sh
echo "probably" > /logs/verifier/reward.txt
