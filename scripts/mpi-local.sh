#!/usr/bin/env bash
# Open MPI for `ember train` under mpirun: installs what the `distributed` cargo feature builds
# against and what its tests start (Debian packages), then checks that a 2-rank job runs.
#
#   sudo scripts/mpi-local.sh      install openmpi-bin, libopenmpi-dev, libclang-dev if missing
#
# libclang-dev is for bindgen, which the `mpi` crate (rsmpi) runs against mpi.h at build time.
# Verified on Debian 12 (Open MPI 4.1.4): install ~40 s.
set -euo pipefail

die() { echo "mpi-local.sh: $*" >&2; exit 1; }

# bindgen loads libclang.so (the -dev package's link, or where LIBCLANG_PATH points); clang's
# own runtime libraries (libclang_rt.*, libclang-cpp) are not it.
have() {
    command -v mpirun >/dev/null && command -v mpicc >/dev/null \
        && { [ -n "${LIBCLANG_PATH:-}" ] \
             || compgen -G '/usr/lib/llvm-*/lib/libclang.so' >/dev/null \
             || compgen -G '/usr/lib*/libclang.so' >/dev/null \
             || compgen -G '/usr/lib/*-linux-gnu/libclang.so' >/dev/null; }
}

if ! have; then
    [ "$(id -u)" -eq 0 ] || die "Open MPI or libclang is missing and installing needs root: sudo $0"
    command -v apt-get >/dev/null || die "no apt-get: install Open MPI (mpirun, mpicc, mpi.h) and libclang with this system's package manager"
    echo "installing openmpi-bin, libopenmpi-dev and libclang-dev (Debian packages)..."
    apt-get update -q || die "apt-get update failed (is the network or a package mirror reachable?)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        openmpi-bin libopenmpi-dev libclang-dev \
        || die "apt-get install openmpi-bin libopenmpi-dev libclang-dev failed"
fi

# Root may start jobs only when it says so (Open MPI refuses by default): CI runs as root.
out=$(mpirun --allow-run-as-root --oversubscribe -np 2 sh -c 'echo "rank $OMPI_COMM_WORLD_RANK"' 2>&1) \
    || die "a 2-rank mpirun failed: $out"
grep -q "rank 1" <<<"$out" || die "a 2-rank mpirun did not start rank 1: $out"
echo "Open MPI ready: $(mpirun --version | head -1)"
