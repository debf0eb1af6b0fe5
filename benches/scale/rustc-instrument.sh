#!/bin/sh
# RUSTC_WRAPPER for link-order.sh: compiles every crate with LLVM's profile counters,
# writing to $LINK_ORDER_RAW at exit, without cargo knowing (so crate hashes, and
# symbol names, stay those of an ordinary build).
rustc=$1
shift
exec "$rustc" "$@" "-Cprofile-generate=$LINK_ORDER_RAW"
