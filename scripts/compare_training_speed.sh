#!/usr/bin/env bash
# Training speed of two versions of attn on this machine, in turn: 200 updates of the default
# config with an earlier commit's code and with the working tree's, each round timed.
#   bash scripts/compare_training_speed.sh 9c599e0 [rounds] [corpus.tsv]
# The corpus defaults to the built-in one; an old commit that predates it needs a file path.
set -euo pipefail
commit=$1; rounds=${2:-2}; corpus=${3:-builtin:tatoeba-cmn-eng}
here=$(cd "$(dirname "$0")/.." && pwd)
old=$(mktemp -d); runs=$(mktemp -d)
git -C "$here" worktree add -q "$old" "$commit"
trap 'git -C "$here" worktree remove --force "$old"; rm -rf "$runs"' EXIT
for round in $(seq "$rounds"); do
  for tree in "$old" "$here"; do
    name=$([ "$tree" = "$here" ] && echo current || echo "$commit")
    rm -rf "$runs/$name"
    start=$(date +%s.%N)
    (cd "$tree" && PYTHONPATH="$tree" python3 -m attn_cli train --config configs/en-zh.yaml \
        --set run_dir="$runs/$name" --set data.corpus.path="$corpus" --set train.max_steps=200 \
        --set train.max_minutes=null --set train.valid_every=1000 --set train.valid_bleu=false > "$runs/$name.log" 2>&1)
    end=$(date +%s.%N)
    loop=$(grep -o 'validation: step 200 .*elapsed [0-9.]*' "$runs/$name.log" | grep -o '[0-9.]*$')
    echo "round $round $name: whole command $(echo "$end - $start" | bc) s, training loop $loop s"
  done
done
