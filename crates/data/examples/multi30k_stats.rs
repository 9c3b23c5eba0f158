//! Measures the Multi30k data path: load + tokenise time (without and with the token cache),
//! vocabulary size, tokens per sentence and padding efficiency at `max_tokens = 4096`; then the
//! same figures for the embedded task. Prints only; never asserts on timing.
//!
//! `cargo run --release -p ember-data --example multi30k_stats [VOCAB_SIZE]`
//! (data from `$EMBER_SHARED_DATA`, `../shared/data` or `data/`).

use std::path::Path;
use std::time::Instant;

use ember_data::{
    Batcher, CorpusConfig, DataConfig, Dataset, EmbeddedConfig, PairPaths, ParallelConfig, Splits,
    TokenBudgetBatcher, TokenizerConfig, TokenizerKind,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let vocab_size: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(8000);
    let run_dir = std::env::temp_dir().join(format!("ember-multi30k-stats-{}", std::process::id()));
    std::fs::create_dir_all(&run_dir)?;

    match ember_data::find_shared_data() {
        None => {
            println!("multi30k: no data found (set EMBER_SHARED_DATA or run scripts/get-data.sh); skipped")
        }
        Some(root) => {
            let m = root.join("multi30k");
            let pair = |split: &str| PairPaths {
                source: m.join(format!("{split}.en.gz")),
                target: m.join(format!("{split}.de.gz")),
            };
            let cfg = DataConfig {
                corpus: CorpusConfig::Parallel(ParallelConfig {
                    train: pair("train"),
                    valid: pair("val"),
                    test: Some(pair("test_2016_flickr")),
                }),
                tokenizer: TokenizerConfig {
                    kind: TokenizerKind::Bpe,
                    path: None,
                    vocab_size: Some(vocab_size),
                    lowercase: false,
                },
                ..DataConfig::default()
            };
            report("Multi30k en→de (raw, truecase)", &cfg, &run_dir.join("multi30k"))?;
        }
    }
    let cfg = DataConfig {
        corpus: CorpusConfig::Embedded(EmbeddedConfig::default()),
        tokenizer: TokenizerConfig {
            kind: TokenizerKind::Bpe,
            path: None,
            vocab_size: Some(1000),
            lowercase: false,
        },
        ..DataConfig::default()
    };
    report("embedded task (default sizes)", &cfg, &run_dir.join("embedded"))?;
    std::fs::remove_dir_all(&run_dir)?;
    Ok(())
}

fn report(name: &str, cfg: &DataConfig, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    println!("== {name}");
    let t = Instant::now();
    let first = Dataset::prepare(cfg, Some(dir))?;
    println!(
        "first run (trains tokenizer): {:.3}s total; read {:.3}s, tokenizer {:.3}s, tokenise {:.3}s (cache {:?})",
        t.elapsed().as_secs_f64(),
        first.report.read_secs,
        first.report.tokenizer_secs,
        first.report.tokenize_secs,
        first.report.cache
    );
    // The tokenizer now exists: what a resumed or evaluated run pays.
    std::fs::remove_file(dir.join(ember_data::TOKEN_CACHE_FILE))?;
    let t = Instant::now();
    let no_cache = Dataset::prepare(cfg, Some(dir))?;
    println!(
        "tokenizer exists, no cache:   {:.3}s total; read {:.3}s, tokenizer load {:.3}s, tokenise {:.3}s (cache {:?})",
        t.elapsed().as_secs_f64(),
        no_cache.report.read_secs,
        no_cache.report.tokenizer_secs,
        no_cache.report.tokenize_secs,
        no_cache.report.cache
    );
    let t = Instant::now();
    let data = Dataset::prepare(cfg, Some(dir))?;
    println!(
        "tokenizer exists, cached:     {:.3}s total; read {:.3}s, tokenizer load {:.3}s, tokenise {:.3}s (cache {:?})",
        t.elapsed().as_secs_f64(),
        data.report.read_secs,
        data.report.tokenizer_secs,
        data.report.tokenize_secs,
        data.report.cache
    );
    let Splits::Translation(s) = &data.splits else {
        return Ok(());
    };
    println!(
        "vocab size: {} (bound {})",
        data.tokenizer.vocab_size(),
        cfg.tokenizer.bpe_vocab_size()
    );
    for (split, p) in [("train", &s.train), ("valid", &s.valid)]
        .into_iter()
        .chain(s.test.as_ref().map(|t| ("test", t)))
    {
        let st = &p.stats;
        println!(
            "{split:5}: {} pairs ({} dropped too long, {} blank); tokens/sentence src {:.2} tgt {:.2} (both {:.2}); \
             p97.5 src {} tgt {}; max src {} tgt {}; unk {}",
            st.pairs,
            st.dropped_too_long,
            st.dropped_empty,
            st.avg_source_len,
            st.avg_target_len,
            st.avg_tokens_per_sentence(),
            st.p975_source_len,
            st.p975_target_len,
            st.max_source_len,
            st.max_target_len,
            st.unk_tokens
        );
    }
    for max_tokens in [4096, 2048, 1024] {
        let b = TokenBudgetBatcher::new(s.train.examples.clone(), max_tokens, data.tokenizer.specials(), 1)?;
        println!(
            "max_tokens {max_tokens}: {} batches/epoch, padding efficiency {:.4}",
            b.batches_per_epoch(),
            b.padding_efficiency()
        );
    }
    let mut rt_ok = 0;
    for (src, ex) in s.valid.sources.iter().zip(&s.valid.examples) {
        rt_ok += usize::from(data.tokenizer.decode(&ex.source)? == *src);
    }
    println!("valid source round trip: {rt_ok}/{} exact", s.valid.sources.len());
    Ok(())
}
