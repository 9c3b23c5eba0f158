#!/usr/bin/env bash
# Fill data/ with Multi30k (task 1: raw en/de/fr/cs, lowercased+tokenised en/de) and Tiny
# Shakespeare, verified against pinned SHA-256 checksums.
#
# Each file is taken from the shared data folder when it is there ($EMBER_SHARED_DATA, else
# ../shared/data next to the checkout) and otherwise downloaded from its public source:
#   https://github.com/multi30k/dataset/raw/master/data/task1/raw/<split>.<lang>.gz
#   https://github.com/multi30k/dataset/raw/master/data/task1/tok/<split>.lc.norm.tok.<lang>
#   https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
# Files already in data/ with the right checksum are left alone, so the script is idempotent.
# Cite the Multi30k papers (Elliott et al. 2016) when publishing results on it.
#
# Usage: scripts/get-data.sh [--verify-only] [DEST]     (DEST defaults to <checkout>/data)

set -euo pipefail

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
}

verify_only=0
dest=""
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --verify-only) verify_only=1 ;;
    -*) echo "get-data.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
    *) [[ -z "$dest" ]] || { echo "get-data.sh: only one DEST allowed" >&2; exit 2; }; dest="$arg" ;;
  esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${dest:-$repo/data}"
shared="${EMBER_SHARED_DATA:-$repo/../shared/data}"

# Pinned checksums (identical to shared/data/SHA256SUMS), so the script works without shared/.
SUMS='200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1  multi30k/test_2016_flickr.cs.gz
9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8  multi30k/test_2016_flickr.de.gz
611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9  multi30k/test_2016_flickr.en.gz
6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90  multi30k/test_2016_flickr.fr.gz
c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4  multi30k/test_2016_flickr.lc.norm.tok.de
5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2  multi30k/test_2016_flickr.lc.norm.tok.en
a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077  multi30k/train.cs.gz
726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6  multi30k/train.de.gz
d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f  multi30k/train.en.gz
622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c  multi30k/train.fr.gz
cb5a23529b65ec2061f1dc446192a9c37382b63cc75f81a0be59d34894b3a505  multi30k/train.lc.norm.tok.de
08925f8e0572bcd5a006702fc5fe20e2d77c6917d4eebd576fc20de6693c2119  multi30k/train.lc.norm.tok.en
b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc  multi30k/val.cs.gz
f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a  multi30k/val.de.gz
14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28  multi30k/val.en.gz
ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9  multi30k/val.fr.gz
97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00  multi30k/val.lc.norm.tok.de
46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec  multi30k/val.lc.norm.tok.en
86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed  tinyshakespeare/input.txt'

if command -v sha256sum >/dev/null 2>&1; then
  sha256() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
  sha256() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
  echo "get-data.sh: need sha256sum (coreutils) or shasum to verify downloads" >&2
  exit 1
fi

url_for() {
  local rel="$1" name="${1#multi30k/}"
  case "$rel" in
    tinyshakespeare/input.txt)
      echo "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt" ;;
    multi30k/*.lc.norm.tok.*)
      echo "https://github.com/multi30k/dataset/raw/master/data/task1/tok/$name" ;;
    multi30k/*.gz)
      echo "https://github.com/multi30k/dataset/raw/master/data/task1/raw/$name" ;;
    *) echo "get-data.sh: no public source known for $rel" >&2; return 1 ;;
  esac
}

fetch() { # URL OUT
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 3 --connect-timeout 20 -o "$2" "$1"
  elif command -v wget >/dev/null 2>&1; then
    wget -q --tries=3 --timeout=20 -O "$2" "$1"
  else
    echo "get-data.sh: need curl or wget to download $1" >&2
    return 1
  fi
}

mkdir -p "$dest/multi30k" "$dest/tinyshakespeare"
copied=0 downloaded=0 kept=0 failed=0
offline=0  # after one failed download, do not wait on the network for every other file
while read -r sum rel; do
  out="$dest/$rel"
  if [[ -f "$out" && "$(sha256 "$out")" == "$sum" ]]; then
    kept=$((kept + 1))
    continue
  fi
  if [[ $verify_only == 1 ]]; then
    if [[ -f "$out" ]]; then echo "BAD      $rel (checksum mismatch)" >&2; else echo "MISSING  $rel" >&2; fi
    failed=$((failed + 1))
    continue
  fi
  tmp="$out.partial"
  rm -f "$tmp"
  if [[ -f "$shared/$rel" && "$(sha256 "$shared/$rel")" == "$sum" ]]; then
    cp "$shared/$rel" "$tmp"
    chmod u+w "$tmp"
    how="copied"
  else
    [[ -f "$shared/$rel" ]] && echo "warning: $shared/$rel has the wrong checksum; downloading instead" >&2
    url="$(url_for "$rel")"
    if [[ $offline == 1 ]]; then
      echo "FAILED   $rel: not downloaded (an earlier download failed)" >&2
      failed=$((failed + 1))
      continue
    fi
    echo "download $url" >&2
    if ! fetch "$url" "$tmp"; then
      offline=1
      echo "FAILED   $rel: could not download $url (no network? fetch it by hand into $out)" >&2
      rm -f "$tmp"
      failed=$((failed + 1))
      continue
    fi
    how="downloaded"
  fi
  got="$(sha256 "$tmp")"
  if [[ "$got" != "$sum" ]]; then
    echo "FAILED   $rel: checksum $got, expected $sum (upstream changed or the transfer broke); not installed" >&2
    rm -f "$tmp"
    failed=$((failed + 1))
    continue
  fi
  mv -f "$tmp" "$out"
  if [[ $how == copied ]]; then copied=$((copied + 1)); else downloaded=$((downloaded + 1)); fi
done <<< "$SUMS"

printf '%s\n' "$SUMS" > "$dest/SHA256SUMS"
echo "data in $dest: $kept already present, $copied copied from $shared, $downloaded downloaded, $failed failed"
if [[ $failed -gt 0 ]]; then
  exit 1
fi
