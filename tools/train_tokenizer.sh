#!/usr/bin/env bash
# Train the demo/tiny-model tokenizer (models/tokenizer.model) with Debian's
# spm_train, using upstream needle's ids and markers:
#   PAD 0, EOS 1, BOS 2, UNK 3, the 10 chat markers at 4..13, byte fallback,
#   BPE, vocab 8192.
# Identity normalisation without whitespace collapsing, so the .model and
# the .cact tokenizer blob (which has no normaliser) encode identically.
#
# usage: tools/train_tokenizer.sh [CORPUS] [OUT_PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=${1:-examples/tokenizer_corpus.txt}
prefix=${2:-models/tokenizer}
if [[ ! -f $corpus ]]; then
  /usr/bin/python3 tools/gen_tokenizer_corpus.py "$corpus"
fi
mkdir -p "$(dirname "$prefix")"
spm_train \
  --input="$corpus" \
  --model_prefix="$prefix" \
  --model_type=bpe \
  --vocab_size=8192 \
  --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3 \
  --user_defined_symbols='<|im_start|>,<|im_end|>,<think>,</think>,<tools>,</tools>,<tool_call>,</tool_call>,<tool_result>,</tool_result>' \
  --byte_fallback=true \
  --normalization_rule_name=identity \
  --remove_extra_whitespaces=false \
  --character_coverage=1.0 \
  --num_threads=2 \
  --minloglevel=1
rm -f "$prefix.vocab"
n=$(/usr/bin/python3 -c "import sentencepiece as s,sys; print(s.SentencePieceProcessor(model_file=sys.argv[1]).vocab_size())" "$prefix.model")
if [[ $n != 8192 ]]; then
  echo "train_tokenizer: vocab is $n, expected 8192" >&2
  exit 1
fi
echo "wrote $prefix.model ($(stat -c %s "$prefix.model") bytes, vocab $n)"
