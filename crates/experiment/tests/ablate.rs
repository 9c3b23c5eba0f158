//! Specification of `ember ablate` and its report: runs are paired by seed (shared parameters
//! start identical, batches come in the same order), the sweep is resumable, divergence is a
//! result and a crash a recorded failure, the report regenerates byte-for-byte, and its
//! statistics are right.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::{DType, Device};
use common::*;
use ember_data::Dataset;
use ember_experiment::ablate::{self, AblateOptions, RunAction, RunStatus, Runner};
use ember_experiment::layout;
use ember_experiment::report::{self, stats};
use ember_model::{init_model, QkNorm};
use ember_trainer::config::RunConfig;
use ember_trainer::run_dir::{RUN_CONFIG, SUMMARY};
use ember_trainer::{make_batcher, train};

/// The tiny translation config, written to `dir/tiny.yaml`.
fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.yaml");
    fs::write(&path, seq2seq_yaml()).unwrap();
    path
}

fn sweep(dir: &Path, variants: &[QkNorm], seeds: usize, lrs: &[f64], overrides: &[&str]) -> AblateOptions {
    let mut o = AblateOptions::new(write_config(dir), Runner::InProcess);
    o.variants = Some(variants.to_vec());
    o.seeds = Some(seeds);
    o.lrs = Some(lrs.to_vec());
    o.out = Some(dir.join("out"));
    o.overrides = overrides.iter().map(|s| s.to_string()).collect();
    o.quiet = true;
    o
}

fn by_name(outcome: &ablate::AblateOutcome) -> BTreeMap<String, (RunAction, RunStatus)> {
    outcome
        .runs
        .iter()
        .map(|r| (r.name.clone(), (r.action.clone(), r.status.clone())))
        .collect()
}

fn stored_config(run_dir: &Path) -> RunConfig {
    RunConfig::load(&run_dir.join(RUN_CONFIG), &[]).unwrap()
}

/// Every parameter as raw f32 bits, by name, as training initialises it for this run.
fn initial_params(cfg: &RunConfig) -> BTreeMap<String, Vec<u32>> {
    let (_, params) = init_model(&cfg.model, cfg.train.seed, DType::F32, &Device::Cpu).unwrap();
    params
        .vars()
        .into_iter()
        .map(|(name, var)| {
            let v: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            (name, v.into_iter().map(f32::to_bits).collect())
        })
        .collect()
}

#[test]
fn for_a_seed_every_variant_starts_from_the_same_shared_weights_and_batches() {
    let tmp = tempdir();
    let variants = [QkNorm::None, QkNorm::Rmsnorm, QkNorm::L2];
    let opts = sweep(
        tmp.path(),
        &variants,
        2,
        &[3e-3],
        &["train.steps=2", "eval.every=0", "checkpoint.every=0"],
    );
    let outcome = ablate::ablate(&opts).unwrap();
    assert_eq!(outcome.runs.len(), 6);
    assert!(
        outcome.runs.iter().all(|r| r.status == RunStatus::Ok),
        "{:#?}",
        outcome.runs
    );

    let dir = |v: QkNorm, s: u64| {
        outcome
            .plan
            .out
            .join("runs")
            .join(layout::run_name("", v, 3e-3, s))
    };
    let mut first_params = vec![];
    for seed in [1u64, 2] {
        let base_cfg = stored_config(&dir(QkNorm::None, seed));
        assert_eq!(base_cfg.train.seed, seed);
        let base = initial_params(&base_cfg);
        let base_data = Dataset::prepare(&base_cfg.data, Some(&dir(QkNorm::None, seed))).unwrap();
        let base_batch = make_batcher(&base_cfg, &base_data).unwrap().next_batch();
        let base_tok = fs::read(dir(QkNorm::None, seed).join("tokenizer.json")).unwrap();
        for v in &variants[1..] {
            let run = dir(*v, seed);
            let cfg = stored_config(&run);
            assert_eq!((cfg.model.qk_norm, cfg.train.seed), (*v, seed));
            let params = initial_params(&cfg);
            // `none` has no parameter of its own: all of its parameters are shared.
            for (name, bits) in &base {
                let other = params.get(name).unwrap_or_else(|| panic!("{v:?} lacks {name}"));
                assert!(
                    other == bits,
                    "seed {seed}: {name} differs at init between none and {v:?}"
                );
            }
            assert!(params.len() > base.len(), "{v:?} adds its QK-norm parameters");
            assert_eq!(
                fs::read(run.join("tokenizer.json")).unwrap(),
                base_tok,
                "same tokenizer"
            );
            let data = Dataset::prepare(&cfg.data, Some(&run)).unwrap();
            let batch = make_batcher(&cfg, &data).unwrap().next_batch();
            assert_eq!(
                batch, base_batch,
                "seed {seed}: the first batch differs for {v:?}"
            );
        }
        first_params.push((base, base_batch));
    }
    assert!(
        first_params[0].0 != first_params[1].0,
        "another seed initialises differently"
    );
    assert!(
        first_params[0].1 != first_params[1].1,
        "another seed orders the data differently"
    );

    // grid.json names every run and its exact command.
    let grid: layout::Plan =
        serde_json::from_str(&fs::read_to_string(outcome.plan.out.join(layout::GRID)).unwrap()).unwrap();
    assert_eq!(grid.runs.len(), 6);
    let cmd = grid.runs[0].command.join(" ");
    assert!(
        cmd.contains(" train ")
            && cmd.contains("--set model.qk_norm=none")
            && cmd.contains("--set train.seed=1"),
        "{cmd}"
    );
    assert!(
        cmd.contains("--set train.lr=3.0e-3") && cmd.ends_with("--quiet --json"),
        "{cmd}"
    );
}

#[test]
fn rerunning_skips_finished_runs_resumes_interrupted_ones_and_refuses_a_changed_config() {
    let tmp = tempdir();
    let opts = sweep(
        tmp.path(),
        &[QkNorm::None, QkNorm::Rmsnorm],
        2,
        &[3e-3],
        &["train.steps=6", "eval.every=3", "checkpoint.every=2"],
    );
    let plan = ablate::plan(&opts).unwrap();
    assert_eq!(plan.runs.len(), 4);
    // Interrupt two runs: one stopped cleanly after 2 steps (summary says unfinished), one
    // killed after its step-4 checkpoint (no summary at all).
    let interrupt = |i: usize, steps: u64| {
        let run = &plan.runs[i];
        let cfg = ablate::run_config(&plan, run).unwrap();
        let mut o = opts_for(&run.dir);
        o.stop_after = Some(steps);
        let s = train(cfg, &o).unwrap();
        assert!(!s.finished);
    };
    interrupt(0, 2);
    interrupt(1, 4);
    fs::remove_file(plan.runs[1].dir.join(SUMMARY)).unwrap();
    assert_eq!(
        layout::disk_state(&plan.runs[0].dir),
        layout::DiskState::Interrupted { step: 2 }
    );
    assert_eq!(
        layout::disk_state(&plan.runs[1].dir),
        layout::DiskState::Interrupted { step: 4 }
    );

    let first = ablate::ablate(&opts).unwrap();
    let actions: Vec<RunAction> = first.runs.iter().map(|r| r.action.clone()).collect();
    assert_eq!(
        actions,
        [
            RunAction::Resumed { from_step: 2 },
            RunAction::Resumed { from_step: 4 },
            RunAction::Started,
            RunAction::Started
        ]
    );
    assert!(first
        .runs
        .iter()
        .all(|r| r.status == RunStatus::Ok && r.steps == Some(6)));
    for run in &plan.runs[..2] {
        let steps: Vec<u64> = losses(&run.dir).into_iter().map(|(s, _)| s).collect();
        assert_eq!(
            steps,
            (1..=6).collect::<Vec<_>>(),
            "each step logged exactly once"
        );
    }

    let second = ablate::ablate(&opts).unwrap();
    assert!(second
        .runs
        .iter()
        .all(|r| r.action == RunAction::Skipped && r.status == RunStatus::Ok));
    assert!(!second.any_failed());
    let status: layout::SweepStatus =
        serde_json::from_str(&fs::read_to_string(plan.out.join(layout::STATUS)).unwrap()).unwrap();
    assert_eq!(status.invocations.len(), 2);
    assert_eq!(
        (status.invocations[0].executed, status.invocations[1].skipped),
        (4, 4)
    );
    assert_eq!(
        status.runs["none-lr3e-3-seed1"].action, "resumed",
        "a skip keeps the record of the run"
    );

    // The same output directory with another config is refused up front, naming the runs and
    // the key, and nothing is touched (not even the plan).
    let mut changed = opts.clone();
    changed.overrides.push("train.warmup_steps=1".into());
    let before = fs::read(plan.runs[0].dir.join(SUMMARY)).unwrap();
    let grid_before = fs::read(plan.out.join(layout::GRID)).unwrap();
    let status_before = fs::read(plan.out.join(layout::STATUS)).unwrap();
    let err = format!("{:#}", ablate::ablate(&changed).unwrap_err());
    assert!(
        err.contains("train.warmup_steps")
            && err.contains("none-lr3e-3-seed1")
            && err.contains("Nothing was run"),
        "{err}"
    );
    assert_eq!(fs::read(plan.runs[0].dir.join(SUMMARY)).unwrap(), before);
    assert_eq!(fs::read(plan.out.join(layout::GRID)).unwrap(), grid_before);
    assert_eq!(fs::read(plan.out.join(layout::STATUS)).unwrap(), status_before);
}

fn opts_for(run_dir: &Path) -> ember_trainer::TrainOptions {
    opts(run_dir)
}

/// One sweep with a learning rate that diverges, shared by the tests that read its results.
fn divergent_sweep() -> &'static (PathBuf, ablate::AblateOutcome) {
    static SWEEP: OnceLock<(PathBuf, ablate::AblateOutcome)> = OnceLock::new();
    SWEEP.get_or_init(|| {
        // In cargo's per-target scratch directory (not /tmp), replaced on every test run.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ablate-divergent-sweep");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let opts = sweep(
            &dir,
            &[QkNorm::None, QkNorm::Rmsnorm],
            2,
            &[3e-3, 1e3],
            &[
                "train.steps=4",
                "eval.every=2",
                "checkpoint.every=2",
                "train.divergence_evals=1",
            ],
        );
        let outcome = ablate::ablate(&opts).unwrap();
        (dir, outcome)
    })
}

#[test]
fn a_diverging_run_is_recorded_as_diverged_and_the_sweep_goes_on() {
    let (_, outcome) = divergent_sweep();
    assert_eq!(outcome.runs.len(), 8);
    for r in &outcome.runs {
        match (r.lr > 1.0, &r.status) {
            (true, RunStatus::Diverged { reason }) => assert!(!reason.is_empty()),
            (false, RunStatus::Ok) => {}
            other => panic!("{}: {other:?}", r.name),
        }
    }
    assert!(!outcome.any_failed(), "diverged runs are results, not failures");
    let rep = &outcome.report;
    assert_eq!(
        (
            rep.counts.runs,
            rep.counts.ok,
            rep.counts.diverged,
            rep.counts.failed
        ),
        (8, 4, 4, 0)
    );
    let cell = rep
        .cells
        .iter()
        .find(|c| c.variant == "rmsnorm" && c.lr > 1.0)
        .unwrap();
    assert_eq!((cell.counts.diverged, cell.val_loss), (2, None));
    let cell = rep
        .cells
        .iter()
        .find(|c| c.variant == "rmsnorm" && c.lr < 1.0)
        .unwrap();
    assert_eq!(cell.val_loss.unwrap().n, 2);
    let d = &cell.vs_none["val_loss"];
    assert_eq!(d.n, 2);
    assert!(d.ci_low.unwrap() <= d.mean && d.mean <= d.ci_high.unwrap());

    // LR sensitivity per seed: mean over the two LRs of min(loss, loss at init) − best.
    assert!(
        rep.init_loss_source.contains("recorded"),
        "{}",
        rep.init_loss_source
    );
    for s in &rep.lr_sensitivity {
        assert_eq!(s.per_seed.len(), 2, "{}", s.variant);
        for (&seed, &value) in &s.per_seed {
            let run = |big: bool| {
                rep.runs
                    .iter()
                    .find(|r| r.variant == s.variant && r.seed == seed && (r.lr > 1.0) == big)
                    .unwrap()
            };
            let init = run(false).init_val_loss.or(run(true).init_val_loss).unwrap();
            let ok = run(false).val_loss.unwrap().min(init);
            let div = run(true)
                .val_loss
                .filter(|l| l.is_finite())
                .map_or(init, |l| l.min(init));
            let best = ok.min(div);
            let expected = ((ok - best) + (div - best)) / 2.0;
            assert!((value - expected).abs() < 1e-12, "{value} vs {expected}");
        }
    }
    let md = fs::read_to_string(outcome.plan.out.join(layout::REPORT_MD)).unwrap();
    assert!(md.contains("| rmsnorm | 1e3 | 0/2, 2 div. |"), "{md}");
    assert!(md.contains("## LR sensitivity") && md.contains("diverged"));
    // A translation sweep over several learning rates also gets final BLEU against the LR.
    for plot in ["loss_lr3e-3", "max_logit_lr3e-3", "val_loss_vs_lr", "bleu_vs_lr"] {
        let png = fs::read(outcome.plan.out.join("plots").join(format!("{plot}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = fs::read_to_string(outcome.plan.out.join("plots").join(format!("{plot}.svg"))).unwrap();
        assert!(svg.contains("<svg") && (svg.contains("step") || plot.ends_with("_vs_lr")));
    }
}

#[test]
fn the_report_opens_with_the_seeds_table_then_the_plots_and_names_the_vector_unit() {
    let (_, outcome) = divergent_sweep();
    let md = fs::read_to_string(outcome.plan.out.join(layout::REPORT_MD)).unwrap();
    let sections: Vec<&str> = md.lines().filter(|l| l.starts_with("## ")).collect();
    assert_eq!(
        &sections[..3],
        ["## QK-norm vs baseline", "## Plots", "## All final values"],
        "{md}"
    );
    let table = md
        .split("## QK-norm vs baseline")
        .nth(1)
        .unwrap()
        .split("## Plots")
        .next()
        .unwrap();
    let q = if outcome.report.quality == "bleu" {
        "BLEU"
    } else {
        "val ppl"
    };
    let head = format!(
        "| variant | peak LR | {q} | Δ {q} vs none [95% CI] | val loss | Δ val loss vs none [95% CI] | max attn logit |"
    );
    assert!(table.contains(&head), "{table}");
    // One row per variant and learning rate; `none` is the baseline of its own row.
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| none") || l.starts_with("| rmsnorm"))
        .collect();
    assert_eq!(rows.len(), outcome.report.cells.len(), "{table}");
    assert!(rows
        .iter()
        .filter(|r| r.starts_with("| none"))
        .all(|r| r.contains("(baseline)")));
    let unit = ember_kernels::vector_unit();
    assert_eq!(
        outcome.report.hardware.as_ref().unwrap().vector_unit.as_deref(),
        Some(unit)
    );
    assert!(md.contains(&format!("logical cores, {unit} kernels)")), "{md}");
    assert!(md.contains("EMBER_CPU_VECTOR_UNIT=avx2"), "{md}");
    // An f32 sweep names its products' precision and instructions on the same line.
    let products = ember_kernels::Precision::F32.cpu_products();
    assert!(md.contains(&format!("kernels), {products}")), "{md}");
}

/// `--set train.precision=bf16` sweeps in bf16 mixed precision: every run's config says so, and
/// the report's hardware line names the precision and the instructions, AMX's tiles where the CPU
/// has them (`--grid train.precision=f32,bf16` both, f32 first).
#[test]
fn a_bf16_sweep_trains_every_run_in_bf16_and_its_report_names_the_instructions() {
    // bf16 on any CPU: natively where it has AVX512_BF16, else emulated with the same bits.
    ember_kernels::emulate_bf16_products();
    let tmp = tempdir();
    let mut opts = sweep(
        tmp.path(),
        &[QkNorm::None, QkNorm::Rmsnorm],
        1,
        &[3e-3],
        &[
            "train.steps=2",
            "eval.every=0",
            "checkpoint.every=0",
            "train.precision=bf16",
        ],
    );
    let outcome = ablate::ablate(&opts).unwrap();
    for run in &outcome.plan.runs {
        let cfg = stored_config(&outcome.plan.out.join("runs").join(&run.name));
        assert_eq!(
            cfg.train.precision,
            ember_kernels::Precision::Bf16,
            "{}",
            run.name
        );
    }
    let md = fs::read_to_string(outcome.plan.out.join(layout::REPORT_MD)).unwrap();
    // A CPU with AMX runs the products on its tiles; one without, on AVX512_BF16's dot products;
    // one without those, in the emulation.
    let instructions = if ember_kernels::Precision::Bf16.cpu_unit() == "AMX" {
        "bf16 products on AMX-BF16 (tdpbf16ps), f32 sums"
    } else if ember_kernels::bf16_emulated() {
        "bf16 products emulated in software (vdpbf16ps's bits), f32 sums"
    } else {
        "bf16 products on AVX512_BF16 (vdpbf16ps), f32 sums"
    };
    assert!(md.contains(instructions), "{md}");

    opts.out = Some(tmp.path().join("both"));
    opts.overrides.pop();
    opts.grid = Some(vec!["train.precision=f32,bf16".into()]);
    let outcome = ablate::ablate(&opts).unwrap();
    let products = outcome.plan.hardware.products.clone().unwrap();
    assert_eq!(
        products,
        format!(
            "{}; {}",
            ember_kernels::Precision::F32.cpu_products(),
            ember_kernels::Precision::Bf16.cpu_products()
        )
    );
}

/// Copies a directory tree.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            fs::copy(e.path(), target).unwrap();
        }
    }
}

fn snapshot(out: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for name in [layout::REPORT_MD, layout::REPORT_JSON] {
        files.insert(name.to_string(), fs::read(out.join(name)).unwrap());
    }
    for e in fs::read_dir(out.join(layout::PLOTS)).unwrap() {
        let e = e.unwrap();
        files.insert(
            format!("plots/{}", e.file_name().to_string_lossy()),
            fs::read(e.path()).unwrap(),
        );
    }
    files
}

/// A scratch copy of the divergent sweep's output directory, alive as long as the returned
/// directory handle.
fn copy_of_divergent_sweep() -> (tempfile::TempDir, PathBuf) {
    let (_, outcome) = divergent_sweep();
    let tmp = tempdir();
    let out = tmp.path().join("copy");
    copy_tree(&outcome.plan.out, &out);
    (tmp, out)
}

#[test]
fn the_report_regenerates_identically_without_training() {
    let (_, outcome) = divergent_sweep();
    let (_tmp, out) = copy_of_divergent_sweep();
    report::report(&out).unwrap();
    let before = snapshot(&out);
    assert!(
        before.keys().filter(|k| k.ends_with(".png")).count() >= 5,
        "{:?}",
        before.keys()
    );
    assert_eq!(
        before.keys().filter(|k| k.ends_with(".png")).count(),
        before.keys().filter(|k| k.ends_with(".svg")).count()
    );
    fs::remove_file(out.join(layout::REPORT_MD)).unwrap();
    fs::remove_file(out.join(layout::REPORT_JSON)).unwrap();
    fs::remove_dir_all(out.join(layout::PLOTS)).unwrap();
    let again = report::report(&out).unwrap();
    assert_eq!(snapshot(&out), before, "regenerated files differ");
    // Plots do not depend on where the directory lives.
    for (name, bytes) in &before {
        if name.starts_with("plots/") {
            assert!(fs::read(outcome.plan.out.join(name)).unwrap() == *bytes, "{name}");
        }
    }
    assert_eq!(again.counts.diverged, 4);
}

#[test]
fn a_plot_names_the_seeds_behind_each_line_when_the_variants_have_different_counts() {
    let (_, outcome) = divergent_sweep();
    let (_tmp, out) = copy_of_divergent_sweep();
    // As if rmsnorm's second seed at 3e-3 were still to run: its line there is one seed, not a mean.
    fs::remove_dir_all(out.join("runs").join("rmsnorm-lr3e-3-seed2")).unwrap();
    report::report(&out).unwrap();
    let svg = |stem: &str| fs::read_to_string(out.join("plots").join(format!("{stem}.svg"))).unwrap();
    let uneven = svg("loss_lr3e-3");
    assert!(
        uneven.contains("rmsnorm (1 seed)") && uneven.contains("none (2 seeds)"),
        "{uneven}"
    );
    assert!(!uneven.contains("mean over 2 seeds"), "{uneven}");
    // Across the rates, rmsnorm has both seeds at some and one at 3e-3: a range, not "2 seeds".
    let across = svg("val_loss_vs_lr");
    assert!(across.contains("rmsnorm (1–2 seeds)"), "{across}");
    assert!(!across.contains("mean over 2 seeds"), "{across}");
    // Where every variant has both seeds, the count is said once, in the title.
    let even = fs::read_to_string(outcome.plan.out.join("plots").join("loss_lr3e-3.svg")).unwrap();
    assert!(even.contains("mean over 2 seeds"), "{even}");
    assert!(
        !even.contains("(2 seeds)") && !even.contains("(1 seed)"),
        "{even}"
    );
}

#[test]
fn a_crashing_run_is_recorded_as_failed_with_its_stderr_and_the_sweep_goes_on() {
    // A stand-in for `ember`: it writes a finished summary for `none` and crashes for `rmsnorm`.
    let tmp = tempdir();
    let exe = tmp.path().join("fake-ember");
    fs::write(
        &exe,
        r#"#!/bin/sh
dir=""; prev=""
for a in "$@"; do
  if [ "$prev" = "--run-dir" ]; then dir="$a"; fi
  prev="$a"
done
echo "$@" > "$dir/args.txt"
case "$*" in
  *model.qk_norm=rmsnorm*) echo "loading the config" >&2; echo "error: simulated crash" >&2; exit 3 ;;
esac
printf '{"finished": true, "steps": 4, "total_steps": 4, "diverged": null, "val_loss": 1.5, "tokens_per_sec": 100.0}' > "$dir/summary.json"
"#,
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut opts = sweep(
        tmp.path(),
        &[QkNorm::None, QkNorm::Rmsnorm],
        2,
        &[3e-3],
        &["train.steps=4"],
    );
    opts.runner = Runner::Process { exe: exe.clone() };
    opts.jobs = Some(2);
    opts.threads = Some(1);
    let outcome = ablate::ablate(&opts).unwrap();
    assert_eq!(outcome.plan.threads, Some(1));
    assert_eq!(outcome.runs.len(), 4, "every run was attempted");
    for r in &outcome.runs {
        match (r.variant, &r.status) {
            (QkNorm::None, RunStatus::Ok) => {}
            (QkNorm::Rmsnorm, RunStatus::Failed { error, stderr_tail }) => {
                assert_eq!(error, "exit status 3");
                assert_eq!(stderr_tail, "loading the config\nerror: simulated crash");
            }
            other => panic!("{}: {other:?}", r.name),
        }
    }
    assert!(outcome.any_failed());
    assert_eq!(outcome.failed().len(), 2);
    let args = fs::read_to_string(outcome.runs[0].run_dir.join("args.txt")).unwrap();
    // The runs train from the copy of the config the sweep keeps (it moves with the sweep).
    let config = outcome.plan.out.join(layout::BASE_CONFIG);
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        fs::read_to_string(tmp.path().join("tiny.yaml")).unwrap()
    );
    assert_eq!(
        args.trim(),
        format!(
            "train {} --set train.steps=4 --set model.qk_norm=none --set train.seed=1 --set train.lr=3.0e-3 \
             --set train.threads=1 --run-dir {} --quiet --json",
            config.display(),
            outcome.runs[0].run_dir.display()
        )
    );
    let md = fs::read_to_string(outcome.plan.out.join(layout::REPORT_MD)).unwrap();
    assert!(md.contains("error: simulated crash"), "{md}");
    assert_eq!(outcome.report.counts.failed, 2);

    // Again: the finished runs are skipped, the failed ones tried again.
    let again = ablate::ablate(&opts).unwrap();
    let m = by_name(&again);
    assert_eq!(m["none-lr3e-3-seed1"], (RunAction::Skipped, RunStatus::Ok));
    assert_eq!(m["rmsnorm-lr3e-3-seed2"].0, RunAction::Started);
}

#[test]
fn flags_override_the_ablation_section_which_overrides_the_defaults() {
    let tmp = tempdir();
    let path = tmp.path().join("cfg.yaml");
    fs::write(
        &path,
        seq2seq_yaml() + "ablation:\n  variants: [none, l2]\n  seeds: 2\n  lrs: [1.0e-3, 2.0e-3]\n  jobs: 2\n  threads: 1\n",
    )
    .unwrap();
    let exe = Runner::Process { exe: "ember".into() };
    let plan = ablate::plan(&AblateOptions::new(&path, exe.clone())).unwrap();
    assert_eq!(plan.variants, [QkNorm::None, QkNorm::L2]);
    assert_eq!(
        (plan.seeds.clone(), plan.lrs.clone(), plan.jobs, plan.threads),
        (vec![1, 2], vec![1e-3, 2e-3], 2, Some(1))
    );
    assert_eq!(plan.out, PathBuf::from("runs/cfg-ablation"));
    assert_eq!(plan.runs.len(), 8);
    assert_eq!(plan.runs[1].name, "l2-lr1e-3-seed1");

    let mut o = AblateOptions::new(&path, exe);
    o.variants = Some(ablate::parse_variants("rmsnorm,none").unwrap());
    o.seeds = Some(1);
    o.lrs = Some(ablate::parse_lrs("3e-2").unwrap());
    o.jobs = Some(1);
    o.threads = Some(3);
    o.out = Some(tmp.path().join("x"));
    let plan = ablate::plan(&o).unwrap();
    assert_eq!(
        plan.runs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["rmsnorm-lr3e-2-seed1", "none-lr3e-2-seed1"]
    );
    assert!(plan.runs[0].overrides.contains(&"train.threads=3".to_string()));

    // Without an ablation section: the four variants, 3 seeds, train.lr.
    let bare = tmp.path().join("bare.yaml");
    fs::write(&bare, seq2seq_yaml()).unwrap();
    let plan = ablate::plan(&AblateOptions::new(&bare, Runner::InProcess)).unwrap();
    assert_eq!(
        plan.variants,
        [QkNorm::None, QkNorm::Rmsnorm, QkNorm::Layernorm, QkNorm::L2]
    );
    assert_eq!(
        (plan.seeds.len(), plan.lrs.clone(), plan.jobs, plan.threads),
        (3, vec![3e-3], 1, None)
    );

    assert!(ablate::parse_variants("none,l3").is_err());
    assert!(ablate::parse_lrs("1e-3,-1").is_err());
}

#[test]
fn the_sections_set_list_applies_to_every_run_and_the_command_line_wins() {
    let tmp = tempdir();
    let path = tmp.path().join("cfg.yaml");
    fs::write(
        &path,
        seq2seq_yaml() + "ablation:\n  seeds: 1\n  set: [train.steps=7, eval.every=7]\n",
    )
    .unwrap();
    let mut o = AblateOptions::new(&path, Runner::InProcess);
    o.overrides = vec!["eval.every=3".into()];
    let plan = ablate::plan(&o).unwrap();
    for run in &plan.runs {
        let cfg = ablate::run_config(&plan, run).unwrap();
        assert_eq!((cfg.train.steps, cfg.eval.every), (Some(7), 3), "{}", run.name);
    }
    // A bad key in the list is an error naming it, before anything is trained.
    fs::write(&path, seq2seq_yaml() + "ablation:\n  set: [train.stepz=7]\n").unwrap();
    let err = format!(
        "{:#}",
        ablate::plan(&AblateOptions::new(&path, Runner::InProcess)).unwrap_err()
    );
    assert!(err.contains("stepz"), "{err}");
}

#[test]
fn t_quantiles_match_the_tables() {
    for (df, t) in [
        (1.0, 12.706),
        (2.0, 4.303),
        (4.0, 2.776),
        (9.0, 2.262),
        (30.0, 2.042),
        (1e6, 1.960),
    ] {
        let q = stats::t_quantile(0.975, df);
        assert!((q - t).abs() < 5e-4, "t(0.975, {df}) = {q}, tables say {t}");
    }
    assert!((stats::t_quantile(0.995, 5.0) - 4.032).abs() < 5e-4);
    assert!((stats::t_quantile(0.025, 2.0) + 4.303).abs() < 5e-4);
    for df in [1.0, 2.5, 7.0] {
        for p in [0.6, 0.9, 0.99] {
            assert!((stats::t_cdf(stats::t_quantile(p, df), df) - p).abs() < 1e-12);
        }
    }
}

#[test]
fn paired_differences_and_lr_sensitivity_on_hand_made_numbers() {
    // Differences 0.5, 1.0, 0.5: mean 2/3, sd √(1/12), se = sd/√3 = 1/6, t(0.975, 2) = 4.302653.
    let a = [Some(1.0), Some(2.0), Some(3.0), None];
    let b = [Some(0.5), Some(1.0), Some(2.5), Some(9.0)];
    let d = stats::paired_diff(&a, &b, 0.95).unwrap();
    assert_eq!(d.n, 3, "a seed missing on one side is left out");
    assert!((d.mean - 2.0 / 3.0).abs() < 1e-12);
    assert!((d.std - (1.0f64 / 12.0).sqrt()).abs() < 1e-12);
    let half = 4.302_652_729_911_275 / 6.0;
    assert!((d.ci_low.unwrap() - (2.0 / 3.0 - half)).abs() < 1e-9);
    assert!((d.ci_high.unwrap() - (2.0 / 3.0 + half)).abs() < 1e-9);
    let one = stats::paired_diff(&[Some(1.0)], &[Some(0.25)], 0.95).unwrap();
    assert_eq!((one.mean, one.n, one.ci_low), (0.75, 1, None));
    assert!(stats::paired_diff(&[None], &[Some(1.0)], 0.95).is_none());

    let m = stats::mean_std(&[1.0, 2.0, 3.0, f64::NAN]).unwrap();
    assert_eq!((m.mean, m.std, m.n), (2.0, 1.0, 3));

    // Losses at four LRs, loss at init 5: capped [2, 1.5, 5, 5], best 1.5 → mean(0.5, 0, 3.5, 3.5).
    let s = stats::lr_sensitivity(&[2.0, 1.5, f64::NAN, 9.0], 5.0).unwrap();
    assert!((s - 1.875).abs() < 1e-12);
    assert_eq!(stats::lr_sensitivity(&[3.0], 5.0), Some(0.0));
}
