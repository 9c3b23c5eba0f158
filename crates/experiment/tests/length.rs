//! Specification of `ember length-report`: it pairs the evaluations of a length study by seed
//! and reports loss by context per arm, the paired effects of log-n and of each QK-norm variant,
//! the reach past the training length, attention entropy by position bucket, BLEU by source
//! length, and the plots — here on evaluations written by hand, so every number is known.

use std::fs;
use std::path::Path;

use ember_experiment::length::{length_report, EVALS, MULTI30K, SWEEP};
use ember_trainer::context::{bucket_edges, ContextEval, PositionBucket};

const M: usize = 4;

/// A run's config as `ember ablate` writes it: what the report reads is the variant and seed.
fn write_run(dir: &Path, name: &str, qk_norm: &str, seed: u64) {
    let run = dir.join(SWEEP).join("runs").join(name);
    fs::create_dir_all(&run).unwrap();
    let yaml = format!(
        "model: {{ arch: lm, d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32, max_seq_len: {M}, qk_norm: {qk_norm} }}\n\
         data:\n  corpus: {{ kind: text, path: input.txt }}\n  tokenizer: {{ kind: char }}\n\
         train: {{ steps: 1, seed: {seed}, lr: 1.0e-3, batch_size: 2, block_size: {M} }}\n"
    );
    fs::write(run.join("config.yaml"), yaml).unwrap();
}

/// An evaluation whose loss at every position is `base + slope · ln(position / M)` past M and
/// `base` up to M, and whose entropy is ln(position) without log-n and flat past M with it.
fn eval(context: usize, logn: bool, base: f64, slope: f64) -> ContextEval {
    let loss_by_position: Vec<f64> = (1..=context)
        .map(|p| {
            base + if p > M {
                slope * (p as f64 / M as f64).ln()
            } else {
                0.0
            }
        })
        .collect();
    let entropy_by_position: Vec<f64> = (1..=context)
        .map(|p| (p.min(if logn { M } else { p }) as f64).ln())
        .collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let buckets = bucket_edges(context, M)
        .into_iter()
        .map(|(first, last)| PositionBucket {
            first,
            last,
            loss: mean(&loss_by_position[first - 1..last]),
            entropy: mean(&entropy_by_position[first - 1..last]),
            tokens: (last - first + 1) as u64,
        })
        .collect();
    let loss = mean(&loss_by_position);
    ContextEval {
        context,
        train_length: M,
        beyond_training: context > M,
        logn_attention: logn,
        logn_length: logn.then_some(M),
        windows: 1,
        tokens: context as u64,
        loss,
        ppl: loss.exp(),
        buckets,
        loss_by_position,
        entropy_by_position,
    }
}

fn write_eval(dir: &Path, name: &str, e: &ContextEval) {
    let d = dir.join(EVALS).join(name);
    fs::create_dir_all(&d).unwrap();
    let file = d.join(format!(
        "context-{}-logn-{}.json",
        e.context,
        if e.logn_attention { "on" } else { "off" }
    ));
    fs::write(file, serde_json::to_string(e).unwrap()).unwrap();
}

#[test]
fn the_report_pairs_seeds_and_states_loss_by_context_logn_and_qk_norm_effects_and_reach() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Two variants × three seeds; seed s shifts every loss by 0.01·s (paired differences are
    // then exact). Past M the baseline degrades with slope 0.3 and log-n does not help it;
    // rmsnorm degrades with slope 0.4 without log-n and 0.1 with it.
    for (variant, slopes) in [("none", (0.3, 0.3)), ("rmsnorm", (0.4, 0.1))] {
        for seed in 1..=3u64 {
            let name = format!("{variant}-lr1e-3-seed{seed}");
            write_run(dir, &name, variant, seed);
            let base = 2.0 - if variant == "rmsnorm" { 0.05 } else { 0.0 } + 0.01 * seed as f64;
            for context in [M, 4 * M, 8 * M] {
                write_eval(dir, &name, &eval(context, false, base, slopes.0));
                write_eval(dir, &name, &eval(context, true, base, slopes.1));
            }
        }
    }
    let r = length_report(dir).unwrap();
    assert_eq!(r.train_length, M);
    assert_eq!(r.contexts, vec![M, 4 * M, 8 * M]);
    assert_eq!(r.variants, vec!["none", "rmsnorm"]);
    assert_eq!(r.seeds, vec![1, 2, 3]);

    // Mean over seeds 2.0 + 0.02 at the training length, with a t interval from their spread.
    let at_m = r
        .losses
        .iter()
        .find(|a| a.variant == "none" && !a.logn && a.context == M)
        .unwrap();
    assert!((at_m.mean - 2.02).abs() < 1e-12);
    assert_eq!(at_m.seeds, 3);
    // std 0.01, t(0.975, 2) = 4.303: half-width 4.303 · 0.01 / √3.
    assert!((at_m.ci95.unwrap() - 4.302653 * 0.01 / 3f64.sqrt()).abs() < 1e-6);

    // Log-n changes nothing at M; past it, for rmsnorm, exactly the designed difference.
    let effect = |what: &str, context: usize| {
        r.logn_effects
            .iter()
            .chain(&r.qk_norm_effects)
            .chain(&r.reach)
            .find(|e| e.what == what && e.context == context)
            .unwrap_or_else(|| panic!("no {what} at {context}"))
            .diff
    };
    assert_eq!(effect("rmsnorm: log-n on − off", M).mean, 0.0);
    let mean_log = |n: usize| (M + 1..=n).map(|p| (p as f64 / M as f64).ln()).sum::<f64>() / n as f64;
    let logn_gain = effect("rmsnorm: log-n on − off", 8 * M);
    assert!((logn_gain.mean - (0.1 - 0.4) * mean_log(8 * M)).abs() < 1e-9);
    assert!(logn_gain.std < 1e-9, "the same for every seed");
    assert!(effect("none: log-n on − off", 8 * M).mean.abs() < 1e-12);
    // rmsnorm − none, paired by seed: −0.05 at M.
    assert!((effect("rmsnorm − none (log-n off)", M).mean + 0.05).abs() < 1e-12);
    // Reach: loss at 8M minus at M within each seed.
    let reach = effect("none, log-n off: loss at 32 − at 4", 8 * M);
    assert!((reach.mean - 0.3 * mean_log(8 * M)).abs() < 1e-9);

    // Entropy buckets at the longest context: flat past M with log-n, growing without it.
    let bucket = |variant: &str, logn: bool, first: usize| {
        r.entropy_buckets
            .iter()
            .find(|b| b.variant == variant && b.logn == logn && b.first == first)
            .unwrap()
            .entropy
    };
    assert!((bucket("none", true, 17) - (M as f64).ln()).abs() < 1e-12);
    assert!(bucket("none", false, 17) > bucket("none", false, 5));

    let md = fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| rmsnorm | on | 1.970 ± "), "{md}");
    assert!(md.contains("| rmsnorm: log-n on − off | +0.000"), "{md}");
    assert!(
        md.contains("Reach: loss at context N minus loss at the training length 4"),
        "{md}"
    );
    assert!(!md.contains("Translation"), "no translation runs, no BLEU table");
    for p in &r.plots {
        assert!(dir.join(p).is_file(), "{p}");
    }
    assert_eq!(r.plots.len(), 12, "3 figures × log-n off/on × PNG and SVG");
    let json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["contexts"], serde_json::json!([4, 16, 32]));
}

#[test]
fn translation_runs_get_bleu_by_source_length_paired_to_none() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_run(dir, "none-lr1e-3-seed1", "none", 1);
    write_eval(dir, "none-lr1e-3-seed1", &eval(M, false, 2.0, 0.0));
    fs::create_dir_all(dir.join(MULTI30K)).unwrap();
    for (variant, seed, short, long) in [
        ("none", 1, 30.0, 20.0),
        ("none", 2, 32.0, 21.0),
        ("rmsnorm", 1, 31.0, 19.0),
        ("rmsnorm", 2, 34.0, 19.0),
    ] {
        let json = serde_json::json!({
            "bleu": {"score": 0.0},
            "bleu_by_source_length": [
                {"first": 0, "last": 10, "sentences": 400, "score": {"score": short}},
                {"first": 11, "last": null, "sentences": 600, "score": {"score": long}},
            ],
        });
        fs::write(
            dir.join(MULTI30K)
                .join(format!("{variant}-lr5e-3-seed{seed}.json")),
            json.to_string(),
        )
        .unwrap();
    }
    let r = length_report(dir).unwrap();
    let rms: Vec<_> = r
        .bleu_by_source_length
        .iter()
        .filter(|b| b.variant == "rmsnorm")
        .collect();
    assert_eq!(rms.len(), 2);
    assert_eq!((rms[0].first, rms[0].last, rms[0].sentences), (0, Some(10), 400));
    assert!((rms[0].bleu - 32.5).abs() < 1e-12);
    assert!(
        (rms[0].vs_none.unwrap().mean - 1.5).abs() < 1e-12,
        "(+1, +2) paired"
    );
    assert!(
        (rms[1].vs_none.unwrap().mean + 1.5).abs() < 1e-12,
        "(−1, −2) paired"
    );
    let md = fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| rmsnorm | 11+ | 600 | 19.00 | -1.500"), "{md}");
}

#[test]
fn a_study_directory_without_evaluations_is_an_error_that_says_what_to_run() {
    let tmp = tempfile::tempdir().unwrap();
    let err = length_report(tmp.path()).unwrap_err();
    assert!(format!("{err:#}").contains("scripts/length-study.sh"), "{err:#}");
}
