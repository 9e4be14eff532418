#!/usr/bin/env bash
# Runs C and D of stop 27 in one device call (carry [".devF"]).
bash bench/runs/stop27-c.sh; bash bench/runs/stop27-d.sh
