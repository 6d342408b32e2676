#!/usr/bin/env bash
# Quality peer: fairseq 0.12.2 trains Multi30k in either direction (SRC, TGT; default De->En) on this CPU for a fixed wall-clock budget with the
# Wu et al. (2021) Transformer-tiny recipe (4+4 layers, d 128, FFN 256, 4 heads, dropout 0.3, lr 5e-3,
# warmup 2000, shared embeddings, max-tokens 4096), averages the last 10 epoch checkpoints and decodes
# test_2016 with beam 5. Prints tokenized lowercased BLEU (the papers' variant) and sacreBLEU.
# ../shared/peers/fairseq/train_hour.sh with the direction as a variable, and hypotheses Moses-escaped before
# tokenized BLEU as eval.py does (unescaped, fairseq's De->En hours score 0.05-0.09 lower). The binarized de-en data serves
# both directions (fairseq finds train.de-en.* for --source-lang en --target-lang de).
#   bash ../shared/peers/fairseq/setup.sh && bash ../shared/peers/fairseq/bench.sh   # venv and binarized data
#   SRC=en TGT=de HOURS=1 SEQ2SEQ_DATA_DIR=../shared/data bash train_hour.sh
set -euo pipefail
VENV="${FS_VENV:-/tmp/fsvenv2}"; DATA="${FS_DATA:-/tmp/fsdata}"; HOURS="${HOURS:-1}"
SRC="${SRC:-de}"; TGT="${TGT:-en}"
OUT="${FS_OUT:-$DATA/tiny_${SRC}_${TGT}_${HOURS}h}"; DATA_DIR="${SEQ2SEQ_DATA_DIR:?set SEQ2SEQ_DATA_DIR to the folder holding multi30k/}"
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
mkdir -p "$OUT"
start=$(date +%s)
"$VENV/bin/fairseq-train" "$DATA/m30k" --task translation --source-lang "$SRC" --target-lang "$TGT" \
  --arch transformer --encoder-layers 4 --decoder-layers 4 --encoder-embed-dim 128 --decoder-embed-dim 128 \
  --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 --decoder-attention-heads 4 \
  --share-all-embeddings --dropout 0.3 --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 \
  --lr 0.005 --lr-scheduler inverse_sqrt --warmup-updates 2000 --warmup-init-lr 1e-07 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 \
  --stop-time-hours "$HOURS" --save-dir "$OUT/ckpt" --keep-last-epochs 10 \
  --log-interval 50 --log-format simple --no-progress-bar --cpu --num-workers 0 --seed 1 > "$OUT/train.log" 2>&1
train_s=$(( $(date +%s) - start ))
"$VENV/bin/python" - "$OUT" <<'PY'
# average the model weights of the last 10 epoch checkpoints (what fairseq's average_checkpoints.py does)
import glob, re, sys, torch
out = sys.argv[1]
paths = sorted(glob.glob(f"{out}/ckpt/checkpoint[0-9]*.pt"), key=lambda p: int(re.findall(r"(\d+)\.pt$", p)[0]))[-10:]
paths = paths or [f"{out}/ckpt/checkpoint_last.pt"]
states = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
avg = states[-1]
for k in avg["model"]:
    avg["model"][k] = sum(s["model"][k].float() for s in states) / len(states)
torch.save(avg, f"{out}/avg.pt")
print(f"averaged {len(paths)} checkpoints: {paths[0]} .. {paths[-1]}")
PY
"$VENV/bin/fairseq-generate" "$DATA/m30k" --source-lang "$SRC" --target-lang "$TGT" --path "$OUT/avg.pt" --beam 5 \
  --batch-size 128 --remove-bpe sentencepiece --cpu --num-workers 0 > "$OUT/gen.txt" 2>&1
grep -o "Translated .*" "$OUT/gen.txt" || true   # decoding speed: sentences/s and tokens/s, beam 5, batch 128
grep ^H- "$OUT/gen.txt" | sed 's/^H-//' | sort -n | cut -f3 > "$OUT/test_2016.hyp.$TGT"
"$VENV/bin/python" - "$OUT/test_2016.hyp.$TGT" "$DATA_DIR" "$train_s" "$(grep -c 'end of epoch' "$OUT/train.log" || true)" "$SRC" "$TGT" <<'PY'
import gzip, sys, sacrebleu
from sacremoses import MosesPunctNormalizer, MosesTokenizer
hyp = open(sys.argv[1], encoding="utf-8").read().splitlines(); data, src, tgt = sys.argv[2], sys.argv[5], sys.argv[6]
raw = gzip.open(f"{data}/multi30k/raw/test_2016_flickr.{tgt}.gz", "rt", encoding="utf-8").read().splitlines()
tok = gzip.open(f"{data}/multi30k/tok/test_2016_flickr.lc.norm.tok.{tgt}.gz", "rt", encoding="utf-8").read().splitlines()
# escape=True as tokenizer.perl, which wrote the references ("&apos;s"), and as eval.py scores
n, t = MosesPunctNormalizer(lang=tgt), MosesTokenizer(lang=tgt)
h = [t.tokenize(n.normalize(x), return_str=True, escape=True).lower() for x in hyp]
print(f"fairseq tiny {src}->{tgt}: {len(hyp)} lines, train {sys.argv[3]} s, epochs {sys.argv[4]}; "
      f"tokenized-lc BLEU {sacrebleu.corpus_bleu(h, [tok], tokenize='none', force=True).score:.2f}; "
      f"sacreBLEU {sacrebleu.corpus_bleu(hyp, [raw]).score:.2f}")
PY
