#!/usr/bin/env bash
# Run the main test suite with the CPU kernels pinned to AVX2, with the machine's own kernels, or both in turn.
# A test must pass on every processor the project's machines have (Intel or AMD, AVX2 only or AVX-512): pinning
# PyTorch (ATen), oneDNN and MKL to AVX2 on an AVX-512 machine runs the kernels an AVX2-only machine runs, so a test
# whose outcome the kernels decide fails here, before CI on another machine does (tests/README.md).
#
#   scripts/test_kernels.sh both            # AVX2-pinned, then the default kernels; exit 1 if either fails
#   scripts/test_kernels.sh avx2 [pytest args...]
#   scripts/test_kernels.sh default [pytest args...]
#
# pytest's header says which kernels ran ("cpu kernels: ATen AVX2 ..."), from tests/conftest.py.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-both}"; shift || true
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(-q -n auto)

pinned() { ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python -m pytest "${args[@]}"; }
default() { env -u ATEN_CPU_CAPABILITY -u ONEDNN_MAX_CPU_ISA -u MKL_ENABLE_INSTRUCTIONS python -m pytest "${args[@]}"; }

case "$mode" in
  avx2) pinned ;;
  default) default ;;
  both)
    pinned; a=$?
    default; b=$?
    echo "test_kernels.sh: AVX2-pinned exit $a, default kernels exit $b"
    [ "$a" = 0 ] && [ "$b" = 0 ] ;;
  *) echo "usage: $0 both|avx2|default [pytest args...]" >&2; exit 2 ;;
esac
