#!/usr/bin/env bash
# Installs the Debian 12 packages gradsnap needs to build and test. Idempotent: when every
# package is already installed it returns in well under a second without touching apt.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git python3
  clang  # Debian 12's clang 14: the -Wthread-safety build of scripts/test.sh (system libstdc++)
  liburing-dev librocksdb-dev libzstd-dev libxxhash-dev libssl-dev libabsl-dev
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  libgtest-dev libgmock-dev
  libgloo-dev libopenblas-dev
  openssl  # the openssl command: throwaway TLS certificates in tests
  file  # CPack's Debian packages (dependencies found by dpkg-shlibdeps; scripts/check-packages.sh)
  python3-dev python3-pybind11 python3-numpy  # the Python package (python/) and its tests
  python3-venv  # scripts/torch-venv.sh: the PyTorch venv of the torch-labelled tests
  etcd-server etcd-client  # cluster mode (--etcd): the etcd its tests start, and etcdctl
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
