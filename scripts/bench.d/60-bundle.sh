#!/usr/bin/env bash
# Issue 6: push and pull of a 1 GB wheelhouse (20 wheels of ~50 MB, random
# content inside valid wheel zips) against one local distribution registry,
# gpupass vs oras in the same run, each tool with its default concurrency.
# Order alternates between repetitions; medians are reported. Knobs:
# BUNDLE_BENCH_WHEELS, BUNDLE_BENCH_MB, BUNDLE_BENCH_REPS.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
N="${BUNDLE_BENCH_WHEELS:-20}"
MB="${BUNDLE_BENCH_MB:-50}"
REPS="${BUNDLE_BENCH_REPS:-3}"
for tool in docker-registry oras /usr/bin/time; do
	command -v "$tool" >/dev/null || { echo "60-bundle: $tool missing (make deps)" >&2; exit 1; }
done

work="$(mktemp -d)"
regpid=""
cleanup() {
	[ -n "$regpid" ] && kill "$regpid" 2>/dev/null && wait "$regpid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/gpupass" ./cmd/gpupass

# Two wheelhouses, written by Python's zipfile as pip and bdist_wheel
# write wheels. house: stored (uncompressed) zips of random bytes, the
# 1 GB of the goal. zhouse: the way real ones are, deflated at zlib's
# default level, holding shared libraries (slices of this machine's .so
# files); checking it means inflating every entry for RECORD, which oras
# does not do: push always does, pull only with --verify-record (a bundle
# gpupass pushed carries a lock layer, and its blob digests prove the
# bytes are the ones push checked).
ZN="${BUNDLE_BENCH_DEFLATED_WHEELS:-20}"
ZMB="${BUNDLE_BENCH_DEFLATED_MB:-60}"
mkdir -p "$work/house" "$work/zhouse"
/usr/bin/python3 - "$work" "$N" "$MB" "$ZN" "$ZMB" <<'PY'
import base64, glob, hashlib, os, sys, zipfile
work, n, mb, zn, zmb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

def write_wheel(out, name, files, method, purelib):
    di = name + "-1.0.dist-info/"
    files = files + [(di + "METADATA", ("Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n" % name).encode()),
                     (di + "WHEEL", ("Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: %s\nTag: py3-none-any\n" % purelib).encode())]
    record = "".join("%s,sha256=%s,%d\n" % (p, base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode(), len(b)) for p, b in files)
    record += di + "RECORD,,\n"
    with zipfile.ZipFile(os.path.join(out, name + "-1.0-py3-none-any.whl"), "w", method) as z:
        for p, b in files:
            z.writestr(p, b)
        z.writestr(di + "RECORD", record)

for i in range(n):
    name = "benchpkg%02d" % i
    write_wheel(work + "/house", name, [(name + "/__init__.py", b"X = 1\n"), (name + "/blob.bin", os.urandom(mb << 20))],
                zipfile.ZIP_STORED, "true")

libs = sorted(p for p in glob.glob("/usr/lib/x86_64-linux-gnu/*.so*") + glob.glob("/usr/lib/x86_64-linux-gnu/*/*.so*")
              if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) > (1 << 20))
pool = bytearray()
for p in libs:
    pool += open(p, "rb").read()
    if len(pool) >= zn * (zmb << 20):
        break
if not pool:
    sys.exit("60-bundle: no shared libraries found to build the deflated wheelhouse")
pos = 0
def take(k):
    global pos
    b = bytearray()
    while len(b) < k:
        c = pool[pos:pos + k - len(b)]
        b += c
        pos = (pos + len(c)) % len(pool)
    return bytes(b)
for i in range(zn):
    name = "libpkg%02d" % i
    files = [(name + "/__init__.py", b"X = 1\n")] + [("%s/lib%d.so" % (name, j), take((zmb << 20) // 4)) for j in range(4)]
    write_wheel(work + "/zhouse", name, files, zipfile.ZIP_DEFLATED, "false")
PY
total_mb=$(du -sm "$work/house" | cut -f1)
z_mb=$(du -sm "$work/zhouse" | cut -f1)

start_registry() {
	rm -rf "$work/reg"
	mkdir -p "$work/reg"
	port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	host="127.0.0.1:$port"
	printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' "$work/reg/data" "$host" >"$work/reg/config.yml"
	docker-registry serve "$work/reg/config.yml" >"$work/reg/log" 2>&1 &
	regpid=$!
	for _ in $(seq 100); do
		curl -fs "http://$host/v2/" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "60-bundle: registry did not start" >&2
	cat "$work/reg/log" >&2
	return 1
}
stop_registry() {
	kill "$regpid" 2>/dev/null || true
	wait "$regpid" 2>/dev/null || true
	regpid=""
	rm -rf "$work/reg"
}

# measure LABEL CMD...: appends "seconds maxrss_kb user sys registry_cpu_s"
# to $work/LABEL.
measure() {
	local label="$1"
	shift
	local r0 r1
	r0=$(registry_cpu)
	if ! /usr/bin/time -f "%e %M %U %S" -o "$work/time.out" "$@" >"$work/cmd.out" 2>"$work/cmd.err"; then
		echo "60-bundle: $label failed:" >&2
		cat "$work/cmd.err" >&2
		return 1
	fi
	r1=$(registry_cpu)
	echo "$(cat "$work/time.out") $(awk -v a="$r0" -v b="$r1" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", (b-a)/hz}')" >>"$work/$label"
}
# registry_cpu: the registry's user+sys CPU so far, in clock ticks. It
# serves both tools on the same cores, so its share is part of each figure.
registry_cpu() { awk '{print $14 + $15}' "/proc/$regpid/stat"; }

files=$(cd "$work/house" && ls *.whl)
zfiles=$(cd "$work/zhouse" && ls *.whl)
# gpupass keeps a scan cache (digests of wheels that passed, by stat);
# each first push starts without one, as a first push on a CI runner does.
export XDG_CACHE_HOME="$work/cache"
gp_push() { rm -rf "$work/cache"; measure gp_push "$work/gpupass" bundle push --plain-http --wheelhouse "$work/house" "$host/bench/gp:v1"; }
oras_push() { (cd "$work/house" && measure oras_push oras push --plain-http "$host/bench/oras:v1" $files); }
gp_pull() { rm -rf "$work/out"; measure gp_pull "$work/gpupass" bundle pull --plain-http "$host/bench/gp:v1" --to "$work/out"; rm -rf "$work/out"; }
oras_pull() { rm -rf "$work/out"; mkdir -p "$work/out"; measure oras_pull oras pull --plain-http -o "$work/out" "$host/bench/oras:v1"; rm -rf "$work/out"; }
gp_zpush() { rm -rf "$work/zcache"; XDG_CACHE_HOME="$work/zcache" measure gp_zpush "$work/gpupass" bundle push --plain-http --wheelhouse "$work/zhouse" "$host/bench/gpz:v1"; }
oras_zpush() { (cd "$work/zhouse" && measure oras_zpush oras push --plain-http "$host/bench/orasz:v1" $zfiles); }
gp_zpull() { rm -rf "$work/out"; measure gp_zpull "$work/gpupass" bundle pull --plain-http "$host/bench/gpz:v1" --to "$work/out"; rm -rf "$work/out"; }
gp_vpull() { rm -rf "$work/out"; measure gp_vpull "$work/gpupass" bundle pull --verify-record --plain-http "$host/bench/gp:v1" --to "$work/out"; rm -rf "$work/out"; }
gp_zvpull() { rm -rf "$work/out"; measure gp_zvpull "$work/gpupass" bundle pull --verify-record --plain-http "$host/bench/gpz:v1" --to "$work/out"; rm -rf "$work/out"; }
oras_zpull() { rm -rf "$work/out"; mkdir -p "$work/out"; measure oras_zpull oras pull --plain-http -o "$work/out" "$host/bench/orasz:v1"; rm -rf "$work/out"; }

for r in $(seq "$REPS"); do
	start_registry
	if [ $((r % 2)) = 1 ]; then
		gp_push; oras_push; gp_pull; oras_pull; gp_vpull
		gp_zpush; oras_zpush; gp_zpull; oras_zpull; gp_zvpull
	else
		oras_push; gp_push; oras_pull; gp_pull; gp_vpull
		oras_zpush; gp_zpush; oras_zpull; gp_zpull; gp_zvpull
	fi
	measure gp_repush "$work/gpupass" bundle push --plain-http --wheelhouse "$work/house" "$host/bench/gp:v1"
	(cd "$work/house" && measure oras_repush oras push --plain-http "$host/bench/oras:v1" $files)
	stop_registry
done

# median COLUMN LABEL: median of a column (1 seconds, 2 KB, 6 client CPU s,
# 5 registry CPU s) of a label.
median() {
	awk -v c="$1" '{ if (c == 6) print $3 + $4; else print $c }' "$work/$2" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
row() { # figure label goal-text column [oras-label]
	local fig="$1" label="$2" goal="$3" col="$4" olabel="${5:-$2}"
	local g o ratio
	g=$(median "$col" "gp_$label")
	o=$(median "$col" "oras_$olabel")
	if [ "$col" = 2 ]; then
		g=$(awk -v v="$g" 'BEGIN{printf "%.0f MB", v/1024}')
		o=$(awk -v v="$o" 'BEGIN{printf "%.0f MB", v/1024}')
		ratio=$(awk -v a="$(median 2 "gp_$label")" -v b="$(median 2 "oras_$olabel")" 'BEGIN{printf "%.2f", a/b}')
	else
		ratio=$(awk -v a="$g" -v b="$o" 'BEGIN{ if (b > 0) printf "%.2f", a/b; else print "n/a" }')
		g="$g s"
		o="$o s"
	fi
	echo "| bundle | $fig | $g | $goal | oras $o, ratio $ratio |"
}
# Both tools share the machine's cores with the registry; on a loaded
# machine the ratio follows CPU time, so the load is part of the figure.
what="${total_mb} MB wheelhouse (${N}×${MB} MB), median of $REPS, load $(cut -d' ' -f1 /proc/loadavg)"
row "push $what" push "ratio ≤ 1.0" 1
row "pull $what (verified: digests + lock)" pull "ratio ≤ 1.0" 1
row "pull --verify-record (digests + lock + RECORD)" vpull "(context)" 1 pull
row "CPU user+sys, push" push "(context)" 6
row "CPU user+sys, pull" pull "(context)" 6
row "registry CPU while serving the pull" pull "(context)" 5
# The least wall time the CPU allows when client and registry share the
# machine's cores: when a pull takes about this long, only less CPU per
# byte makes it faster.
floor() { awk -v c="$(median 6 "$1")" -v r="$(median 5 "$1")" -v n="$(nproc)" 'BEGIN{printf "%.2f", (c + r) / n}'; }
echo "| bundle | pull CPU floor: (client + registry CPU) / $(nproc) cores | $(floor gp_pull) s | (context) | oras $(floor oras_pull) s |"
row "peak RSS, push" push "< 150 MB" 2
row "peak RSS, pull" pull "< 150 MB" 2
row "unchanged re-push" repush "< 1 s" 1
zwhat="${z_mb} MB deflated wheelhouse (${ZN} wheels of ${ZMB} MB of shared libraries, inflated), median of $REPS"
row "push $zwhat" zpush "(context: RECORD check inflates)" 1
row "pull $zwhat (digests + lock)" zpull "ratio ≤ 1.0" 1
row "pull --verify-record, deflated (RECORD check inflates)" zvpull "(context)" 1 zpull
row "CPU user+sys, deflated pull" zpull "(context)" 6
