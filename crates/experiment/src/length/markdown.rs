//! `report.md` of a length study, section by section: the loss table, the paired effects of
//! log-n, QK-norm and context, attention entropy by position, BLEU by source length, and the
//! plots.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::{on_off, Effect, LengthReport};
use crate::report::stats::PairedDiff;

/// The whole report.
pub(super) fn markdown(r: &LengthReport) -> String {
    let mut md = String::new();
    let m = r.train_length;
    intro_and_losses(&mut md, r);
    if !r.warnings.is_empty() {
        md.push_str("**Missing evaluations** (the tables pair the seeds that are there):\n\n");
        for w in &r.warnings {
            md.push_str(&format!("- {w}\n"));
        }
        md.push('\n');
    }
    effect_table(
        &mut md,
        "Log-n scaling: loss with it on minus off (paired by seed; negative = log-n helps)",
        &r.logn_effects,
        &r.contexts,
    );
    effect_table(
        &mut md,
        "QK-norm: loss of each variant minus none (paired by seed; negative = the norm helps)",
        &r.qk_norm_effects,
        &r.contexts,
    );
    let longer: Vec<usize> = r.contexts.iter().copied().filter(|&c| c != m).collect();
    effect_table(
        &mut md,
        &format!(
            "Reach: loss at context N minus loss at the training length {m} (paired by seed; 0 = no worse)"
        ),
        &r.reach,
        &longer,
    );
    if let Some(&longest) = r.contexts.last() {
        entropy_section(&mut md, r, longest);
    }
    if !r.bleu_by_source_length.is_empty() {
        bleu_section(&mut md, r);
    }
    let _ = writeln!(md, "\n## Plots\n");
    for p in r.plots.iter().filter(|p| p.ends_with(".png")) {
        let _ = writeln!(md, "![{p}]({p})");
    }
    md
}

/// The title, what was measured, and validation loss by arm and context.
fn intro_and_losses(md: &mut String, r: &LengthReport) {
    let m = r.train_length;
    let _ = writeln!(
        md,
        "# Length generalisation: loss past the training length, by QK-norm variant and log-n scaling\n"
    );
    let _ = writeln!(
        md,
        "Language models trained at length m = {m}, evaluated on the validation split in windows of N \
         tokens (`ember eval RUN --context N --logn on|off`); {} seed{} per variant (paired: the same \
         seeds across variants). Log-n scaling multiplies a query that sees n > m keys by ln n / ln m; \
         it is a no-op at n ≤ m, so both arms of a variant are the same trained model. Intervals are \
         95% t intervals over seeds.\n",
        r.seeds.len(),
        if r.seeds.len() == 1 { "" } else { "s" }
    );
    let _ = writeln!(md, "## Validation loss by context (mean ± 95% CI half-width)\n");
    let header: Vec<String> = r.contexts.iter().map(|c| format!("N = {c}")).collect();
    let _ = writeln!(md, "| variant | log-n | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|---|{}", "---|".repeat(r.contexts.len()));
    for v in &r.variants {
        for logn in [false, true] {
            let cells: Vec<String> = r
                .contexts
                .iter()
                .map(|&c| {
                    r.losses
                        .iter()
                        .find(|a| &a.variant == v && a.logn == logn && a.context == c)
                        .map_or("–".into(), |a| match a.ci95 {
                            Some(h) => format!("{:.3} ± {h:.3}", a.mean),
                            None => format!("{:.3}", a.mean),
                        })
                })
                .collect();
            let _ = writeln!(md, "| {v} | {} | {} |", on_off(logn), cells.join(" | "));
        }
    }
}

/// A section of paired effects: one row per comparison, one column per context.
fn effect_table(md: &mut String, title: &str, effects: &[Effect], contexts: &[usize]) {
    let _ = writeln!(md, "\n## {title}\n");
    let header: Vec<String> = contexts.iter().map(|c| format!("N = {c}")).collect();
    let _ = writeln!(md, "| comparison | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|{}", "---|".repeat(contexts.len()));
    let whats: Vec<String> = {
        let mut seen = Vec::new();
        for e in effects {
            let key = e.what.split(": loss at").next().unwrap_or(&e.what).to_string();
            if !seen.contains(&key) {
                seen.push(key);
            }
        }
        seen
    };
    for w in whats {
        let cells: Vec<String> = contexts
            .iter()
            .map(|&c| {
                effects
                    .iter()
                    .find(|e| e.context == c && e.what.split(": loss at").next() == Some(w.as_str()))
                    .map_or("–".into(), |e| fmt_effect(&e.diff))
            })
            .collect();
        let _ = writeln!(md, "| {w} | {} |", cells.join(" | "));
    }
}

/// Attention entropy by position bucket at the longest context.
fn entropy_section(md: &mut String, r: &LengthReport, longest: usize) {
    let m = r.train_length;
    let _ = writeln!(
        md,
        "\n## Attention entropy by position at N = {longest} (nats, mean over layers, heads, windows and seeds)\n"
    );
    let _ = writeln!(
        md,
        "Entropy invariance (the design behind log-n scaling) predicts that with log-n on the \
         entropy past position {m} stays at its level within 1..{m}; without it, attention \
         spreads over the longer context and its entropy grows with ln n.\n"
    );
    let buckets: Vec<(usize, usize)> = r
        .entropy_buckets
        .iter()
        .map(|b| (b.first, b.last))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let header: Vec<String> = buckets.iter().map(|(f, l)| format!("{f}..{l}")).collect();
    let _ = writeln!(md, "| variant | log-n | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|---|{}", "---|".repeat(buckets.len()));
    for v in &r.variants {
        for logn in [false, true] {
            let cells: Vec<String> = buckets
                .iter()
                .map(|&(f, l)| {
                    r.entropy_buckets
                        .iter()
                        .find(|b| &b.variant == v && b.logn == logn && b.first == f && b.last == l)
                        .map_or("–".into(), |b| format!("{:.3}", b.entropy))
                })
                .collect();
            let _ = writeln!(md, "| {v} | {} | {} |", on_off(logn), cells.join(" | "));
        }
    }
}

/// Test BLEU of the translation runs by source length.
fn bleu_section(md: &mut String, r: &LengthReport) {
    let _ = writeln!(
        md,
        "\n## Translation: test BLEU by source length (Multi30k En→De test2016, the released runs of docs/results/multi30k-tiny)\n"
    );
    let _ = writeln!(
        md,
        "Source length in whitespace-separated words of the raw English source; `ember bleu --source` \
         scores each bucket's segments as a corpus (sacreBLEU's default signature). Mean over seeds; \
         the difference to none is paired by seed, with its 95% t interval.\n"
    );
    let _ = writeln!(md, "| variant | source words | sentences | BLEU | − none |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for b in &r.bleu_by_source_length {
        let range = match b.last {
            Some(l) => format!("{}–{l}", b.first),
            None => format!("{}+", b.first),
        };
        let diff = b.vs_none.as_ref().map_or("–".into(), fmt_effect);
        let _ = writeln!(
            md,
            "| {} | {range} | {} | {:.2} | {diff} |",
            b.variant, b.sentences, b.bleu
        );
    }
}

/// A paired difference with its interval: `-0.123 [-0.200, -0.046]`.
fn fmt_effect(d: &PairedDiff) -> String {
    match (d.ci_low, d.ci_high) {
        (Some(lo), Some(hi)) => format!("{:+.3} [{lo:+.3}, {hi:+.3}]", d.mean),
        _ => format!("{:+.3}", d.mean),
    }
}
