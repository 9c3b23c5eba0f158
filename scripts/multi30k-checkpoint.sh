# Sourced by scripts/multi30k-full-eval.sh and scripts/multi30k-full-release.sh: the checkpoint
# directory of a run's candidate final model, as the study's protocol names them.
#
#   checkpoint RUN_DIR last|avg5|avg10   # the newest checkpoint, or the average of the last 5 or 10
checkpoint() {
  case $2 in
    last) ls -d "$1"/checkpoints/step-* | sort | tail -1 ;;
    avg5) echo "$1/checkpoints/average-last-5" ;;
    avg10) echo "$1/checkpoints/average-last-10" ;;
    *) echo "unknown final model $2 (last, avg5 or avg10)" >&2; return 1 ;;
  esac
}
