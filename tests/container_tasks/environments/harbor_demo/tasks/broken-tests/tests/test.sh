#!/bin/sh
echo "grader: cannot import its helper" >&2
exit 3
