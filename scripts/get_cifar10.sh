#!/usr/bin/env bash
# Downloads CIFAR-10's official binary version, checks its md5 and extracts it to
# DIR/cifar-10-batches-bin, where train_cifar10 finds it (default DIR: this repository's
# data/, giving data/cifar-10-batches-bin, the trainer's default place).
#
#   scripts/get_cifar10.sh [DIR]
#
#   CIFAR10_URL  where the archive comes from: an http(s) URL (default: the official one),
#                a file:// URL or a local path (an archive downloaded elsewhere)
#   CIFAR10_MD5  the md5 the archive must have (default: the published one); set it only
#                for an archive of your own, as the tests do
#
# Nothing half-done ever looks like a data set: the archive is fetched, checked and
# extracted inside a hidden folder beside the target (DIR/.cifar-10-download.*), and only
# a complete, checked extraction is renamed to cifar-10-batches-bin. A failed or
# interrupted run removes its folder (one killed with SIGKILL is removed by the next run).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
url=${CIFAR10_URL:-https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz}
md5=${CIFAR10_MD5:-c32a1d4ab5d03f1284b67883e8d87530}  # published on https://www.cs.toronto.edu/~kriz/cifar.html
dir=${1:-$repo/data}
name=cifar-10-batches-bin
files=(data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin test_batch.bin)

fail() {
  echo "loom: get_cifar10: $*" >&2
  exit 1
}

# "" if DIR holds the six batch files as whole 3073-byte records, else what is wrong.
check_batches() {
  local d=$1 f size
  for f in "${files[@]}"; do
    [ -f "$d/$f" ] || { echo "$f is missing"; return; }
    size=$(stat -c %s "$d/$f")
    if [ "$size" -eq 0 ] || [ $((size % 3073)) -ne 0 ]; then
      echo "$f has $size bytes, not a whole number of 3073-byte records"
      return
    fi
  done
}

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
target=$dir/$name
if [ -e "$target" ]; then
  problem=$(check_batches "$target")
  [ -z "$problem" ] && { echo "loom: CIFAR-10 is already in $target"; exit 0; }
  fail "$target exists but is not a complete data set ($problem); remove it and run this again"
fi

# Folders of earlier runs that were killed before they could clean up (their process is gone).
for old in "$dir"/.cifar-10-download.*; do
  [ -d "$old" ] || continue
  pid=$(cat "$old/pid" 2>/dev/null || true)
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then rm -rf "$old"; fi
done

work=$(mktemp -d "$dir/.cifar-10-download.XXXXXX")
echo $$ >"$work/pid"
trap 'rm -rf "$work"' EXIT  # bash runs it on Ctrl-C (SIGINT) and kill (SIGTERM) too
archive=$work/cifar-10-binary.tar.gz

case "$url" in
  http://* | https://*)
    echo "loom: downloading $url (162 MB) ..."
    offline="on a machine without a network, download it elsewhere and run CIFAR10_URL=/path/to/cifar-10-binary.tar.gz $0"
    if command -v curl >/dev/null; then
      curl -fL --retry 3 --connect-timeout 30 -o "$archive" "$url" ||
        fail "could not download $url (curl failed; see above); $offline"
    elif command -v wget >/dev/null; then
      wget -q --show-progress --timeout 30 -O "$archive" "$url" ||
        fail "could not download $url (wget failed; see above); $offline"
    else
      fail "neither curl nor wget is installed (apt-get install curl), or download $url yourself and run" \
           "CIFAR10_URL=/path/to/cifar-10-binary.tar.gz $0"
    fi
    ;;
  *)
    path=${url#file://}
    [ -f "$path" ] || fail "no archive at $path (CIFAR10_URL=$url)"
    cp "$path" "$archive"
    ;;
esac

got=$(md5sum "$archive" | cut -d' ' -f1)
[ "$got" = "$md5" ] || fail "checksum mismatch for $url: expected md5 $md5, got $got" \
  "(a corrupt or incomplete download); nothing was kept, run this again"

mkdir "$work/extract"
tar -xzf "$archive" -C "$work/extract" ||
  fail "could not extract $url (a truncated or damaged archive?); nothing was kept"
problem=$(check_batches "$work/extract/$name")
[ -z "$problem" ] || fail "the archive from $url does not hold CIFAR-10's binary version: in $name/, $problem"

# The one step that makes the data set appear: a rename within DIR's file system.
mv -T "$work/extract/$name" "$target" || fail "could not move the data set to $target"
records=0
for f in "${files[@]}"; do records=$((records + $(stat -c %s "$target/$f") / 3073)); done
echo "loom: CIFAR-10 is in $target ($records records, md5 of the archive checked)"
if [ "$dir" != "$repo/data" ]; then
  echo "loom: train with: ./run.sh --data $target   (or LOOM_DATA=$target)"
fi
