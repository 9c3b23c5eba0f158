//! Batching rules: budgets, coverage, determinism, exact resumption, layout, eval order.

mod common;

use std::collections::HashSet;

use ember_data::{
    Batch, Batcher, Cursor, DataError, EvalBatches, Example, LmBatch, LmEvalBatches, LmWindowBatcher,
    Seq2SeqBatch, SpecialIds, TokenBudgetBatcher, WindowMode, BOS_ID, EOS_ID, PAD_ID,
};
use ember_rng::SplitMix64;

/// Random examples with realistic, correlated lengths and distinct token content.
fn random_examples(n: usize, seed: u64) -> Vec<Example> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let s = 1 + rng.index(40);
            let t = (s as i64 + rng.index(9) as i64 - 4).max(0) as usize;
            let tok = |k: usize| 4 + ((i * 131 + k * 7) % 500) as u32;
            Example {
                source: (0..s).map(tok).collect(),
                target: (0..t).map(|k| tok(k + 1000)).collect(),
            }
        })
        .collect()
}

fn seq(b: Batch) -> Seq2SeqBatch {
    match b {
        Batch::Seq2Seq(s) => s,
        Batch::Lm(_) => panic!("expected a seq2seq batch"),
    }
}

fn lm(b: Batch) -> LmBatch {
    match b {
        Batch::Lm(l) => l,
        Batch::Seq2Seq(_) => panic!("expected an LM batch"),
    }
}

#[test]
fn batches_respect_max_tokens_and_cover_every_example_once_per_epoch() {
    let examples = random_examples(3000, 1);
    for max_tokens in [64, 500, 1000, 4096] {
        let mut b = TokenBudgetBatcher::new(examples.clone(), max_tokens, SpecialIds::default(), 7).unwrap();
        for epoch in 0..2 {
            let mut seen = HashSet::new();
            for _ in 0..b.batches_per_epoch() {
                let batch = b.next_seq2seq();
                assert!(
                    batch.padded_tokens() <= max_tokens,
                    "{} > {max_tokens}",
                    batch.padded_tokens()
                );
                assert!(batch.batch_size * batch.src_len <= max_tokens);
                assert!(batch.batch_size * batch.tgt_len <= max_tokens);
                for &i in &batch.indices {
                    assert!(seen.insert(i), "example {i} twice in epoch {epoch}");
                }
            }
            assert_eq!(seen.len(), examples.len());
            assert_eq!(
                b.cursor(),
                Cursor {
                    epoch: epoch + 1,
                    position: 0
                }
            );
        }
    }
}

#[test]
fn batch_layout_has_bos_eos_padding_and_masks() {
    let examples = vec![
        Example {
            source: vec![10, 11, 12],
            target: vec![20, 21],
        },
        Example {
            source: vec![13],
            target: vec![22, 23, 24, 25],
        },
    ];
    let sp = SpecialIds::default();
    let mut b = TokenBudgetBatcher::new(examples.clone(), 100, sp, 0).unwrap();
    assert_eq!(b.batches_per_epoch(), 1);
    let batch = b.next_seq2seq();
    assert_eq!((batch.batch_size, batch.src_len, batch.tgt_len), (2, 3, 5));
    // Sorted by length: example 1 (source length 1) comes first.
    assert_eq!(batch.indices, vec![1, 0]);
    assert_eq!(batch.src, vec![13, PAD_ID, PAD_ID, 10, 11, 12]);
    assert_eq!(batch.src_mask, vec![1, 0, 0, 1, 1, 1]);
    assert_eq!(
        batch.tgt_in,
        vec![BOS_ID, 22, 23, 24, 25, BOS_ID, 20, 21, PAD_ID, PAD_ID]
    );
    assert_eq!(
        batch.tgt_out,
        vec![22, 23, 24, 25, EOS_ID, 20, 21, EOS_ID, PAD_ID, PAD_ID]
    );
    assert_eq!(batch.tgt_mask, vec![1, 1, 1, 1, 1, 1, 1, 1, 0, 0]);
    assert_eq!((batch.n_src_tokens, batch.n_tgt_tokens), (4, 8));
    // Real tokens 4 + 8 over padded 2*3 + 2*5.
    assert!((b.padding_efficiency() - 12.0 / 16.0).abs() < 1e-12);
}

#[test]
fn restoring_a_cursor_reproduces_the_remaining_batches_exactly() {
    let examples = random_examples(2000, 2);
    let mut a = TokenBudgetBatcher::new(examples.clone(), 800, SpecialIds::default(), 42).unwrap();
    let per_epoch = a.batches_per_epoch();
    // Run into the second epoch, then checkpoint mid-epoch.
    for _ in 0..per_epoch + per_epoch / 3 {
        a.next_seq2seq();
    }
    let saved = serde_json::to_string(&a.cursor()).unwrap();
    let expected: Vec<Seq2SeqBatch> = (0..per_epoch + 5).map(|_| a.next_seq2seq()).collect();

    // A fresh batcher (a new process) restores the cursor and continues identically.
    let mut b = TokenBudgetBatcher::new(examples, 800, SpecialIds::default(), 42).unwrap();
    b.restore(serde_json::from_str::<Cursor>(&saved).unwrap())
        .unwrap();
    let got: Vec<Seq2SeqBatch> = (0..per_epoch + 5).map(|_| b.next_seq2seq()).collect();
    assert_eq!(got, expected);
    assert_eq!(a.cursor(), b.cursor());
}

#[test]
fn order_depends_on_seed_and_epoch_only() {
    let examples = random_examples(1000, 3);
    let epoch_orders = |seed: u64| {
        let mut b = TokenBudgetBatcher::new(examples.clone(), 600, SpecialIds::default(), seed).unwrap();
        let n = b.batches_per_epoch();
        let e0: Vec<Vec<usize>> = (0..n).map(|_| b.next_seq2seq().indices).collect();
        let e1: Vec<Vec<usize>> = (0..n).map(|_| b.next_seq2seq().indices).collect();
        (e0, e1)
    };
    let (a0, a1) = epoch_orders(5);
    let (b0, b1) = epoch_orders(5);
    let (c0, _) = epoch_orders(6);
    assert_eq!((&a0, &a1), (&b0, &b1), "same seed, same batches");
    assert_ne!(a0, a1, "epochs are shuffled differently");
    assert_ne!(a0, c0, "seeds give different orders");
    // Shapes (hence batches per epoch and padding) do not depend on the epoch.
    let shape = |v: &Vec<Vec<usize>>| {
        let mut s: Vec<usize> = v.iter().map(Vec::len).collect();
        s.sort();
        s
    };
    assert_eq!(shape(&a0), shape(&a1));
}

#[test]
fn an_out_of_range_cursor_is_an_error_and_an_epoch_end_cursor_rolls_over() {
    let mut b = TokenBudgetBatcher::new(random_examples(500, 4), 500, SpecialIds::default(), 1).unwrap();
    let n = b.batches_per_epoch();
    let err = b
        .restore(Cursor {
            epoch: 0,
            position: n + 1,
        })
        .unwrap_err();
    assert!(matches!(err, DataError::CursorOutOfRange { .. }));
    assert!(err.to_string().contains(&format!("{n} batches")), "{err}");
    b.restore(Cursor {
        epoch: 3,
        position: n,
    })
    .unwrap();
    assert_eq!(
        b.cursor(),
        Cursor {
            epoch: 4,
            position: 0
        }
    );
}

#[test]
fn an_example_longer_than_max_tokens_is_an_error_naming_it() {
    let mut examples = random_examples(100, 5);
    examples[37] = Example {
        source: vec![5; 300],
        target: vec![6; 10],
    };
    let err = TokenBudgetBatcher::new(examples, 256, SpecialIds::default(), 0).unwrap_err();
    assert!(matches!(
        err,
        DataError::ExampleTooLong {
            index: 37,
            src_len: 300,
            max_tokens: 256,
            ..
        }
    ));
    assert!(err.to_string().contains("max_source_len"), "{err}");
    // The target side counts its bos/eos slot.
    let err = TokenBudgetBatcher::new(
        vec![Example {
            source: vec![5],
            target: vec![6; 256],
        }],
        256,
        SpecialIds::default(),
        0,
    )
    .unwrap_err();
    assert!(matches!(err, DataError::ExampleTooLong { needed: 257, .. }));
}

#[test]
fn degenerate_inputs_are_errors_not_panics() {
    let sp = SpecialIds::default();
    assert!(TokenBudgetBatcher::new(Vec::<Example>::new(), 100, sp, 0).is_err());
    assert!(TokenBudgetBatcher::new(random_examples(10, 1), 0, sp, 0).is_err());
    let empty_src = vec![Example {
        source: vec![],
        target: vec![1],
    }];
    let err = TokenBudgetBatcher::new(empty_src.clone(), 100, sp, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("examples[0].source"), "{err}");
    assert!(EvalBatches::new(&empty_src, 100, sp).is_err());
    assert!(LmWindowBatcher::new(vec![1u32; 10], 0, 4, 0, WindowMode::Sampled).is_err());
    assert!(LmWindowBatcher::new(vec![1u32; 10], 2, 0, 0, WindowMode::Sweep).is_err());
    let err = LmWindowBatcher::new(vec![1u32; 8], 2, 8, 0, WindowMode::Sampled).unwrap_err();
    assert!(matches!(
        err,
        DataError::StreamTooShort {
            len: 8,
            block_size: 8,
            ..
        }
    ));
    assert!(LmEvalBatches::new(&[1, 2, 3], 1, 3, None).is_err());
}

#[test]
fn the_trait_object_drives_both_batchers() {
    let mut batchers: Vec<Box<dyn Batcher>> = vec![
        Box::new(TokenBudgetBatcher::new(random_examples(50, 1), 200, SpecialIds::default(), 0).unwrap()),
        Box::new(
            LmWindowBatcher::new((0..1000).collect::<Vec<u32>>(), 4, 8, 0, WindowMode::Sampled).unwrap(),
        ),
    ];
    for b in &mut batchers {
        let c = b.cursor();
        let first = b.next_batch();
        b.restore(c).unwrap();
        assert_eq!(b.next_batch(), first);
    }
    assert!(seq(batchers[0].next_batch()).batch_size > 0);
    assert!(matches!(batchers[1].next_batch(), Batch::Lm(_)));
    assert_eq!(batchers[1].padding_efficiency(), 1.0);
}

#[test]
fn eval_batches_are_fixed_complete_and_put_an_oversized_example_alone() {
    let mut examples = random_examples(300, 6);
    examples[10] = Example {
        source: vec![9; 500],
        target: vec![9; 3],
    };
    let sp = SpecialIds::default();
    let pass = || EvalBatches::new(&examples, 400, sp).unwrap().collect::<Vec<_>>();
    let a = pass();
    assert_eq!(a, pass(), "every pass is identical");
    let mut seen: Vec<usize> = a.iter().flat_map(|b| b.indices.clone()).collect();
    seen.sort();
    assert_eq!(seen, (0..examples.len()).collect::<Vec<_>>());
    for b in &a {
        assert!(b.padded_tokens() <= 400 || b.indices == vec![10]);
    }
    assert_eq!(EvalBatches::new(&examples, 400, sp).unwrap().len(), a.len());
}

#[test]
fn lm_sampled_windows_are_shifted_pairs_and_resumable() {
    let stream: Vec<u32> = (0..10_000).map(|i| (i * 7 % 1000) as u32).collect();
    let mut a = LmWindowBatcher::new(stream.clone(), 4, 16, 9, WindowMode::Sampled).unwrap();
    assert_eq!(a.batches_per_epoch(), 10_000u64.div_ceil(64));
    for _ in 0..200 {
        let b = a.next_lm();
        assert_eq!((b.batch_size, b.block_size, b.input.len()), (4, 16, 64));
        for (r, &o) in b.offsets.iter().enumerate() {
            assert!(o + 16 < stream.len());
            assert_eq!(&b.input[r * 16..(r + 1) * 16], &stream[o..o + 16]);
            assert_eq!(&b.target[r * 16..(r + 1) * 16], &stream[o + 1..o + 17]);
        }
    }
    let c = a.cursor();
    assert_eq!(c.epoch, 1);
    let expected: Vec<LmBatch> = (0..300).map(|_| a.next_lm()).collect();
    let mut b = LmWindowBatcher::new(stream, 4, 16, 9, WindowMode::Sampled).unwrap();
    b.restore(c).unwrap();
    let got: Vec<LmBatch> = (0..300).map(|_| lm(b.next_batch())).collect();
    assert_eq!(got, expected);
}

#[test]
fn lm_sweep_visits_every_window_once_per_epoch_in_a_shuffled_order() {
    let stream: Vec<u32> = (0..1001).collect();
    let mut b = LmWindowBatcher::new(stream, 3, 10, 1, WindowMode::Sweep).unwrap();
    // 100 windows of 10 (+1 label) tokens; 34 batches, the last with one row.
    assert_eq!(b.batches_per_epoch(), 34);
    let mut epochs = Vec::new();
    for _ in 0..2 {
        let mut offsets = Vec::new();
        for _ in 0..34 {
            offsets.extend(b.next_lm().offsets);
        }
        let mut sorted = offsets.clone();
        sorted.sort();
        assert_eq!(sorted, (0..100).map(|w| w * 10).collect::<Vec<_>>());
        epochs.push(offsets);
    }
    assert_ne!(epochs[0], epochs[1]);
    let mut c = LmWindowBatcher::new((0..1001).collect::<Vec<u32>>(), 3, 10, 1, WindowMode::Sweep).unwrap();
    c.restore(Cursor {
        epoch: 1,
        position: 5,
    })
    .unwrap();
    assert_eq!(c.next_lm().offsets, epochs[1][15..18].to_vec());
}

#[test]
fn lm_eval_batches_sweep_the_stream_in_order() {
    let stream: Vec<u32> = (0..101).collect();
    let batches: Vec<LmBatch> = LmEvalBatches::new(&stream, 4, 10, None).unwrap().collect();
    let offsets: Vec<usize> = batches.iter().flat_map(|b| b.offsets.clone()).collect();
    assert_eq!(offsets, (0..10).map(|w| w * 10).collect::<Vec<_>>());
    assert_eq!(batches.last().unwrap().batch_size, 2);
    let capped = LmEvalBatches::new(&stream, 4, 10, Some(1)).unwrap();
    assert_eq!(capped.num_batches(), 1);
    assert_eq!(capped.count(), 1);
}

#[test]
fn multi30k_padding_efficiency_is_at_least_0_9_at_4096_tokens() {
    let Some(root) = common::shared_data("multi30k_padding_efficiency") else {
        return;
    };
    let m = root.join("multi30k");
    let cfg = ember_data::DataConfig {
        corpus: ember_data::CorpusConfig::Parallel(ember_data::ParallelConfig {
            train: ember_data::PairPaths {
                source: m.join("train.en.gz"),
                target: m.join("train.de.gz"),
            },
            valid: ember_data::PairPaths {
                source: m.join("val.en.gz"),
                target: m.join("val.de.gz"),
            },
            test: None,
        }),
        ..Default::default()
    };
    let cfg = ember_data::DataConfig {
        tokenizer: ember_data::TokenizerConfig {
            vocab_size: Some(8000),
            ..Default::default()
        },
        ..cfg
    };
    let data = ember_data::Dataset::prepare(&cfg, None).unwrap();
    let s = data.splits.translation().unwrap();
    let b = TokenBudgetBatcher::new(s.train.examples.clone(), 4096, data.tokenizer.specials(), 1).unwrap();
    println!(
        "multi30k: {} batches/epoch, padding efficiency {:.4}",
        b.batches_per_epoch(),
        b.padding_efficiency()
    );
    assert!(b.padding_efficiency() >= 0.9, "{}", b.padding_efficiency());
}

/// Unpadded rows of a translation batch: (source, decoder input, labels) per sentence.
fn unpadded_rows(b: &Seq2SeqBatch) -> Vec<(Vec<u32>, Vec<u32>, Vec<u32>)> {
    let real = |v: &[u32], m: &[u8]| {
        v.iter()
            .zip(m)
            .filter(|(_, &m)| m != 0)
            .map(|(&t, _)| t)
            .collect::<Vec<_>>()
    };
    (0..b.batch_size)
        .map(|r| {
            let (s, t) = (
                r * b.src_len..(r + 1) * b.src_len,
                r * b.tgt_len..(r + 1) * b.tgt_len,
            );
            (
                real(&b.src[s.clone()], &b.src_mask[s]),
                real(&b.tgt_in[t.clone()], &b.tgt_mask[t.clone()]),
                real(&b.tgt_out[t.clone()], &b.tgt_mask[t]),
            )
        })
        .collect()
}

/// Rows × (longest source + longest target) of rows `rows` of a batch: a share's padded tokens.
fn padded_tokens(b: &Seq2SeqBatch, rows: std::ops::Range<usize>) -> usize {
    let real =
        |mask: &[u8], len: usize, r: usize| mask[r * len..(r + 1) * len].iter().filter(|&&m| m != 0).count();
    let longest = |mask: &[u8], len: usize| rows.clone().map(|r| real(mask, len, r)).max().unwrap_or(0);
    rows.len() * (longest(&b.src_mask, b.src_len) + longest(&b.tgt_mask, b.tgt_len))
}

/// The least largest share any split of `rows` into `shares` contiguous blocks gives, by trying
/// every split.
fn best_largest_share(b: &Seq2SeqBatch, rows: std::ops::Range<usize>, shares: usize) -> usize {
    if shares == 1 {
        return padded_tokens(b, rows);
    }
    (rows.start..=rows.end)
        .map(|cut| padded_tokens(b, rows.start..cut).max(best_largest_share(b, cut..rows.end, shares - 1)))
        .min()
        .unwrap()
}

#[test]
fn the_shares_of_a_batch_are_its_rows_in_order_each_padded_to_its_own_longest() {
    let mut batcher =
        TokenBudgetBatcher::new(random_examples(500, 3), 600, SpecialIds::default(), 5).unwrap();
    for _ in 0..20 {
        let batch = batcher.next_seq2seq();
        for shares in [1, 2, 3, 5] {
            let parts: Vec<Seq2SeqBatch> = (0..shares)
                .filter_map(|s| Batch::Seq2Seq(batch.clone()).share(s, shares).map(seq))
                .collect();
            // Balanced by padded tokens: the largest share is as small as any split makes it.
            let largest = parts
                .iter()
                .map(|p| p.batch_size * (p.src_len + p.tgt_len))
                .max()
                .unwrap();
            if shares <= 3 {
                assert_eq!(
                    largest,
                    best_largest_share(&batch, 0..batch.batch_size, shares),
                    "{shares} shares"
                );
            }
            assert_eq!(
                parts.iter().map(|p| p.n_tgt_tokens).sum::<usize>(),
                batch.n_tgt_tokens
            );
            assert_eq!(
                parts.iter().map(|p| p.n_src_tokens).sum::<usize>(),
                batch.n_src_tokens
            );
            let indices: Vec<usize> = parts.iter().flat_map(|p| p.indices.clone()).collect();
            assert_eq!(indices, batch.indices);
            let rows: Vec<_> = parts.iter().flat_map(unpadded_rows).collect();
            assert_eq!(rows, unpadded_rows(&batch));
            for p in &parts {
                // No column of padding only: each share is as short as its longest sentence.
                let longest_src = (0..p.batch_size)
                    .map(|r| {
                        p.src_mask[r * p.src_len..(r + 1) * p.src_len]
                            .iter()
                            .filter(|&&m| m != 0)
                            .count()
                    })
                    .max()
                    .unwrap();
                assert_eq!(longest_src, p.src_len);
                assert_eq!(p.tgt_in.len(), p.batch_size * p.tgt_len);
            }
        }
    }
}

#[test]
fn lm_shares_are_contiguous_windows_and_a_share_without_rows_is_none() {
    let stream: Vec<u32> = (0..5000).map(|i| (i * 7 % 61) as u32).collect();
    let mut batcher = LmWindowBatcher::new(stream, 5, 16, 9, WindowMode::Sampled).unwrap();
    let batch = batcher.next_batch();
    let whole = lm(batch.clone());
    let parts: Vec<LmBatch> = (0..3).map(|s| lm(batch.share(s, 3).unwrap())).collect();
    assert_eq!(parts.iter().map(|p| p.batch_size).collect::<Vec<_>>(), [1, 2, 2]);
    assert_eq!(
        parts.iter().flat_map(|p| p.input.clone()).collect::<Vec<_>>(),
        whole.input
    );
    assert_eq!(
        parts.iter().flat_map(|p| p.target.clone()).collect::<Vec<_>>(),
        whole.target
    );
    assert_eq!(
        parts.iter().flat_map(|p| p.offsets.clone()).collect::<Vec<_>>(),
        whole.offsets
    );
    assert_eq!(batch.target_tokens(), 5 * 16);
    // Five windows over eight shares: three shares are empty.
    let empty = (0..8).filter(|&s| batch.share(s, 8).is_none()).count();
    assert_eq!(empty, 3);
}
