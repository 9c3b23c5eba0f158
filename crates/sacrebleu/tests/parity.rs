//! sacreBLEU parity: every case in `fixtures/expected.json` (made by
//! `scripts/make-bleu-fixtures.py` with sacreBLEU itself) must reproduce
//! sacreBLEU's score to 0.01, its n-gram statistics and lengths exactly, and
//! its signature and formatted score line character for character.  The
//! remaining tests state individual rules of sacreBLEU as specifications.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ember_sacrebleu::{
    bleu_tokens, corpus_bleu, corpus_chrf, sentence_bleu, sentence_chrf, BleuConfig, ChrfConfig,
    SacreBleuError, Smooth, Tokenize, SACREBLEU_VERSION,
};
use serde_json::Value;

/// The task's tolerance for scores; in practice the difference is ~1e-13.
const SCORE_TOLERANCE: f64 = 0.01;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn expected() -> Value {
    let path = fixture_dir().join("expected.json");
    let text = std::fs::read_to_string(&path).expect("read expected.json");
    serde_json::from_str(&text).expect("parse expected.json")
}

/// Segments are `\n`-terminated; split on `\n` only, because the fixtures
/// deliberately contain other characters Python treats as line or word
/// separators (U+001C..U+001F, NBSP, ...).
fn read_lines(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(fixture_dir().join(name)).expect("read fixture corpus");
    text.split_terminator('\n').map(str::to_string).collect()
}

fn corpus(expected: &Value, name: &str, nrefs: usize) -> (Vec<String>, Vec<Vec<String>>) {
    let files = &expected["corpora"][name];
    let hyps = read_lines(files["hyp"].as_str().expect("hyp file name"));
    let refs = files["refs"].as_array().expect("ref file names")[..nrefs]
        .iter()
        .map(|f| read_lines(f.as_str().expect("ref file name")))
        .collect();
    (hyps, refs)
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("integer"))
        .collect()
}

fn f64_of(v: &Value) -> f64 {
    v.as_f64().expect("number")
}

/// A score stored as Python's `repr()`: Rust's `str::parse` is correctly
/// rounded, so this is sacreBLEU's float to the last bit.
fn repr_f64(v: &Value) -> f64 {
    v.as_str().expect("repr string").parse().expect("float repr")
}

fn bleu_config(options: &Value) -> BleuConfig {
    let smooth_value = options["smooth_value"].as_f64();
    BleuConfig {
        tokenize: options["tokenize"]
            .as_str()
            .expect("tokenize")
            .parse()
            .expect("tokenizer"),
        lowercase: options["lowercase"].as_bool().expect("lowercase"),
        smooth: Smooth::from_name(options["smooth_method"].as_str().expect("smooth"), smooth_value)
            .expect("smoothing method"),
        effective_order: options["effective_order"].as_bool().expect("effective_order"),
    }
}

fn chrf_config(options: &Value) -> ChrfConfig {
    let int = |key: &str| options[key].as_u64().expect("integer option");
    let flag = |key: &str| options[key].as_bool().expect("bool option");
    ChrfConfig {
        char_order: int("char_order") as usize,
        word_order: int("word_order") as usize,
        beta: int("beta") as u32,
        lowercase: flag("lowercase"),
        whitespace: flag("whitespace"),
        eps_smoothing: flag("eps_smoothing"),
    }
}

fn cases<'a>(expected: &'a Value, metric: &str) -> Vec<&'a Value> {
    let all = expected["cases"].as_array().expect("cases");
    all.iter().filter(|c| c["metric"] == metric).collect()
}

#[test]
fn fixtures_were_generated_with_the_pinned_sacrebleu_version() {
    assert_eq!(expected()["sacrebleu_version"], SACREBLEU_VERSION);
}

#[test]
fn corpus_bleu_matches_sacrebleu_on_every_fixture() {
    let expected = expected();
    let cases = cases(&expected, "bleu");
    assert!(
        cases.len() >= 60,
        "expected the full BLEU fixture matrix, got {}",
        cases.len()
    );
    let mut failures = Vec::new();
    let mut max_diff: f64 = 0.0;
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let want = &case["expected"];
        let nrefs = case["nrefs"].as_u64().expect("nrefs") as usize;
        let corpus_name = case["corpus"].as_str().expect("corpus");
        let (hyps, refs) = corpus(&expected, corpus_name, nrefs);
        let got = corpus_bleu(&hyps, &refs, &bleu_config(&case["options"])).expect("score");

        let diff = (got.score - repr_f64(&want["score_repr"])).abs();
        max_diff = max_diff.max(diff);
        let mut check = |ok: bool, what: &str, ours: String, theirs: String| {
            if !ok {
                failures.push(format!("{name}: {what}: ours {ours} sacreBLEU {theirs}"));
            }
        };
        check(
            diff <= SCORE_TOLERANCE,
            "score",
            got.score.to_string(),
            want["score"].to_string(),
        );
        check(
            got.counts == u64s(&want["counts"]),
            "counts",
            format!("{:?}", got.counts),
            want["counts"].to_string(),
        );
        check(
            got.totals == u64s(&want["totals"]),
            "totals",
            format!("{:?}", got.totals),
            want["totals"].to_string(),
        );
        check(
            Some(got.sys_len) == want["sys_len"].as_u64(),
            "sys_len",
            got.sys_len.to_string(),
            want["sys_len"].to_string(),
        );
        check(
            Some(got.ref_len) == want["ref_len"].as_u64(),
            "ref_len",
            got.ref_len.to_string(),
            want["ref_len"].to_string(),
        );
        check(
            (got.bp - f64_of(&want["bp"])).abs() <= 1e-12,
            "bp",
            got.bp.to_string(),
            want["bp"].to_string(),
        );
        check(
            (got.ratio - f64_of(&want["ratio"])).abs() <= 1e-12,
            "ratio",
            got.ratio.to_string(),
            want["ratio"].to_string(),
        );
        let want_precisions: Vec<f64> = want["precisions"]
            .as_array()
            .expect("precisions")
            .iter()
            .map(f64_of)
            .collect();
        let precisions_ok = got.precisions.len() == want_precisions.len()
            && got
                .precisions
                .iter()
                .zip(&want_precisions)
                .all(|(a, b)| (a - b).abs() <= 1e-9);
        check(
            precisions_ok,
            "precisions",
            format!("{:?}", got.precisions),
            format!("{want_precisions:?}"),
        );
        check(
            got.signature == want["signature"],
            "signature",
            got.signature.clone(),
            want["signature"].to_string(),
        );
        check(
            got.format() == want["formatted"],
            "formatted",
            got.format(),
            want["formatted"].to_string(),
        );
    }
    println!(
        "BLEU: {} cases, max |ours - sacreBLEU| = {max_diff:e}",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn corpus_chrf_matches_sacrebleu_on_every_fixture() {
    let expected = expected();
    let cases = cases(&expected, "chrf");
    assert!(
        cases.len() >= 40,
        "expected the full chrF fixture matrix, got {}",
        cases.len()
    );
    let mut failures = Vec::new();
    let mut max_diff: f64 = 0.0;
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let want = &case["expected"];
        let nrefs = case["nrefs"].as_u64().expect("nrefs") as usize;
        let corpus_name = case["corpus"].as_str().expect("corpus");
        let (hyps, refs) = corpus(&expected, corpus_name, nrefs);
        let got = corpus_chrf(&hyps, &refs, &chrf_config(&case["options"])).expect("score");

        let diff = (got.score - repr_f64(&want["score_repr"])).abs();
        max_diff = max_diff.max(diff);
        if diff > SCORE_TOLERANCE {
            failures.push(format!(
                "{name}: score ours {} sacreBLEU {}",
                got.score, want["score"]
            ));
        }
        let flat: Vec<u64> = got
            .stats
            .iter()
            .flat_map(|s| [s.hyp, s.reference, s.matched])
            .collect();
        if flat != u64s(&want["stats"]) {
            failures.push(format!("{name}: stats ours {flat:?} sacreBLEU {}", want["stats"]));
        }
        if got.signature != want["signature"] {
            failures.push(format!(
                "{name}: signature {} vs {}",
                got.signature, want["signature"]
            ));
        }
        if got.format() != want["formatted"] {
            failures.push(format!(
                "{name}: formatted {} vs {}",
                got.format(),
                want["formatted"]
            ));
        }
    }
    println!(
        "chrF: {} cases, max |ours - sacreBLEU| = {max_diff:e}",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn sentence_bleu_and_chrf_match_sacrebleu_sentence_functions() {
    let expected = expected();
    let rows = expected["sentence"].as_array().expect("sentence rows");
    assert!(!rows.is_empty());
    let mut max_diff: f64 = 0.0;
    for row in rows {
        let hyp = row["hyp"].as_str().expect("hyp");
        let refs: Vec<&str> = row["refs"]
            .as_array()
            .expect("refs")
            .iter()
            .map(|r| r.as_str().expect("ref"))
            .collect();
        let bleu = sentence_bleu(hyp, &refs, &BleuConfig::sentence()).expect("bleu");
        let chrf = sentence_chrf(hyp, &refs, &ChrfConfig::default()).expect("chrf");
        for (ours, key) in [(bleu.score, "bleu"), (chrf.score, "chrf")] {
            let diff = (ours - repr_f64(&row[key])).abs();
            max_diff = max_diff.max(diff);
            assert!(
                diff <= SCORE_TOLERANCE,
                "{key} of {hyp:?}: ours {ours} sacreBLEU {}",
                row[key]
            );
        }
    }
    println!("sentence level: {} segments, max diff {max_diff:e}", rows.len());
}

#[test]
fn tokenizers_reproduce_sacrebleu_on_tricky_and_random_inputs() {
    let expected = expected();
    let rows = expected["tokenization"].as_array().expect("tokenization rows");
    let mut failures = Vec::new();
    for row in rows {
        let input = row["input"].as_str().expect("input");
        for (tokenize, lowercase, key) in [
            (Tokenize::Mteval13a, false, "13a"),
            (Tokenize::Intl, false, "intl"),
            (Tokenize::None, false, "none"),
            (Tokenize::Mteval13a, true, "13a_lc"),
        ] {
            let ours = bleu_tokens(input, tokenize, lowercase).join(" ");
            if ours != row[key] {
                failures.push(format!(
                    "{key} of {input:?}: ours {ours:?} sacreBLEU {}",
                    row[key]
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn mismatched_line_counts_are_an_error_naming_both_counts() {
    let hyps = vec!["a b c".to_string(), "d e f".to_string()];
    let refs = vec![vec!["a b c".to_string()]];
    let err = corpus_bleu(&hyps, &refs, &BleuConfig::default()).unwrap_err();
    assert_eq!(
        err,
        SacreBleuError::LineCountMismatch {
            stream: 0,
            hyps: 2,
            refs: 1
        }
    );
    let message = err.to_string();
    assert!(message.contains('2') && message.contains('1'), "{message}");
    let err = corpus_chrf(&hyps, &refs, &ChrfConfig::default()).unwrap_err();
    assert_eq!(
        err,
        SacreBleuError::LineCountMismatch {
            stream: 0,
            hyps: 2,
            refs: 1
        }
    );
}

#[test]
fn a_short_second_reference_stream_is_reported_by_its_index() {
    let hyps = ["x", "y"];
    let refs = vec![vec!["x", "y"], vec!["x", "y", "z"]];
    let err = corpus_bleu(&hyps, &refs, &BleuConfig::default()).unwrap_err();
    assert_eq!(
        err,
        SacreBleuError::LineCountMismatch {
            stream: 1,
            hyps: 2,
            refs: 3
        }
    );
}

#[test]
fn an_empty_corpus_or_no_reference_stream_is_an_error() {
    let none: [&str; 0] = [];
    let no_streams: Vec<Vec<&str>> = Vec::new();
    assert_eq!(
        corpus_bleu(&none, &[none.to_vec()], &BleuConfig::default()),
        Err(SacreBleuError::EmptyCorpus)
    );
    assert_eq!(
        corpus_bleu(&["a"], &no_streams, &BleuConfig::default()),
        Err(SacreBleuError::NoReferences)
    );
    assert_eq!(
        corpus_chrf(&["a"], &no_streams, &ChrfConfig::default()),
        Err(SacreBleuError::NoReferences)
    );
    let no_orders = ChrfConfig {
        char_order: 0,
        ..ChrfConfig::default()
    };
    assert_eq!(
        corpus_chrf(&["a"], &[["a"]], &no_orders),
        Err(SacreBleuError::ZeroChrfOrder)
    );
}

#[test]
fn empty_lines_are_zero_length_segments_not_errors() {
    let hyps = ["", "the cat sat on the mat", ""];
    let refs = [["the dog", "the cat sat on the mat", ""]];
    let bleu = corpus_bleu(&hyps, &refs, &BleuConfig::default()).expect("empty lines are valid");
    assert_eq!(bleu.sys_len, 6);
    // Closest reference length of an empty hypothesis vs "the dog" is 2.
    assert_eq!(bleu.ref_len, 8);
    let chrf = corpus_chrf(&hyps, &refs, &ChrfConfig::default()).expect("empty lines are valid");
    assert!(chrf.score > 0.0);
    let all_empty = corpus_bleu(&[""], &[[""]], &BleuConfig::default()).expect("valid");
    assert_eq!((all_empty.score, all_empty.bp, all_empty.ratio), (0.0, 1.0, 0.0));
}

#[test]
fn identical_text_scores_100_and_disjoint_text_scores_0() {
    let text = ["Ein Mann schläft in einem grünen Raum auf einem Sofa."];
    let bleu = corpus_bleu(&text, &[text], &BleuConfig::default()).expect("score");
    // exp(mean(log(100))) is 100.00000000000004 in sacreBLEU too.
    assert!((bleu.score - 100.0).abs() < 1e-9);
    assert_eq!(bleu.score_string(), "100.00");
    assert_eq!(
        corpus_chrf(&text, &[text], &ChrfConfig::default())
            .expect("score")
            .score,
        100.0
    );
    let other = ["xyz qwv"];
    assert_eq!(
        corpus_bleu(&other, &[text], &BleuConfig::default())
            .expect("score")
            .score,
        0.0
    );
}

#[test]
fn brevity_penalty_is_exp_of_one_minus_ref_over_hyp_length() {
    let bleu = corpus_bleu(&["a b"], &[["a b c d"]], &BleuConfig::default()).expect("score");
    assert_eq!((bleu.sys_len, bleu.ref_len), (2, 4));
    assert_eq!(bleu.bp, (1.0f64 - 4.0 / 2.0).exp());
    // A longer hypothesis is never rewarded: BP stays 1.
    let long = corpus_bleu(&["a b c d e"], &[["a b c d"]], &BleuConfig::default()).expect("score");
    assert_eq!(long.bp, 1.0);
}

#[test]
fn closest_reference_length_breaks_ties_towards_the_shorter_reference() {
    // Hypothesis of 3 tokens, references of 2 and 4 tokens: both 1 away.
    let bleu = corpus_bleu(&["a b c"], &[["a b c d"], ["a b"]], &BleuConfig::default()).expect("score");
    assert_eq!(bleu.ref_len, 2);
}

#[test]
fn reference_ngram_counts_clip_at_the_maximum_over_references() {
    // "the" occurs twice in the second reference, so two of the hypothesis'
    // three "the" match.
    let bleu = corpus_bleu(
        &["the the the"],
        &[["the cat"], ["the the"]],
        &BleuConfig::default(),
    )
    .expect("score");
    assert_eq!(bleu.counts[0], 2);
    assert_eq!(bleu.totals[0], 3);
}

#[test]
fn exp_smoothing_halves_the_precision_of_each_further_zero_order() {
    // 2 unigram matches, no higher-order matches.
    let bleu = corpus_bleu(&["b x a y"], &[["a b"]], &BleuConfig::default()).expect("score");
    assert_eq!(bleu.counts, [2, 0, 0, 0]);
    assert_eq!(bleu.totals, [4, 3, 2, 1]);
    assert_eq!(
        bleu.precisions,
        [50.0, 100.0 / (2.0 * 3.0), 100.0 / (4.0 * 2.0), 100.0 / 8.0]
    );
    let none = BleuConfig {
        smooth: Smooth::None,
        ..BleuConfig::default()
    };
    assert_eq!(
        corpus_bleu(&["b x a y"], &[["a b"]], &none).expect("score").score,
        0.0
    );
}

#[test]
fn tokenizer_13a_separates_punctuation_but_not_number_separators() {
    let tokens = |s: &str| bleu_tokens(s, Tokenize::Mteval13a, false).join(" ");
    assert_eq!(tokens("Es kostet 1.000,50 Euro."), "Es kostet 1.000,50 Euro .");
    assert_eq!(tokens("It's $1,000.50 (3-4)!"), "It's $ 1,000.50 ( 3 - 4 ) !");
    assert_eq!(tokens("AT&amp;T <skipped>"), "AT & T");
    // 13a only knows ASCII punctuation; unicode quotes stay attached.
    assert_eq!(tokens("„Hallo“ — sagte er…"), "„Hallo“ — sagte er…");
}

#[test]
fn tokenizer_intl_separates_unicode_punctuation_and_symbols() {
    let tokens = |s: &str| bleu_tokens(s, Tokenize::Intl, false).join(" ");
    assert_eq!(tokens("„Hallo“ — sagte er…"), "„ Hallo “ — sagte er …");
    assert_eq!(tokens("Preis: 1.000,50 €"), "Preis : 1.000,50 €");
    // mteval-v14 quirk kept by sacreBLEU: a number keeps a sentence-final period.
    assert_eq!(tokens("Im Jahr 2019."), "Im Jahr 2019.");
}

#[test]
fn lowercase_option_changes_case_and_signature() {
    let cfg = BleuConfig {
        lowercase: true,
        ..BleuConfig::default()
    };
    let bleu = corpus_bleu(&["THE CAT SAT DOWN"], &[["the cat sat down"]], &cfg).expect("score");
    assert_eq!(bleu.counts, [4, 3, 2, 1]);
    assert!(bleu.signature.contains("case:lc"));
}

#[test]
fn signatures_and_score_lines_follow_sacrebleu_format() {
    let bleu = corpus_bleu(&["a b c d e"], &[["a b c d f"]], &BleuConfig::default()).expect("score");
    let v = SACREBLEU_VERSION;
    assert_eq!(
        bleu.signature,
        format!("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{v}")
    );
    assert_eq!(
        bleu.format(),
        format!(
            "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{v} = 66.87 \
             80.0/75.0/66.7/50.0 (BP = 1.000 ratio = 1.000 hyp_len = 5 ref_len = 5)"
        )
    );
    let floor = BleuConfig {
        smooth: Smooth::Floor(0.1),
        ..BleuConfig::default()
    };
    assert!(floor.signature(2).starts_with("nrefs:2|") && floor.signature(2).contains("smooth:floor[0.10]"));
    let chrf = corpus_chrf(&["a b"], &[["a b"]], &ChrfConfig::default()).expect("score");
    assert_eq!(
        chrf.format(),
        format!("chrF2|nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{v} = 100.00")
    );
    let plus = ChrfConfig::chrf_plus_plus();
    assert_eq!(plus.name(), "chrF2++");
    assert_eq!(
        plus.signature(1),
        format!("nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:{v}")
    );
}

#[test]
fn option_names_parse_like_sacrebleu_cli_values() {
    assert_eq!("13a".parse::<Tokenize>(), Ok(Tokenize::Mteval13a));
    assert_eq!("intl".parse::<Tokenize>(), Ok(Tokenize::Intl));
    assert_eq!("none".parse::<Tokenize>(), Ok(Tokenize::None));
    assert!(matches!(
        "zh".parse::<Tokenize>(),
        Err(SacreBleuError::UnknownTokenizer(_))
    ));
    assert_eq!(Smooth::from_name("floor", None), Ok(Smooth::Floor(0.1)));
    assert_eq!(Smooth::from_name("add-k", Some(2.0)), Ok(Smooth::AddK(2.0)));
    assert_eq!(Smooth::from_name("exp", None), Ok(Smooth::Exp));
    assert!(Smooth::from_name("laplace", None).is_err());
    assert_eq!(BleuConfig::default().smooth, Smooth::Exp);
}

#[test]
fn scores_serialise_to_json_with_their_sufficient_statistics() {
    let bleu = corpus_bleu(&["a b c"], &[["a b c"]], &BleuConfig::default()).expect("score");
    let json = serde_json::to_value(&bleu).expect("serialise");
    for key in [
        "score",
        "counts",
        "totals",
        "precisions",
        "bp",
        "ratio",
        "sys_len",
        "ref_len",
        "signature",
    ] {
        assert!(json.get(key).is_some(), "missing {key} in {json}");
    }
    let chrf = corpus_chrf(&["a b c"], &[["a b c"]], &ChrfConfig::default()).expect("score");
    let json = serde_json::to_value(&chrf).expect("serialise");
    assert_eq!(
        json["stats"][0],
        serde_json::json!({"hyp": 3, "ref": 3, "match": 3})
    );
}

#[test]
fn a_thousand_sentence_corpus_scores_in_milliseconds() {
    let expected = expected();
    let (hyps, refs) = corpus(&expected, "multi30k", 2);
    let hyps: Vec<String> = hyps.iter().cycle().take(1000).cloned().collect();
    let refs: Vec<Vec<String>> = refs
        .iter()
        .map(|s| s.iter().cycle().take(1000).cloned().collect())
        .collect();
    let start = Instant::now();
    let bleu = corpus_bleu(&hyps, &refs, &BleuConfig::default()).expect("bleu");
    let bleu_time = start.elapsed();
    let start = Instant::now();
    let chrf = corpus_chrf(&hyps, &refs, &ChrfConfig::default()).expect("chrf");
    let chrf_time = start.elapsed();
    println!("1000 segments x 2 refs: BLEU {bleu_time:?}, chrF {chrf_time:?}");
    assert!(bleu.score > 0.0 && chrf.score > 0.0);
    // Generous bound so a loaded CI machine cannot flake; typical is ~10 ms.
    assert!(bleu_time.as_secs_f64() < 2.0 && chrf_time.as_secs_f64() < 2.0);
}
