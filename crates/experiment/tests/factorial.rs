//! Specification of factorial sweeps (`ember ablate --grid KEY=V1,V2`, or `ablation.grid`): every
//! combination of the axes' levels is crossed with the variants, learning rates and seeds; runs
//! are named by their levels; bad axes are refused before anything runs; and the report pairs
//! each variant with `none` inside a setting and pools the QK-norm effect per level of each axis.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use common::*;
use ember_experiment::ablate::{self, AblateOptions, Runner};
use ember_experiment::layout::{self, Axis};
use ember_experiment::report::{self, stats};
use ember_model::Positions;

const TWO_AXES: &str = "ablation:
  variants: [none, rmsnorm]
  seeds: 2
  lrs: [1.0e-3, 2.0e-3]
  grid:
    - model.positions=rope,learned
    - train.label_smoothing=0.0,0.1
";

fn axis(key: &str, values: &[&str]) -> Axis {
    Axis {
        key: key.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

fn plan_of(config: &Path, grid: Option<&[&str]>) -> anyhow::Result<layout::Plan> {
    let mut o = AblateOptions::new(config, Runner::InProcess);
    o.grid = grid.map(|g| g.iter().map(|s| s.to_string()).collect());
    ablate::plan(&o)
}

#[test]
fn every_combination_of_levels_is_crossed_with_variants_lrs_and_seeds() {
    let tmp = tempdir();
    let path = tmp.path().join("cfg.yaml");
    fs::write(&path, seq2seq_yaml() + TWO_AXES).unwrap();
    let plan = plan_of(&path, None).unwrap();
    assert_eq!(
        plan.axes,
        [
            axis("model.positions", &["rope", "learned"]),
            axis("train.label_smoothing", &["0.0", "0.1"])
        ]
    );
    assert_eq!(plan.runs.len(), 2 * 2 * 2 * 2 * 2);
    let names: BTreeSet<&str> = plan.runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), plan.runs.len(), "run names are unique");
    // Seed slowest, then the levels (first axis slowest), then learning rate, then variant.
    let first: Vec<&str> = plan.runs[..5].iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        first,
        [
            "positions-rope_label_smoothing-0.0_none-lr1e-3-seed1",
            "positions-rope_label_smoothing-0.0_rmsnorm-lr1e-3-seed1",
            "positions-rope_label_smoothing-0.0_none-lr2e-3-seed1",
            "positions-rope_label_smoothing-0.0_rmsnorm-lr2e-3-seed1",
            "positions-rope_label_smoothing-0.1_none-lr1e-3-seed1",
        ]
    );
    assert!(plan.runs[..16].iter().all(|r| r.seed == 1));
    for run in &plan.runs {
        let cfg = ablate::run_config(&plan, run).unwrap();
        let positions = if run.levels[0] == "rope" {
            Positions::Rope
        } else {
            Positions::Learned
        };
        assert_eq!(cfg.model.positions, positions, "{}", run.name);
        assert_eq!(cfg.train.label_smoothing, run.levels[1].parse::<f64>().unwrap());
        assert_eq!(cfg.model.qk_norm, run.variant, "{}", run.name);
        assert!(run.name.starts_with(&format!(
            "positions-{}_label_smoothing-{}_",
            run.levels[0], run.levels[1]
        )));
    }

    // --grid replaces the section's axes; one value is a one-level axis.
    let plan = plan_of(&path, Some(&["model.dropout=0.2"])).unwrap();
    assert_eq!(plan.axes, [axis("model.dropout", &["0.2"])]);
    assert_eq!(plan.runs.len(), 2 * 2 * 2);
    assert_eq!(plan.runs[0].name, "dropout-0.2_none-lr1e-3-seed1");
    assert_eq!(
        ablate::run_config(&plan, &plan.runs[0]).unwrap().model.dropout,
        0.2
    );

    // Two axes ending in the same key part are named by their whole keys.
    let plan = plan_of(&path, Some(&["model.dropout=0.0", "model.attn_dropout=0.0"])).unwrap();
    assert_eq!(
        plan.runs[0].name,
        "dropout-0.0_attn_dropout-0.0_none-lr1e-3-seed1"
    );
    let plan = plan_of(&path, Some(&["model.dropout=0.0", "x.dropout=0.0"]));
    assert!(plan.is_err(), "x.dropout is not a key");

    // Without axes, names and plans are as before.
    let bare = tmp.path().join("bare.yaml");
    fs::write(&bare, seq2seq_yaml()).unwrap();
    let plan = plan_of(&bare, None).unwrap();
    assert!(plan.axes.is_empty());
    assert!(plan
        .runs
        .iter()
        .all(|r| r.levels.is_empty() && !r.name.contains('_')));
    let json = serde_json::to_string(&plan).unwrap();
    assert!(
        !json.contains("\"axes\"") && !json.contains("\"levels\""),
        "{json}"
    );
}

#[test]
fn a_bad_axis_is_refused_before_anything_runs_with_what_to_do() {
    let tmp = tempdir();
    let path = tmp.path().join("cfg.yaml");
    fs::write(&path, seq2seq_yaml()).unwrap();
    let err = |grid: &[&str]| format!("{:#}", plan_of(&path, Some(grid)).unwrap_err());
    assert!(err(&["model.qk_norm=none,l2"]).contains("use --variants"));
    assert!(err(&["train.lr=1e-3,1e-2"]).contains("use --lrs"));
    assert!(err(&["train.seed=1,2"]).contains("use --seeds"));
    assert!(err(&["model.positions"]).contains("expected KEY=V1,V2"));
    assert!(err(&["=rope"]).contains("key before '=' is empty"));
    assert!(err(&["model.positions=rope,,learned"]).contains("empty value"));
    assert!(err(&["model.positions=rope", "model.positions=learned"]).contains("given twice"));
    let e = err(&["model.positionz=rope,learned"]);
    assert!(e.contains("positionz") && e.contains("--grid"), "{e}");
    let e = err(&["model.positions=rope,sideways"]);
    assert!(
        e.contains("model.positions=sideways") && e.contains("positions"),
        "{e}"
    );
    // A value's characters that a file name should not hold become '-' in run names.
    let path_axis = [axis("data.corpus.path", &[])];
    assert_eq!(
        layout::levels_label(&path_axis, &["data/x y.txt".into()]),
        "path-data-x-y.txt"
    );
    // Nothing was written.
    assert!(!tmp.path().join("runs").exists());
}

#[test]
fn the_report_pairs_within_a_setting_and_pools_the_effect_per_level() {
    let tmp = tempdir();
    let path = tmp.path().join("cfg.yaml");
    fs::write(&path, seq2seq_yaml() + TWO_AXES).unwrap();
    let mut o = AblateOptions::new(&path, Runner::InProcess);
    o.out = Some(tmp.path().join("out"));
    o.overrides = ["train.steps=4", "eval.every=2", "checkpoint.every=4"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    o.quiet = true;
    let outcome = ablate::ablate(&o).unwrap();
    assert!(outcome.failed().is_empty());
    let r = outcome.report;
    assert_eq!(r.axes.len(), 2);
    assert_eq!(r.cells.len(), 4 * 2 * 2, "settings × variants × LRs");
    assert_eq!(r.lr_sensitivity.len(), 4 * 2, "settings × variants");

    // A run's final validation loss, from its own summary.json.
    let val = |levels: &[&str], v: &str, lr: &str, seed: u64| -> f64 {
        let name = format!(
            "positions-{}_label_smoothing-{}_{v}-lr{lr}-seed{seed}",
            levels[0], levels[1]
        );
        let s = layout::read_summary(&r.out_dir.join("runs").join(&name)).unwrap();
        s["val_loss"].as_f64().unwrap()
    };
    // Cells pair rmsnorm with none of the same setting, learning rate and seed.
    for c in r.cells.iter().filter(|c| c.variant == "rmsnorm") {
        let lv: Vec<&str> = c.levels.iter().map(String::as_str).collect();
        let lr = layout::lr_label(c.lr);
        let d: Vec<f64> = [1, 2]
            .iter()
            .map(|&s| val(&lv, "rmsnorm", &lr, s) - val(&lv, "none", &lr, s))
            .collect();
        let got = &c.vs_none["val_loss"];
        assert_eq!(got.n, 2);
        assert!((got.mean - (d[0] + d[1]) / 2.0).abs() < 1e-9, "{lv:?} {lr}");
    }
    // LR sensitivity by hand: per setting, variant and seed, from the final losses and ln(vocab).
    let l0 = (r.runs[0].vocab_size.unwrap() as f64).ln();
    let sens = |lv: &[&str], v: &str, seed: u64| -> f64 {
        let losses = [val(lv, v, "1e-3", seed), val(lv, v, "2e-3", seed)];
        stats::lr_sensitivity(&losses, l0).unwrap()
    };
    // The effect of rmsnorm at positions=learned pools both label-smoothing levels × 2 seeds.
    let e = r
        .axis_effects
        .iter()
        .find(|e| e.axis == "model.positions" && e.level == "learned" && e.variant == "rmsnorm")
        .unwrap();
    let mut d = vec![];
    for ls in ["0.0", "0.1"] {
        for seed in [1, 2] {
            let lv = ["learned", ls];
            d.push(sens(&lv, "rmsnorm", seed) - sens(&lv, "none", seed));
        }
    }
    let want = stats::mean_std(&d).unwrap();
    let got = e.vs_none.as_ref().unwrap();
    assert_eq!((got.n, e.settings), (4, 2));
    assert!((got.mean - want.mean).abs() < 1e-9 && (got.std - want.std).abs() < 1e-9);
    assert_eq!(r.axis_effects.len(), 2 * 2, "axes × levels × one variant");

    // report.md: the axes as columns, the effect section, a final-loss figure per setting.
    let md = fs::read_to_string(r.out_dir.join(layout::REPORT_MD)).unwrap();
    assert!(
        md.contains("| positions | label_smoothing | variant | LR sensitivity |"),
        "{md}"
    );
    assert!(md.contains("## QK-norm effect by axis"));
    assert!(
        md.contains("| `model.positions` | learned | rmsnorm | 4 (2) |"),
        "{md}"
    );
    for setting in ["rope_label_smoothing-0.0", "learned_label_smoothing-0.1"] {
        let png = format!("plots/positions-{setting}_val_loss_vs_lr.png");
        assert!(r.plots.contains(&png), "{png} in {:?}", r.plots);
        assert!(r.out_dir.join(&png).is_file());
    }
    // Regenerated from the directories alone, byte for byte.
    let before = fs::read(r.out_dir.join(layout::REPORT_JSON)).unwrap();
    fs::remove_file(r.out_dir.join(layout::REPORT_JSON)).unwrap();
    report::report(&r.out_dir).unwrap();
    assert_eq!(fs::read(r.out_dir.join(layout::REPORT_JSON)).unwrap(), before);
}
