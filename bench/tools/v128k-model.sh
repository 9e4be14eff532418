#!/usr/bin/env bash
# Prints the path of a tiny Q8_0 model with the Llama 3 vocabulary (128,256 logits a token:
# a 513 KB row, as the 1B model's), made once by `FERRY gen-model` with the fixture tokenizer.
#
#   model=$(bench/tools/v128k-model.sh FERRY)
set -euo pipefail
cd "$(dirname "$0")/../.."
model=/tmp/ferry-v128k.gguf
if [ ! -f $model ]; then
  tok=$(mktemp -d)
  cp ../shared/fixtures/tokenizers/llama3/* "$tok"/ && gunzip -f "$tok"/tokenizer.json.gz
  "$1" gen-model --preset tiny --type q8_0 --vocab "$tok" -o $model > /dev/null 2>&1
  rm -rf "$tok"
fi
echo $model
