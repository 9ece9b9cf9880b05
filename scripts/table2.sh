#!/usr/bin/env bash
# The paper's Table 2 on Flickr8k: its six pipelines, each on FNE and on the single-layer baseline (the last
# conv layer's L2-normalised mean; no fc7 exists in any registry), on the ten crops, with the paper's Table 1
# settings (../shared/SEEDS.md) adapted as this project's runs are (bfloat16 steps, dropout 0.3 on the image
# input and on the words, a moving average 0.997, patience 10) and its epoch caps (200; MH 400).
#
# Two lanes run side by side, one thread each: FNE in one, the baseline in the other, so each pair shares the
# machine alike. Every run resumes from its checkpoint and a finished one (result.json) is skipped, so the
# script can be stopped and started again. It first makes sure of the ten crops' features (`features --crop ten`,
# resumable: about 1.5 hours on 2 cores of an AMX Xeon in bfloat16) and prints the comparison at the end
# (`report --table2`).
#
#   scripts/table2.sh [PIPELINE ...]     # default: MH PH SH SOE POE MOE, in that order
#
# Environment: TABLE2_RUNS (where the runs go; ~/.cache/jointspace/runs/table2), TABLE2_EXTRACT (the
# features' --extract-device; cpu-bf16), TABLE2_EPOCHS (a lower cap for every run, to see a table sooner),
# SEEDS (the seeds file; ../shared/SEEDS.md), PYTHON (.venv/bin/python), TABLE2_BF16 (--bf16; empty: float32
# steps), TABLE2_ARGS (train options after the paper's, which they override: a variant of every run) with
# TABLE2_TAG (the variant's runs are named PREFIX-ten-PIPELINE-TAG).
#
# On a GPU machine that only the repository travels to (README, "Training on a GPU machine"): TABLE2_PACK=DIR
# trains from DIR/fne and DIR/l2-last (`pack --crop ten --input fne|l2-last`, the same features) on
# TABLE2_DEVICE (cuda), every run in a process of its own at once (POE after its SOE), and TABLE2_SECONDS=N
# stops the runs still going after N seconds and closes each at its last epoch (its cap lowered to it, so its
# result.json and log say so), so that a call with a time limit still comes back with every run's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=train
runs=${TABLE2_RUNS:-$HOME/.cache/jointspace/runs/table2}
extract=${TABLE2_EXTRACT:-cpu-bf16}
mkdir -p "$runs"
pipelines=("$@")
[ ${#pipelines[@]} -gt 0 ] || pipelines=(MH PH SH SOE POE MOE)

# The paper's Table 1, Flickr8k column: joint dim, word dim, learning rate (margins and |.| follow the loss:
# 0.2 cosine, 0.05 and |.| order). POE is SOE's best model, then the max loss at 1e-4.
settings() {
  case $1 in
    SH) echo "--joint-dim 1536 --word-dim 1024 --lr 2e-4" ;;
    MH) echo "--joint-dim 1024 --word-dim 1024 --lr 2e-4" ;;
    SOE) echo "--joint-dim 1024 --word-dim 1024 --lr 1e-3" ;;
    MOE) echo "--joint-dim 1536 --word-dim 1536 --lr 1e-3" ;;
    PH) echo "--joint-dim 1536 --word-dim 1024 --lr 2e-4" ;;
    POE) echo "--joint-dim 1024 --word-dim 1024 --lr 1e-4" ;;
    *) echo "unknown pipeline $1 (SH MH SOE MOE PH POE)" >&2; exit 2 ;;
  esac
}

# The paper's epoch caps: 200, and 400 for MH on Flickr8k.
cap() { if [ "$1" = MH ]; then echo 400; else echo 200; fi; }

for p in "${pipelines[@]}"; do settings "$p" >/dev/null; done  # an unknown name stops here, before any run

common="--crop ten --extract-device $extract --tap-point post_relu ${TABLE2_BF16---bf16} --patience 10 --input-dropout 0.3
  --word-dropout 0.3 --ema 0.997 --no-raw-eval --threads 1 --ort-threads 1 --device ${TABLE2_DEVICE:-cpu}"
python=${PYTHON:-.venv/bin/python}
pack=${TABLE2_PACK:-}
tag=${TABLE2_TAG:+-$TABLE2_TAG}
[ -z "${TABLE2_ARGS:-}" ] || [ -n "$tag" ] || { echo "TABLE2_ARGS needs a TABLE2_TAG to name its runs" >&2; exit 2; }
deadline=$(( $(date +%s) + ${TABLE2_SECONDS:-315360000} ))

# run INPUT PREFIX PIPELINE: one training, resumed from its checkpoint, skipped once finished. Past the deadline
# it is stopped and closed at the last epoch its checkpoint holds (the trainer then evaluates its best on test).
run() {
  local input=$1 prefix=$2 p=$3 dir source extra="" left epoch rc=0 train
  dir="$runs/$prefix-ten-${p,,}$tag"
  [ -f "$dir/result.json" ] && return 0
  if [ "$p" = POE ]; then
    [ -f "$runs/$prefix-ten-soe$tag/result.json" ] || { echo "$dir: waits for $prefix-ten-soe$tag" >&2; return 0; }
    extra="--init-from $runs/$prefix-ten-soe$tag"
  fi
  if [ -n "$pack" ]; then source="--pack $pack/$input"; else source="--input $input"; fi
  left=$(( deadline - $(date +%s) ))
  [ "$left" -gt 0 ] || return 0
  mkdir -p "$dir"
  # The run's command up to its epoch cap: the same for the run and for its closing at the deadline.
  # shellcheck disable=SC2046,SC2086
  train=("$python" -m jointspace_train train --loss "$p" $source $common $(settings "$p") ${TABLE2_ARGS:-})
  # shellcheck disable=SC2086
  timeout "$left" "${train[@]}" --epochs "${TABLE2_EPOCHS:-$(cap "$p")}" $extra --run-dir "$dir" \
    >>"$dir/stdout.log" 2>&1 || rc=$?
  case $rc in
    0) ;;
    124)
      epoch=$("$python" -c 'import sys, torch; print(torch.load(sys.argv[1], weights_only=False, map_location="cpu")["state"]["epoch"])' "$dir/checkpoint.pt" 2>/dev/null) \
        || { echo "$dir: stopped at the deadline before its first epoch" >&2; return 0; }
      echo "$dir: stopped at the deadline after epoch $epoch; closing it there" >&2
      # shellcheck disable=SC2086
      "${train[@]}" --epochs "$epoch" $extra --run-dir "$dir" >>"$dir/stdout.log" 2>&1 \
        || echo "$dir: failed to close (see $dir/stdout.log)" >&2 ;;
    *) echo "$dir: failed (see $dir/stdout.log)" >&2 ;;
  esac
}

lane() {  # lane INPUT PREFIX: every pipeline in order on one input
  local p
  for p in "${pipelines[@]}"; do run "$1" "$2" "$p"; done
}

if [ -z "$pack" ]; then
  "$python" -m jointspace_train features --crop ten --extract-device "$extract"
  lane fne fne &
  lane l2-last last &
else
  for pair in "fne fne" "l2-last last"; do
    for p in "${pipelines[@]}"; do
      case $p in
        POE) ;;  # after its SOE, below
        SOE) (run $pair SOE; [[ " ${pipelines[*]} " == *" POE "* ]] && run $pair POE) & ;;
        *) run $pair "$p" & ;;
      esac
    done
    # POE asked for without SOE: its SOE must have finished earlier
    [[ " ${pipelines[*]} " == *" POE "* && " ${pipelines[*]} " != *" SOE "* ]] && { run $pair POE & }
  done
fi
wait
finished=$(ls -d "$runs"/*/result.json 2>/dev/null | xargs -r -n1 dirname)
# shellcheck disable=SC2086
[ -n "$finished" ] && "$python" -m jointspace_train report --table2 "${SEEDS:-../shared/SEEDS.md}" $finished
