#!/usr/bin/env bash
# Stop 47, call C: stop 46's call B again (where a served step's time goes, both processes on
# one clock), with the mirror's one system fence a step. Carry [".dev24"].
BIN=.dev24 exec bash bench/runs/stop46-b.sh
