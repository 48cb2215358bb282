#!/bin/bash
# Remakes runtime/hot-text.txt: the functions the daemon runs while it serves, which the release
# build lays out together (runtime/link-hot-first). Run as root from the repository, on an idle
# machine, after changes that move work between functions (a new call path, a new dependency):
#
#   tests/benches/hot-text.sh [lifecycle bench arguments]
#
# How it finds them, page by page rather than in the kernel's 64 KiB fault-around windows:
# 1. builds the release daemon as build-release does (v0 symbols) but unstripped and linked by cc
#    in the compiler's order (an empty list), into target/hot-text/;
# 2. runs it from an ext4 image on a loop device whose read-ahead is 0, so that a fault reads
#    just its own page, and fault-around can only map pages that were themselves faulted in;
# 3. once it serves, unmaps and evicts its text (process_madvise MADV_PAGEOUT) and drops the page
#    cache, then runs the lifecycle bench (default: --iterations 10 --pods 60 --no-big-pull
#    --steady 60 --burst) and reads which of its pages are present every 2 s (pagemap);
# 4. lists every function that overlaps a present page, by the names link-hot-first matches.
# Start-up code stays out: the daemon ran it before step 3.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
[ "$(id -u)" = 0 ] || { echo "hot-text.sh: needs root" >&2; exit 1; }
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--iterations 10 --pods 60 --no-big-pull --steady 60 --burst)

triple=$(rustc -vV | sed -n 's/^host: //p')
triple_env=$(echo "$triple" | tr a-z- A-Z_)
out=$repo/target/hot-text
mkdir -p "$out"
work=$(mktemp -d)
mnt=$work/mnt
cleanup() {
    [ -n "${daemon_watch:-}" ] && kill "$daemon_watch" 2>/dev/null
    mountpoint -q "$mnt" && umount "$mnt"
    rm -rf "$work"
}
trap cleanup EXIT

echo "hot-text.sh: building an unstripped release daemon in $out" >&2
env RUSTFLAGS="-C target-feature=+crt-static -C symbol-mangling-version=v0" \
    LIBSECCOMP_LINK_TYPE=static LIBSECCOMP_LIB_PATH="$(pkg-config --variable=libdir libseccomp)" \
    "CARGO_TARGET_${triple_env}_LINKER=$repo/runtime/link-hot-first" CRIUS_HOT_TEXT=/dev/null \
    CRIUS_GCC_LD="$(rustc --print sysroot)/lib/rustlib/$triple/bin/gcc-ld" \
    CARGO_TARGET_DIR="$out" CARGO_PROFILE_RELEASE_STRIP=false \
    cargo build --release --target "$triple" -p crius --bin crius
make build-release >/dev/null
bench=$(cargo bench -p crius-tests --bench lifecycle --no-run 2>&1 |
    sed -n 's/.*Executable .*(\(.*\))$/\1/p')

truncate -s 128M "$work/fs.img"
mkfs.ext4 -q -F "$work/fs.img"
mkdir "$mnt"
mount -o loop "$work/fs.img" "$mnt"
loop=$(findmnt -n -o SOURCE "$mnt")
echo 0 >"/sys/block/$(basename "$loop")/queue/read_ahead_kb"
cp "$out/$triple/release/crius" "$mnt/crius"
sync "$mnt/crius" # dirty pages cannot be dropped from the cache

python3 - "$mnt/crius" "$work/pages" "$work/bench.txt" <<'EOF' &
# Waits for the bench's daemon to serve, evicts its file pages, then records its present pages.
import ctypes, os, re, struct, sys, time
exe, pages, log = sys.argv[1:]
pid = None
while pid is None:  # serving: the bench has had the daemon's Version
    try:
        text = open(log).read()
        m = re.search(r'^crius: .*\(pid (\d+)\)', text, re.M)
        pid = int(m.group(1)) if m and re.search('^runtime: ', text, re.M) else None
    except FileNotFoundError:
        pass
    time.sleep(0.02)
libc = ctypes.CDLL(None, use_errno=True)
class Iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
def mappings():
    for line in open(f'/proc/{pid}/maps'):
        f = line.split()
        if len(f) >= 6 and f[5] == exe:
            a, b = (int(x, 16) for x in f[0].split('-'))
            yield a, b, int(f[2], 16), f[1]
pidfd = os.pidfd_open(pid)
for a, b, _, perm in mappings():
    if 'w' not in perm:
        iov = Iovec(a, b - a)
        libc.syscall(440, pidfd, ctypes.byref(iov), 1, 21, 0)  # process_madvise, MADV_PAGEOUT
os.sync()
open('/proc/sys/vm/drop_caches', 'w').write('3\n')
present = set()  # every page seen present: an exiting process's pagemap is empty
while True:
    try:
        with open(f'/proc/{pid}/pagemap', 'rb') as pm:
            for a, b, off, perm in list(mappings()):
                if 'x' not in perm:
                    continue
                pm.seek(a // 4096 * 8)
                data = pm.read((b - a) // 4096 * 8)
                for i in range(0, len(data), 8):
                    if struct.unpack_from('<Q', data, i)[0] >> 63:
                        present.add(off + i // 8 * 4096)
        with open(pages + '.tmp', 'w') as o:
            o.write(''.join(f'{p}\n' for p in sorted(present)))
        os.replace(pages + '.tmp', pages)
    except (FileNotFoundError, ProcessLookupError):
        break
    time.sleep(2)
EOF
daemon_watch=$!

echo "hot-text.sh: running the lifecycle bench ${bench_args[*]}" >&2
CRIUS_BIN="$mnt/crius" CRIUS_SHIM_BIN="$repo/target/$triple/release-shim/crius-shim" \
    "$bench" "${bench_args[@]}" >"$work/bench.txt" 2>&1 || { cat "$work/bench.txt" >&2; exit 1; }
wait "$daemon_watch"
daemon_watch=

# Functions (by file offset) that overlap a present page, then their listed names.
python3 - "$out/$triple/release/crius" "$work/pages" >"$work/hot" <<'EOF'
import subprocess, sys
binary, pages = sys.argv[1:]
touched = {int(x) // 4096 for x in open(pages)}
segments = []
for line in subprocess.run(['readelf', '-lW', binary], capture_output=True, text=True, check=True).stdout.splitlines():
    f = line.split()
    if f and f[0] == 'LOAD' and 'E' in f[6:-1]:
        segments.append((int(f[2], 16), int(f[1], 16), int(f[5], 16)))
nm = subprocess.run(['nm', '-S', '--defined-only', binary], capture_output=True, text=True, check=True)
for line in nm.stdout.splitlines():
    f = line.split()
    if len(f) != 4 or f[2] not in 'tTwW':
        continue
    addr, size = int(f[0], 16), max(int(f[1], 16), 1)
    for vaddr, offset, memsz in segments:
        if vaddr <= addr < vaddr + memsz:
            first = (addr - vaddr + offset) // 4096
            last = (addr - vaddr + offset + size - 1) // 4096
            if any(p in touched for p in range(first, last + 1)):
                print(f[3])
print(f'hot-text.sh: {len(touched)} pages ({len(touched) * 4} KiB) of text touched', file=sys.stderr)
EOF

{
    echo "# Made by tests/benches/hot-text.sh ${bench_args[*]} on $(git rev-parse --short HEAD)."
    echo "# Functions the daemon ran while serving; runtime/link-hot-first lays them out together."
    runtime/link-hot-first --pairs "$out/$triple/release/crius" |
        awk -F '\t' 'FNR == NR { hot[$1] = 1; next } $1 in hot { print $2 }' "$work/hot" - | sort -u
} >runtime/hot-text.txt
echo "hot-text.sh: $(grep -vc '^#' runtime/hot-text.txt) names in runtime/hot-text.txt" >&2
