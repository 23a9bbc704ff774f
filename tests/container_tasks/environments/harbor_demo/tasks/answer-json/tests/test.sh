#!/bin/bash
python3 /tests/grade.py
