#!/usr/bin/env bash
# scripts/get_cifar10.sh without a network: against archives built here from a few fake
# records in the official layout (cifar-10-batches-bin/data_batch_1..5.bin, test_batch.bin,
# batches.meta.txt; 1 label byte + 3072 pixel bytes per record). A good archive lands
# whole; a corrupted one (checksum mismatch), a truncated one (extraction fails half-way)
# and a run killed during extraction leave nothing that looks like a data set.
set -uo pipefail
script=$(cd "$(dirname "$0")/.." && pwd)/scripts/get_cifar10.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@"; then echo "ok    $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}
contains() { grep -qF -- "$2" <<<"$1"; }
extracting() { compgen -G "$1/.cifar-10-download.*/extracting" >/dev/null; }
nothing_left() { [ -z "$(ls -A "$1" 2>/dev/null)" ]; }  # no data set, no temporary folder

# The fake archive: record r of file f has label (f + r) % 10 and every pixel f * 10 + r.
src=$tmp/src/cifar-10-batches-bin
mkdir -p "$src"
for f in 1 2 3 4 5 6; do
  name=data_batch_$f.bin
  [ $f = 6 ] && name=test_batch.bin
  for r in 0 1 2; do
    printf "\\$(printf %03o $(((f + r) % 10)))" >>"$src/$name"
    head -c 3072 /dev/zero | tr '\0' "\\$(printf %03o $((f * 10 + r)))" >>"$src/$name"
  done
done
printf 'airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n' >"$src/batches.meta.txt"
archive=$tmp/cifar-10-binary.tar.gz
tar -czf "$archive" -C "$tmp/src" cifar-10-batches-bin
md5=$(md5sum "$archive" | cut -d' ' -f1)

# 1. A good archive, from a local path: the data set appears whole, and the script says where.
out=$tmp/good
log=$(CIFAR10_URL=$archive CIFAR10_MD5=$md5 "$script" "$out" 2>&1)
check "good archive: exit 0" test $? -eq 0
check "good archive: says where it put the data" contains "$log" "CIFAR-10 is in $out/cifar-10-batches-bin (18 records"
check "good archive: the six batch files, byte for byte" diff -r "$src" "$out/cifar-10-batches-bin"
check "good archive: no temporary folder left" test -z "$(ls -A "$out" | grep -v '^cifar-10-batches-bin$')"
log=$(CIFAR10_URL=$archive CIFAR10_MD5=$md5 "$script" "$out" 2>&1)
check "a second run: exit 0, nothing fetched" contains "$log" "already in $out/cifar-10-batches-bin"

# ... and from a file:// URL.
out=$tmp/file_url
CIFAR10_URL=file://$archive CIFAR10_MD5=$md5 "$script" "$out" >/dev/null 2>&1
check "file:// URL: the data set appears" diff -r "$src" "$out/cifar-10-batches-bin"

# 2. A corrupted archive (one byte changed): checksum mismatch, a clear error, nothing kept.
cp "$archive" "$tmp/corrupt.tar.gz"
printf '\x5a' | dd of="$tmp/corrupt.tar.gz" bs=1 seek=200 conv=notrunc status=none
out=$tmp/corrupt
log=$(CIFAR10_URL=$tmp/corrupt.tar.gz CIFAR10_MD5=$md5 "$script" "$out" 2>&1)
check "corrupted archive: exit non-zero" test $? -ne 0
check "corrupted archive: says checksum mismatch" contains "$log" "checksum mismatch"
check "corrupted archive: names the expected md5" contains "$log" "expected md5 $md5"
check "corrupted archive: nothing left behind" nothing_left "$out"

# Without CIFAR10_MD5 the published md5 is required: this fake archive is refused.
out=$tmp/default_md5
log=$(CIFAR10_URL=$archive "$script" "$out" 2>&1)
check "default md5: the published one (c32a1d4a...)" contains "$log" "expected md5 c32a1d4ab5d03f1284b67883e8d87530"
check "default md5: nothing left behind" nothing_left "$out"

# 3. An interrupted extraction: a truncated archive (its own md5 given, so the check passes
# and tar stops half-way): an error, and no data set, whole or partial.
head -c $(($(stat -c %s "$archive") / 2)) "$archive" >"$tmp/truncated.tar.gz"
out=$tmp/truncated
log=$(CIFAR10_URL=$tmp/truncated.tar.gz CIFAR10_MD5=$(md5sum "$tmp/truncated.tar.gz" | cut -d' ' -f1) \
      "$script" "$out" 2>&1)
check "truncated archive: exit non-zero" test $? -ne 0
check "truncated archive: says it could not extract" contains "$log" "could not extract"
check "truncated archive: nothing left behind" nothing_left "$out"

# ... and a run stopped by a signal during extraction (as Ctrl-C stops the foreground job):
# a tar that writes part of a batch file, then hangs.
mkdir -p "$tmp/bin"
cat >"$tmp/bin/tar" <<'EOF'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = -C ] && dest=$2; shift; done
mkdir -p "$dest/cifar-10-batches-bin"
head -c 5000 /dev/zero >"$dest/cifar-10-batches-bin/data_batch_1.bin"
touch "$dest/../extracting"
sleep 30
EOF
chmod +x "$tmp/bin/tar"
out=$tmp/killed
mkdir -p "$out"
PATH=$tmp/bin:$PATH CIFAR10_URL=$archive CIFAR10_MD5=$md5 setsid "$script" "$out" >/dev/null 2>&1 &
runner=$!
for _ in $(seq 100); do extracting "$out" && break; sleep 0.1; done
check "killed run: it was extracting" extracting "$out"
kill -TERM -- -"$runner" 2>/dev/null  # the whole process group: the script and its tar
wait "$runner"
check "killed run: exit non-zero" test $? -ne 0
check "killed run: nothing left behind" nothing_left "$out"

# A source that does not exist: a clear error naming it.
out=$tmp/missing
log=$(CIFAR10_URL=$tmp/nowhere.tar.gz "$script" "$out" 2>&1)
check "missing archive: names the path" contains "$log" "no archive at $tmp/nowhere.tar.gz"
check "missing archive: nothing left behind" nothing_left "$out"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
