# Sourced by the benchmark scripts: sets $py to the python of a virtual environment with CPU
# torch, pyyaml, numpy and tokenizers, outside the repository ($EMBER_TORCH_VENV, default
# ~/.cache/ember/torch-venv), creating it on first use. Expects $ROOT and a `die` function.
venv="${EMBER_TORCH_VENV:-$HOME/.cache/ember/torch-venv}"
mkdir -p "$(dirname "$venv")"
venv="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"
case "$venv/" in "$ROOT"/*) die "EMBER_TORCH_VENV=$venv is inside the repository; put it outside" ;; esac
py="$venv/bin/python"
if ! [[ -x "$py" ]] || ! "$py" -c 'import torch, yaml, numpy, tokenizers' 2>/dev/null; then
  command -v python3 >/dev/null || die "python3 is needed to create $venv"
  echo "== creating the PyTorch environment in $venv (once; the download is large)" >&2
  [[ -x "$py" ]] || python3 -m venv "$venv" || die "python3 -m venv $venv failed (Debian/Ubuntu: apt-get install python3-venv)"
  # The CPU-only wheel is a fraction of the size; its index is not reachable everywhere, and
  # the default PyPI wheel (CUDA-enabled) runs on the CPU just as well.
  if ! "$py" -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu; then
    echo "== the PyTorch CPU index is not reachable; installing torch from the default index" >&2
    "$py" -m pip install --quiet torch || die "pip install torch failed"
  fi
  "$py" -m pip install --quiet pyyaml numpy tokenizers || die "pip install pyyaml numpy tokenizers failed"
  "$py" -c 'import torch, yaml, numpy, tokenizers' || die "the environment in $venv is broken; delete it and retry"
fi

