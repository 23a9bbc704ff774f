#!/bin/sh
touch /app/started
sleep 600
