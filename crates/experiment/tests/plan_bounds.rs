//! Specification: a sweep's size is known before it is planned. The number of cells (settings ×
//! variants × learning rates × seeds) is computed arithmetically and equals what planning
//! enumerates; a grid above [`MAX_CELLS`] is refused at once, naming every factor, whatever
//! its size (2^64 − 1 seeds included); and planning stops when a stop signal arrives.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ember_experiment::ablate::{self, cell_count, AblateOptions, PlanningInterrupted, Runner, MAX_CELLS};
use ember_model::QkNorm;
use proptest::prelude::*;

fn options(dir: &std::path::Path) -> AblateOptions {
    let config = dir.join("cfg.yaml");
    std::fs::write(&config, seq2seq_yaml()).unwrap();
    let mut o = AblateOptions::new(config, Runner::InProcess);
    o.out = Some(dir.join("sweep"));
    o
}

const VARIANTS: [QkNorm; 4] = [QkNorm::None, QkNorm::Layernorm, QkNorm::Rmsnorm, QkNorm::L2];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Small grids of any shape: the arithmetic count is the plan's length.
    #[test]
    fn the_cell_count_is_what_planning_enumerates(
        levels in prop::collection::vec(1usize..4, 0..3),
        variants in 1usize..=4,
        lrs in 1usize..4,
        seeds in 1usize..4,
    ) {
        let tmp = tempdir();
        let mut o = options(tmp.path());
        o.variants = Some(VARIANTS[..variants].to_vec());
        o.lrs = Some((1..=lrs).map(|i| i as f64 * 1e-3).collect());
        o.seeds = Some(seeds);
        // Valid levels of real keys, so that every setting makes a valid config.
        let keys = ["train.label_smoothing", "train.z_loss", "train.weight_decay"];
        o.grid = Some(levels.iter().zip(keys).map(|(&n, key)| {
            format!("{key}={}", (0..n).map(|i| format!("0.0{i}")).collect::<Vec<_>>().join(","))
        }).collect());
        let plan = ablate::plan(&o).unwrap();
        prop_assert_eq!(plan.runs.len() as u128, cell_count(&levels, variants, lrs, seeds));
    }

    /// Any grid, however large: the count never overflows and never shrinks as a factor grows.
    #[test]
    fn the_cell_count_saturates_and_grows_with_every_factor(
        levels in prop::collection::vec(any::<usize>(), 0..8),
        variants in any::<usize>(),
        lrs in any::<usize>(),
        seeds in any::<usize>(),
    ) {
        let n = cell_count(&levels, variants, lrs, seeds);
        prop_assert!(cell_count(&levels, variants, lrs, seeds.saturating_add(1)) >= n);
        if levels.iter().chain([&variants, &lrs, &seeds]).all(|&k| k > 0) {
            prop_assert!(n >= 1);
        }
    }
}

#[test]
fn a_grid_above_the_limit_is_refused_at_once_naming_its_factors() {
    let tmp = tempdir();
    let mut o = options(tmp.path());
    let t0 = Instant::now();
    // Six axes of ten levels: 12 million cells with the default variants and seeds.
    o.grid = Some(
        (0..6)
            .map(|a| {
                format!(
                    "model.k{a}={}",
                    (0..10).map(|l| format!("v{l}")).collect::<Vec<_>>().join(",")
                )
            })
            .collect(),
    );
    let err = format!("{:#}", ablate::plan(&o).unwrap_err());
    assert!(
        err.contains("12000000 cells") && err.contains("10 levels of --grid model.k5"),
        "{err}"
    );
    assert!(err.contains(&MAX_CELLS.to_string()), "{err}");
    o.grid = None;
    o.seeds = Some(usize::MAX);
    let err = format!("{:#}", ablate::plan(&o).unwrap_err());
    assert!(err.contains(&format!("{} seed(s)", usize::MAX)), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "refused before enumerating anything"
    );
    assert!(!tmp.path().join("sweep").exists(), "nothing was written");
}

#[test]
fn planning_stops_at_a_stop_request() {
    let tmp = tempdir();
    let mut o = options(tmp.path());
    let stop = ember_trainer::interrupt::StopRequest::new();
    stop.request(ember_trainer::interrupt::STOP_SIGNALS[1].0);
    o.stop = Some(stop);
    o.grid = Some(vec!["train.label_smoothing=0.0,0.1".into()]);
    let err = ablate::plan(&o).unwrap_err();
    assert!(err.downcast_ref::<PlanningInterrupted>().is_some(), "{err:#}");
    assert!(err.to_string().contains("nothing was written"), "{err}");
}
