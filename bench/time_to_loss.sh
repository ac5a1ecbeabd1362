#!/usr/bin/env bash
# Issue 42's time to loss: gpt2-124m or gpt2-350m trained on real text (the Python 3.11 docs'
# _sources/*.txt and the fortunes, through gpt2-data), the same tokens per step in every run, from
# the same initial weights (bench/muon_peer.py writes them; every run starts from them by
# train.init_from):
#   adamw-LR-SCHEDULE  AdamW, LR in {3e-4, 6e-4, 1.2e-3, 1.8e-3} x {cosine, wsd} (the tuned baseline;
#                      3e-4 since 6e-4, the issue's lowest, was the best at 124m and 350m)
#   muon-wsd           our Muon (optim.name = muon) + wsd
#   peer-muon-wsd      torch.optim.Muon with the same hyperparameters (bench/muon_peer.py)
# The target is the best val loss the AdamW grid reaches at the last step. Prints every val curve,
# and for each run the first eval step and the training time (the sum of its steps' times, evals
# left out) at which its val loss reaches the target, and our Muon's largest gap to the peer's.
# Usage: bash bench/time_to_loss.sh SIZE [RUN ...]   (SIZE 124m | 350m | tiny; RUNs default: all;
# `summary` alone re-prints the table from $OUT/ttl-SIZE). Several calls may split the runs: each
# run's metrics stay in $OUT/ttl-SIZE.
# Env: STEPS (400), BATCH_TOKENS (32768: about 3 passes over the 5M-token text in 400 steps), MICRO (32;
# the peer's too: the eval windows are the first EVAL_STEPS x MICRO), SEQ (1024), EVAL_EVERY (25),
# EVAL_STEPS (2: 64 windows, within the val file's 68; more wrap around it, as gpt2-train does),
# MUON_LR (0.02), ADAMW_LR (6e-4: the AdamW rate of Muon runs), CORPUS (.device-deps/corpus, which
# `bash bench/time_to_loss.sh --prepare` makes on the CPU machine from the Debian packages
# python3.11-doc and fortunes; fortunes' .u8 names are links to the same files and are copied as
# files, so each fortune comes twice, as in every logged run: 4,917,256 train and 69,995 val tokens),
# GPT2_BIN (build-gpu/bin), DEVICE (cuda). On the GPU machine source .device-deps/gpu-env.sh first.
# SIZE tiny is configs/tiny.ini's model on the CPU, for a smoke run.
set -uo pipefail
if [ "${1:-}" = --prepare ]; then
  corpus="${CORPUS:-.device-deps/corpus}"
  for dir in /usr/share/doc/python3.11/html/_sources /usr/share/games/fortunes; do
    [ -d "$dir" ] || { echo "time_to_loss.sh --prepare: $dir is missing (apt-get install python3.11-doc fortunes)" >&2; exit 2; }
  done
  rm -rf "$corpus" && mkdir -p "$corpus"
  cp -r /usr/share/doc/python3.11/html/_sources "$corpus/pydocs" && cp -rL /usr/share/games/fortunes "$corpus/fortunes"
  du -sh "$corpus"; exit 0
fi
size="${1:?usage: time_to_loss.sh 124m|350m|tiny [RUN ...]}"; shift
source bench/common.sh  # bench_text
out="${OUT:-/tmp/out}/ttl-$size"; mkdir -p "$out"
bin="${GPT2_BIN:-build-gpu/bin}"
steps="${STEPS:-400}" micro="${MICRO:-32}" seq="${SEQ:-1024}" batch_tokens="${BATCH_TOKENS:-32768}"
eval_every="${EVAL_EVERY:-25}" eval_steps="${EVAL_STEPS:-2}" device="${DEVICE:-cuda}"
config="configs/gpt2-$size.ini"
case "$size" in
  124m) dims="--n_layer 12 --n_head 12 --n_embd 768" ;;
  350m) dims="--n_layer 24 --n_head 16 --n_embd 1024" ;;
  tiny) dims="--n_layer 4 --n_head 4 --n_embd 128 --block_size 128"; config=configs/tiny.ini ;;
  *) echo "time_to_loss.sh: SIZE must be 124m, 350m or tiny, not $size" >&2; exit 2 ;;
esac
runs=("$@")  # default: what the targets need first, so a call cut short still holds it
[ ${#runs[@]} -eq 0 ] && runs=(adamw-6e-4-cosine adamw-6e-4-wsd muon-wsd peer-muon-wsd adamw-3e-4-cosine
  adamw-3e-4-wsd adamw-1.2e-3-cosine adamw-1.2e-3-wsd adamw-1.8e-3-cosine adamw-1.8e-3-wsd)

data="${OUT:-/tmp/out}/ttl-text"
[ "${runs[0]}" = summary ] || bench_text || exit 1
peer() {  # ARGS...: bench/muon_peer.py with this size's settings
  python3 bench/muon_peer.py $dims --seq_len "$seq" --micro_batch "$micro" --batch_tokens "$batch_tokens" \
    --steps "$steps" --warmup 20 --eval_every "$eval_every" --eval_steps "$eval_steps" --device "$device" \
    --train "$data/train.h5" --val "$data/val.h5" --init_out "$out/init" "$@"
}
[ "${runs[0]}" = summary ] || [ -f "$out/init/model.safetensors" ] || peer --metrics "" || exit 1

for run in "${runs[@]}"; do
  [ "$run" = summary ] && continue
  opt="${run%%-*}" schedule="${run##*-}" lr="${run#*-}"; lr="${lr%-*}"  # adamw-6e-4-cosine: adamw 6e-4 cosine
  t0=$(date +%s)
  if [ "$opt" = peer ]; then  # peer-muon-wsd
    peer --schedule "$schedule" --lr "${ADAMW_LR:-6e-4}" --min_lr "$(python3 -c "print(${ADAMW_LR:-6e-4}/10)")" \
      --muon_lr "${MUON_LR:-0.02}" --dtype "$([ "$device" = cpu ] && echo fp32 || echo bf16)" \
      --metrics "$out/$run.jsonl" >"$out/$run.log" 2>&1 || { echo "$run failed:"; tail -5 "$out/$run.log"; continue; }
  else
    [ "$opt" = muon ] && lr="${ADAMW_LR:-6e-4}"
    "$bin/gpt2-train" --config "$config" --precision.fp8=false --data.train="$data/train.h5" --data.val="$data/val.h5" \
      --train.init_from="$out/init" --train.micro_batch="$micro" --train.seq_len="$seq" --train.batch_tokens="$batch_tokens" \
      --train.max_steps="$steps" --train.warmup_steps=20 --train.lr="$lr" --train.min_lr="$(python3 -c "print($lr/10)")" \
      --train.lr_schedule="$schedule" --train.decay_frac=0.2 --train.eval_every="$eval_every" --train.eval_steps="$eval_steps" \
      --train.sample_tokens=0 --train.sample_every=0 --log.every=1 --log.metrics="$out/$run.jsonl" --checkpoint.every=0 \
      --checkpoint.resume=none --checkpoint.dir="$out/ckpt-$run" --optim.name="$opt" --optim.muon_lr="${MUON_LR:-0.02}" \
      >"$out/$run.log" 2>&1 || { echo "$run failed:"; tail -5 "$out/$run.log"; continue; }
  fi
  echo "$run: $(( $(date +%s) - t0 )) s"
done

python3 - "$out" "$steps" <<'PY'
import glob, json, os, sys
out, steps = sys.argv[1], int(sys.argv[2])
runs = {}
for path in sorted(glob.glob(f"{out}/*.jsonl")):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    ms = {r["step"]: r["ms_per_step"] for r in rows if "ms_per_step" in r}
    if val: runs[os.path.basename(path)[:-6]] = (val, ms)
if not runs: sys.exit("no finished runs in " + out)
evals = sorted(set().union(*(v.keys() for v, _ in runs.values())))
print("val loss | step | " + " | ".join(runs))
for s in evals:
    print(f"         | {s:4d} | " + " | ".join(f"{v[s]:.4f}" if s in v else "-" for v, _ in runs.values()))
adamw = {n: v[steps] for n, (v, _) in runs.items() if n.startswith("adamw") and steps in v}
if not adamw: sys.exit("no AdamW run finished: no target")
best = min(adamw, key=adamw.get)
targets = {"best AdamW": adamw[best]}
if "adamw-6e-4-cosine" in adamw: targets["default AdamW"] = adamw["adamw-6e-4-cosine"]
def reach(name, target):  # first eval step at or below target, and the training time to it
    val, ms = runs[name]
    for s in sorted(val):
        if val[s] <= target:
            return s, sum(t for k, t in ms.items() if k < s) / 1000
    return None, None
for label, target in targets.items():
    print(f"target: {label} ({best if label == 'best AdamW' else 'adamw-6e-4-cosine'}) val loss {target:.4f} at step {steps}")
    base_s, base_t = reach(best if label == "best AdamW" else "adamw-6e-4-cosine", target)
    for name in runs:
        s, t = reach(name, target)
        if s is None:
            print(f"RESULT {name} vs {label}: not reached in {steps} steps"); continue
        print(f"RESULT {name} vs {label}: step {s} ({s / base_s:.2f} of its steps), {t:.1f} s "
              f"({t / base_t:.2f} of its time)")
if "muon-wsd" in runs and "peer-muon-wsd" in runs:
    ours, peer = runs["muon-wsd"][0], runs["peer-muon-wsd"][0]
    gaps = [abs(ours[s] / peer[s] - 1) for s in ours if s in peer]
    print(f"RESULT parity: our Muon's val loss within {100 * max(gaps):.2f}% of torch.optim.Muon's at all {len(gaps)} evals")
PY
