#!/usr/bin/env bash
# The device run scripts' helpers (bench/runs/common.sh) as a run script uses them on the
# device: $OUT set, so everything printed also goes through a tee into $OUT/run.log. Checks
# that BIN set for the source alone stays set after it, that gen_models and gen_types return
# once the models are written (stops 48-d and 49-a hung in a bare `wait`, which also waited for
# the tee, until their calls' limits), that unpack makes a carried BIN/NAME.xz runnable as
# /tmp/NAME, that persist keeps the lines a run records (and only those), that persist_tests
# returns once its model is written with the tests' figures printed, that bench_tables keeps
# bench's rows, memory and bandwidth lines (and only those) for each model, that stamps writes
# $OUT/stamps-NAME.txt with its variables set and sums it up by BIN's persist-stamps.py (by
# bench/tools/persist-stamps.py where BIN has none), that
# sweep_rounds prints a row a round of the default and each value, that tg_rounds prints a row a
# round with each column's variables and binary (and plan_rounds through it), that test_ops prints
# test-ops' summary line alone, and that the output reaches run.log.
#   run-helpers-test.sh SOURCE_DIR
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin" "$tmp/out"
# In ferry's place (what is tested is the helpers' waiting, not gen-model): `gen-model ... -o
# PATH` writes PATH after a moment.
cat > "$tmp/gen" <<'GEN'
#!/usr/bin/env bash
while [ $# -gt 1 ] && [ "$1" != -o ]; do shift; done
sleep 0.3
echo model > "$2"
GEN
chmod +x "$tmp/gen"
# In bench_cuda_persist's place: its kinds of lines, the arguments echoed in the timed ones.
cat > "$tmp/persist" <<'PERSIST'
#!/usr/bin/env bash
echo "check, persistent: nmse x 1e-13, logits 1e-13 (ok)"
echo "check, the caches' new rows (roped keys, values): nmse 4e-08 (ok)"
echo "persistent: args $*: 900.0 us a step"
echo "a launch a product: args $*: 1200.0 us a step"
echo "qkv            5.38    1.54/2.30"
PERSIST
chmod +x "$tmp/persist"
# In test_cuda's place: a persistent test's figure line among gtest's.
cat > "$tmp/tc" <<'TC'
#!/usr/bin/env bash
echo "[ cuda     ] m: persistent decode vs the kernel plan over 2 steps: nmse 1e-10"
echo "[  PASSED  ] 1 test."
TC
chmod +x "$tmp/tc"
# In ferry bench's place: the kinds of lines it prints, the model and the stamps' variable in
# them, the stamps themselves on stderr.
cat > "$tmp/bench" <<'BENCH'
#!/usr/bin/env bash
if [ "$1" = test-ops ]; then
  echo "op case one: ok"
  echo "226 passed, 0 failed"
  exit 0
fi
if [[ " $* " == *" -p 0 -n 128 "* ]]; then  # tg's runs: the t/s column (the 8th) names the caps
  echo "| m | s | p | b | t | tg128 | caps=${FERRY_CUDA_PERSIST_CAPS:-none} |"
  exit 0
fi
echo "| model | size | backend | test | t/s |"
echo "| $3 | pp512 | 1000 |"
echo "| $3 | tg128 | 100 |"
echo "GPU memory in use: 1.0 GiB"
echo "weights read a token: 2.47 GB, 2.5 TB/s"
echo "build: something else"
echo "stamped=${FERRY_CUDA_PERSIST_STAMPS:-} caps=${FERRY_CUDA_PERSIST_CAPS:-}" >&2
echo "stamps   0 qkv  blocks 132 start      0.0 input      0.5 (max      0.9) tiles      5.0 (max      5.5) end      5.2 (max      6.0) producer      7.0 free   2.0% cap  80.0%" >&2
echo "stamps   1 attn blocks  32 start      6.1 input      7.0 (max      7.5) tiles      9.5 (max      9.8) end     10.0 (max     11.0)" >&2
echo "stamps   2 wo   blocks 128 start     10.2 input     12.0 (max     12.5) tiles     14.0 (max     14.2) end     14.5 (max     15.0)" >&2
echo "stamps   3 out  blocks 132 start     15.1 input     16.0 (max     16.2) tiles     20.0 (max     20.1) end     20.5 (max     21.0)" >&2
BENCH
chmod +x "$tmp/bench"
# Another binary, for tg_rounds' F=PATH columns.
sed 's/caps=\${/other caps=${/' "$tmp/bench" > "$tmp/bench2"
chmod +x "$tmp/bench2"
# persist-stamps.py's place: says which file it read.
printf 'import sys\nprint("summed", sys.argv[1])\n' > "$tmp/bin/persist-stamps.py"
# A carried benchmark, as the device scripts' BIN holds them.
printf '#!/bin/sh\necho unpacked\n' | xz > "$tmp/bin/ferry-helpers-$$-bench.xz"
cat > "$tmp/script.sh" <<SCRIPT
cd "$src"
BIN="$tmp/bin" source bench/runs/common.sh
[ "\$BIN" = "$tmp/bin" ] || { echo "BIN not kept after the source: '\$BIN'"; exit 3; }
F="$tmp/gen" Q="$tmp/q.gguf" H="$tmp/h.gguf"
gen_models
[ -f "$tmp/q.gguf" ] && [ -f "$tmp/h.gguf" ] || { echo "gen_models returned before its models"; exit 4; }
cd "$tmp"
gen_types ferry-helpers-$$-1 ferry-helpers-$$-2
cd "$src"
[ -f /tmp/ferry-helpers-$$-1.gguf ] && [ -f /tmp/ferry-helpers-$$-2.gguf ] || { echo "gen_types returned before its models"; exit 5; }
rm -f /tmp/ferry-helpers-$$-1.gguf /tmp/ferry-helpers-$$-2.gguf
unpack ferry-helpers-$$-bench
[ "\$(/tmp/ferry-helpers-$$-bench)" = unpacked ] || { echo "unpack did not make /tmp/NAME runnable"; exit 6; }
rm -f /tmp/ferry-helpers-$$-bench
P="$tmp/persist" persist 64 1 > "$tmp/short.txt"
[ "\$(cat "$tmp/short.txt")" = "persistent: args 50 16 64 1: 900.0 us a step" ] ||
  { echo "persist kept: \$(cat "$tmp/short.txt")"; exit 7; }
FULL=1 P="$tmp/persist" persist 64 > "$tmp/full.txt"
[ "\$(wc -l < "$tmp/full.txt")" = 4 ] && ! grep -q "^check, persistent" "$tmp/full.txt" ||
  { echo "persist FULL=1 kept: \$(cat "$tmp/full.txt")"; exit 8; }
nvidia-smi() { echo card; }
F="$tmp/gen" TC="$tmp/tc" H="$tmp/h2.gguf" persist_tests 'Cuda.Persistent*' 20 > "$tmp/pt.txt"
[ -f "$tmp/h2.gguf" ] || { echo "persist_tests returned before its model"; exit 9; }
grep -q "^card" "$tmp/pt.txt" && grep -q "persistent decode vs the kernel plan" "$tmp/pt.txt" ||
  { echo "persist_tests printed: \$(cat "$tmp/pt.txt")"; exit 10; }
F="$tmp/bench" bench_tables 5 m1 m2 > "$tmp/bt.txt"
[ "\$(wc -l < "$tmp/bt.txt")" = 8 ] && [ "\$(grep -c "| m2 |" "$tmp/bt.txt")" = 2 ] &&
  ! grep -q "^build\|model | size" "$tmp/bt.txt" ||
  { echo "bench_tables kept: \$(cat "$tmp/bt.txt")"; exit 11; }
F="$tmp/bench" stamps c1 FERRY_CUDA_PERSIST_CAPS=2,4,1 > "$tmp/st.txt"
grep -q "stamped=1 caps=2,4,1" "$tmp/out/stamps-c1.txt" && grep -q "^== stamps c1 (FERRY_CUDA_PERSIST_CAPS=2,4,1)" "$tmp/st.txt" &&
  grep -q "^summed $tmp/out/stamps-c1.txt" "$tmp/st.txt" ||
  { echo "stamps printed: \$(cat "$tmp/st.txt")"; exit 12; }
rm -f "$tmp/out/stamps-c1.txt"
mkdir "$tmp/bin2"
BIN="$tmp/bin2" F="$tmp/bench" stamps c2 > "$tmp/st2.txt"
grep -q "^attention  *median    4.0 us" "$tmp/st2.txt" && grep -q "^hop attn -> wo  *median    1.0 us" "$tmp/st2.txt" &&
  grep -q "^step end 20.5 us" "$tmp/st2.txt" && grep -q "^hop qkv -> attn  *median    1.0 us" "$tmp/st2.txt" &&
  grep -q "^attn sums  *median    2.5 us" "$tmp/st2.txt" &&
  grep -q "^qkv producer  *median    7.0 us, waiting for a stage  2.0%, under the cap 80.0%" "$tmp/st2.txt" ||
  { echo "stamps without BIN's persist-stamps.py printed: \$(cat "$tmp/st2.txt")"; exit 15; }
rm -f "$tmp/out/stamps-c2.txt"
F="$tmp/bench" H=m sweep_rounds 2 FERRY_CUDA_PERSIST_CAPS 2,4,1 3,1,1 > "$tmp/sw.txt"
[ "\$(wc -l < "$tmp/sw.txt")" = 3 ] && head -1 "$tmp/sw.txt" | grep -q "default | FERRY_CUDA_PERSIST_CAPS= 2,4,1 3,1,1" &&
  [ "\$(grep -c "^ caps=none  |  caps=2,4,1  |  caps=3,1,1 \$" "$tmp/sw.txt")" = 2 ] ||
  { echo "sweep_rounds printed: \$(cat "$tmp/sw.txt")"; exit 13; }
F="$tmp/bench" H=m tg_rounds 2 "a | b | c" "" FERRY_CUDA_PERSIST_CAPS=9 "F=$tmp/bench2 FERRY_CUDA_PERSIST_CAPS=7" > "$tmp/tr.txt"
[ "\$(wc -l < "$tmp/tr.txt")" = 3 ] && head -1 "$tmp/tr.txt" | grep -q "^--- 1B F16 tg128 (-p 0 -r 5): a | b | c\$" &&
  [ "\$(grep -c "^ caps=none  |  caps=9  |  other caps=7 \$" "$tmp/tr.txt")" = 2 ] &&
  [ "\$(F="$tmp/bench" H=m plan_rounds 1 | tail -1)" = " caps=none  |  caps=none " ] ||
  { echo "tg_rounds printed: \$(cat "$tmp/tr.txt")"; exit 16; }
[ "\$(F="$tmp/bench" test_ops)" = "226 passed, 0 failed" ] || { echo "test_ops printed: \$(F="$tmp/bench" test_ops)"; exit 14; }
echo "helpers done"
SCRIPT
OUT="$tmp/out" timeout 30 bash "$tmp/script.sh"
rc=$?
if [ $rc -eq 124 ]; then
  echo "FAIL: the run script hung (a helper waited for something that never ends)"
  exit 1
elif [ $rc -ne 0 ]; then
  echo "FAIL: the run script stopped with $rc"
  exit 1
fi
# The tee may still be writing when the script has ended.
for _ in $(seq 50); do
  grep -q "helpers done" "$tmp/out/run.log" 2> /dev/null && break
  sleep 0.1
done
grep -q "helpers done" "$tmp/out/run.log" || { echo "FAIL: run.log lacks the script's output"; exit 1; }
echo "ok"
