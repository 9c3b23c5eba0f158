# shellcheck shell=bash disable=SC2034,SC2154 # sourced: the caller reads its constants and sets $py
# Sourced by the scripts that run karpathy/nanoGPT next to Ember (bench-vs-nanogpt.sh,
# nanogpt-parity.sh). Expects $ROOT, $py (scripts/torch-venv.sh) and a `die` function.
#
# nanogpt_prepare DIR: makes DIR a nanoGPT checkout — cloned at $NANOGPT_COMMIT when it has no
# train.py (a directory that has one is used as it is: a clone, a `git archive`, a mirror
# checkout) — prints which commit it is where git can tell, and prepares its shakespeare_char
# data from data/tinyshakespeare/input.txt (scripts/get-data.sh), the file Ember trains on.
# The clone comes from $NANOGPT_REPO, default https://github.com/karpathy/nanoGPT; on a machine
# that cannot reach GitHub, point it at a local mirror or bare copy that holds the pinned commit
# (NANOGPT_REPO=/path/to/nanoGPT.git).

# karpathy/nanoGPT master as of these scripts (train.py and model.py unchanged since 2023).
NANOGPT_COMMIT=3adf61e154c3fe3fca428ad6bc3818b27a3b8291
NANOGPT_DEFAULT_DIR="${NANOGPT_DIR:-$HOME/.cache/ember/nanoGPT}"
NANOGPT_REPO="${NANOGPT_REPO:-https://github.com/karpathy/nanoGPT}"

nanogpt_prepare() { # dir
  local dir="$1"
  if [[ ! -e "$dir" ]]; then
    echo "== cloning nanoGPT from $NANOGPT_REPO into $dir" >&2
    git clone --quiet "$NANOGPT_REPO" "$dir" \
      || die "git clone of nanoGPT from $NANOGPT_REPO failed (offline? set NANOGPT_REPO to a local mirror)"
    git -C "$dir" checkout --quiet "$NANOGPT_COMMIT" \
      || die "nanoGPT commit $NANOGPT_COMMIT not found in $NANOGPT_REPO (the clone is left in $dir; delete it before retrying)"
  fi
  [[ -f "$dir/train.py" && -f "$dir/model.py" && -f "$dir/data/shakespeare_char/prepare.py" ]] \
    || die "$dir is not a nanoGPT checkout (no train.py, model.py or data/shakespeare_char/prepare.py)"
  nanogpt_report_commit "$dir"
  nanogpt_prepare_data "$dir"
}

nanogpt_report_commit() { # dir
  local commit
  if commit="$(git -C "$1" rev-parse --verify --quiet HEAD 2>/dev/null)" \
      && [[ "$(git -C "$1" rev-parse --show-toplevel 2>/dev/null)" -ef "$1" ]]; then
    [[ "$commit" == "$NANOGPT_COMMIT" ]] \
      || echo "== warning: nanoGPT in $1 is at $commit, not the pinned $NANOGPT_COMMIT" >&2
    echo "== nanoGPT: $1 at commit $commit" >&2
  else
    echo "== nanoGPT: $1 (not a git checkout; its commit cannot be checked, pinned is $NANOGPT_COMMIT)" >&2
  fi
}

nanogpt_prepare_data() { # dir
  local text="$ROOT/data/tinyshakespeare/input.txt" char_dir="$1/data/shakespeare_char"
  [[ -f "$text" ]] || die "$text not found; run scripts/get-data.sh"
  if [[ ! -f "$char_dir/train.bin" ]] || ! cmp -s "$text" "$char_dir/input.txt"; then
    cp "$text" "$char_dir/input.txt" || die "cannot write $char_dir (nanoGPT's data folder)"
    # prepare.py imports requests only to download input.txt, which is already there.
    (cd "$char_dir" && "$py" -c 'import sys, types; sys.modules.setdefault("requests", types.ModuleType("requests")); __file__ = "prepare.py"; exec(open("prepare.py").read())' >/dev/null) \
      || die "nanoGPT's data/shakespeare_char/prepare.py failed"
  fi
}
