#!/usr/bin/env bash
# Stop 59, call C (any card): call B's stamps (H100) tie the hop before down to the copies in
# flight outside the chain, 1 | 2 | 3 | 4 | 5: hop gate/up -> down 0.7 | 3.0 | 4.3 | 6.1 | 6.3 us,
# gate/up's tiles 17.1 | 14.3 | 14.1 | 14.2 | 14.2, down's 9.5 | 6.4 | 5.7 | 5.2 | 5.0 (Little's
# law: the bytes in flight over the stream's rate is the queue every store and poll waits in).
# gate/up streams as fast with 2 as with 3, down gains up to 5. Prediction: gate/up at 2, down
# at 4, and 1 while either waits for its input (FERRY_CUDA_PERSIST_CAPS=2,4,1) saves ~1-2 us a
# layer, tg128 +2-3%. Binary: branch persist-quant with the caps (.dev59b/ferry.xz, carry
# [".dev59b"]).
BIN=${BIN:-.dev59b} source bench/runs/common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
date +%T
gen_models
# (The stamps' summary: the hops, gate/up's and down's tiles and the step's end.)
some_stamps() { stamps "$@" | grep -E "^==|^\(skipped|hop|gu tiles|down tiles|step end"; }
sweep_rounds 3 FERRY_CUDA_PERSIST_CAPS 2,3,1 2,4,1 2,4,0 3,4,0 2,5,1
some_stamps c241 FERRY_CUDA_PERSIST_CAPS=2,4,1
some_stamps c240 FERRY_CUDA_PERSIST_CAPS=2,4,0
date +%T
