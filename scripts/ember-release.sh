# shellcheck shell=bash disable=SC2034 # sourced: the caller reads $ember
# Sourced by the scripts that run this checkout's Ember (bench-vs-nanogpt.sh, bench-vs-torch.sh,
# nanogpt-parity.sh). Expects $ROOT and a `die` function.
#
# ember_release_binary BUILD [HINT]: sets $ember to the release binary of this checkout
# ($CARGO_TARGET_DIR/release/ember, default target/), running `cargo build --release` first when
# BUILD is 1, and stops naming the path when there is none (HINT: another way out to offer).
ember_release_binary() { # build hint
  local target="${CARGO_TARGET_DIR:-target}"
  [[ "$target" = /* ]] || target="$ROOT/$target"
  ember="$target/release/ember"
  if [[ "$1" == 1 ]]; then
    echo "== cargo build --release" >&2
    cargo build --release --quiet || die "cargo build --release failed"
  fi
  [[ -x "$ember" ]] || die "$ember not found (build with cargo build --release, or drop --no-build${2:+, or $2})"
}
