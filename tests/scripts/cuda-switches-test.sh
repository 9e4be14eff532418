#!/usr/bin/env bash
# docs/cuda.md's "Switches" table against the source: every FERRY_CUDA_* variable the source
# reads (getenv, env_off, env_on) has a row, every row names a variable the source reads, and
# each row's "read" column says when it is read: "backend" for a read in cuda-backend.cpp
# outside a static initializer (made again with each backend), "process" for any other (a
# static initializer, or a file of the ops read at its first use).
# Usage: cuda-switches-test.sh REPO_ROOT
set -u
root=${1:-.}
doc=$root/docs/cuda.md
fail=0
section=$(awk '/^## /{on = ($0 == "## Switches")} on' "$doc")
[ -n "$section" ] || { echo "FAIL: $doc has no '## Switches' section"; exit 1; }
reads=$(cd "$root" && grep -rnoE '(getenv|env_off|env_on)\("FERRY_CUDA_[A-Z0-9_]+"' src)
names=$(grep -oE 'FERRY_CUDA_[A-Z0-9_]+' <<< "$reads" | sort -u)
[ -n "$names" ] || { echo "FAIL: no FERRY_CUDA_ variable read under $root/src"; exit 1; }
n=0
for name in $names; do
  n=$((n + 1))
  row=$(grep -E "^\| \`$name\` \|" <<< "$section")
  if [ -z "$row" ]; then
    echo "FAIL: $name is read by the source but has no row in $doc's Switches"
    fail=1
    continue
  fi
  kinds=()
  while IFS=: read -r file line _; do
    kind=process
    if [[ $file == */cuda-backend.cpp ]] &&
      ! sed -n "$((line > 3 ? line - 3 : 1)),${line}p" "$root/$file" | grep -q "static const"; then
      kind=backend
    fi
    kinds+=("$kind")
  done < <(grep -E "\"$name\"" <<< "$reads")
  want=$(printf '%s\n' "${kinds[@]}" | sort -u | paste -sd, | sed 's/,/, /g')
  got=$(awk -F'|' '{gsub(/^ +| +$/, "", $(NF-1)); print $(NF-1)}' <<< "$row")
  if [ "$got" != "$want" ]; then
    echo "FAIL: $name: the table says it is read per '$got', the source per '$want'"
    fail=1
  fi
done
for name in $(grep -oE '^\| `FERRY_CUDA_[A-Z0-9_]+`' <<< "$section" | tr -d '|` '); do
  grep -qx "$name" <<< "$names" || { echo "FAIL: $doc's Switches lists $name, which the source never reads"; fail=1; }
done
[ $fail = 0 ] && echo "ok: $n FERRY_CUDA_ variables, each with its row and when it is read"
exit $fail
