//! The checkpoint module's own cases: averaging while a run trains, a full disk, and the
//! state file read back bit for bit.

use super::*;

/// The shipped binary parses `state.json` exactly: serde_json's `float_roundtrip` is on among
/// its normal dependencies. Tests cannot see the parser's default (a dev-dependency,
/// jsonschema, turns the feature on for every test build), so this reads the build graph:
/// without the feature a resumed run logged one record an ulp off (the Multi30k study's
/// `none` seed 3, record at update 6,650).
#[test]
fn the_binary_reads_checkpoints_with_the_exact_float_parser() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "-p",
            "ember-trainer",
            "-e",
            "normal,features",
            "-i",
            "serde_json",
        ])
        .args(["--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        tree.contains(r#"serde_json feature "float_roundtrip""#),
        "serde_json's float_roundtrip is off in the normal build:\n{tree}"
    );
}

proptest::proptest! {
    /// The logging window's f64 sums come back from `state.json` with every bit, so a resumed
    /// run logs the records an uninterrupted one does.
    #[test]
    fn the_logging_window_survives_a_checkpoint_bit_for_bit(bits in proptest::prelude::any::<u64>()) {
        let x = f64::from_bits(bits);
        proptest::prop_assume!(x.is_finite());
        let window = LogWindow { loss: x, nll: x / 3.0, tokens: 7, grad_norm: x * 0.1, steps: 3, secs: x };
        let back: LogWindow = serde_json::from_str(&serde_json::to_string_pretty(&window).unwrap()).unwrap();
        proptest::prop_assert_eq!(back.loss.to_bits(), window.loss.to_bits());
        proptest::prop_assert_eq!(back.nll.to_bits(), window.nll.to_bits());
        proptest::prop_assert_eq!(back.grad_norm.to_bits(), window.grad_norm.to_bits());
    }
}

#[test]
fn average_says_the_checkpoints_are_being_written_when_a_run_is_training() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let step = run.join(CHECKPOINTS).join("step-00000002");
    fs::create_dir_all(&step).unwrap();
    fs::write(step.join(STATE), "{}").unwrap();
    // Nobody writes: the run simply has too few.
    let e = average(run, 2).unwrap_err().to_string();
    assert!(
        e.contains("fewer than --last 2") && !e.contains("being written"),
        "{e}"
    );
    // A run trains there now (it holds the run's lock): its checkpoints are being written.
    let _training = crate::run_lock::DirLock::acquire(run, "training run").unwrap();
    let e = average(run, 2).unwrap_err().to_string();
    assert!(
        e.contains("fewer than --last 2") && e.contains("being written") && e.contains("training now"),
        "{e}"
    );
}

#[test]
fn a_full_disk_says_where_and_that_earlier_checkpoints_are_intact() {
    let full = anyhow::Error::new(std::io::Error::from_raw_os_error(28))
        .context("writing run/checkpoints/.tmp-step-00000001-1/model.safetensors");
    let said = format!("{:#}", with_disk_hint(full, Path::new("run/checkpoints")));
    assert!(
        said.starts_with("the disk that holds run/checkpoints is full")
            && said.contains("those saved before it are intact")
            && said.contains("model.safetensors"),
        "{said}"
    );
    // Any other failure is left as it is.
    let other = anyhow::anyhow!("writing x: permission denied");
    assert_eq!(
        format!("{:#}", with_disk_hint(other, Path::new("run"))),
        "writing x: permission denied"
    );
}
