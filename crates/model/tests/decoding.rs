//! Specification: greedy and beam search for translation models, sampling for language models.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use ember_model::{
    beam_search, beam_search_finished, greedy, rank, sample, BeamConfig, Hypothesis, LengthPenalty,
    SampleConfig,
};
use ember_model::{Arch, ForwardCtx, LanguageModel, MlpKind, Model, ModelConfig, NormKind, QkNorm, Seq2Seq};

const BOS: u32 = 1;
const EOS: u32 = 2;

/// A small translation model with perturbed weights, so that its distributions are neither
/// uniform nor degenerate; grouped-query attention exercises the cache reordering fully.
fn translator(vocab: usize) -> (Model, ModelConfig) {
    let mut c = cfg(Arch::Seq2seq, QkNorm::Rmsnorm, NormKind::Rmsnorm, MlpKind::Swiglu);
    c.vocab_size = Some(vocab);
    c.n_kv_heads = Some(2);
    let (model, params) = build(&c, DType::F32);
    perturb(&params, 0.3, 21);
    (model, c)
}

fn language_model() -> (Model, ModelConfig) {
    let c = cfg(Arch::Lm, QkNorm::None, NormKind::Rmsnorm, MlpKind::Swiglu);
    let (model, params) = build(&c, DType::F32);
    perturb(&params, 0.3, 22);
    (model, c)
}

/// Source sentences of the given lengths, token ids in [4, vocab).
fn sentences(lens: &[usize], vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    lens.iter()
        .enumerate()
        .map(|(i, &l)| {
            tokens(1, l.max(1), vocab, seed + i as u64)
                .flatten_all()
                .unwrap()
                .to_vec1::<u32>()
                .unwrap()[..l]
                .to_vec()
        })
        .collect()
}

/// One sentence as a (1, S) batch without padding.
fn alone(sentence: &[u32]) -> Tensor {
    Tensor::from_vec(sentence.to_vec(), (1, sentence.len()), &Device::Cpu).unwrap()
}

/// Sentences padded (with arbitrary real-looking tokens, which only the mask hides) to one
/// batch, and its 0/1 mask.
fn padded(sents: &[Vec<u32>]) -> (Tensor, Tensor) {
    let s = sents.iter().map(Vec::len).max().unwrap_or(0);
    let ids: Vec<u32> = sents
        .iter()
        .flat_map(|x| x.iter().copied().chain(std::iter::repeat_n(7, s - x.len())))
        .collect();
    let lens: Vec<usize> = sents.iter().map(Vec::len).collect();
    (
        Tensor::from_vec(ids, (sents.len(), s), &Device::Cpu).unwrap(),
        lengths_mask(&lens, s),
    )
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    row.iter().map(|&v| v as f64 - lse).collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Teacher-forced next-token logits after each prefix of `BOS + tokens`: (len + 1) rows.
fn teacher_forced(m: &Seq2Seq, src: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
    let input: Vec<u32> = std::iter::once(BOS).chain(tokens.iter().copied()).collect();
    let n = input.len();
    let input = Tensor::from_vec(input, (1, n), &Device::Cpu).unwrap();
    m.forward(&alone(src), None, &input, ForwardCtx::eval())
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2()
        .unwrap()
}

/// The model's log-probability of `tokens` followed by EOS, by one full forward pass.
fn rescore(m: &Seq2Seq, src: &[u32], tokens: &[u32]) -> f64 {
    let logits = teacher_forced(m, src, tokens);
    let targets = tokens.iter().copied().chain(std::iter::once(EOS));
    logits
        .iter()
        .zip(targets)
        .map(|(row, t)| log_softmax(row)[t as usize])
        .sum()
}

fn assert_same(a: &Hypothesis, b: &Hypothesis, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}");
    assert!(
        (a.logprob - b.logprob).abs() <= 1e-4 && (a.score - b.score).abs() <= 1e-4,
        "{what}: {a:?} vs {b:?}"
    );
}

fn beam(k: usize, n_best: usize, alpha: f64) -> BeamConfig {
    BeamConfig {
        beam_size: k,
        n_best,
        length_penalty: LengthPenalty::Gnmt(alpha),
        ..BeamConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Greedy and beam search

#[test]
fn greedy_takes_the_most_probable_token_at_every_step_and_stops_at_the_first_eos() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let cfg = BeamConfig::greedy();
    let sents = sentences(&[5, 8, 3, 6, 4, 7, 2, 9], c.vocab(), 100);
    let mut ended_by_eos = 0;
    for src in &sents {
        let hyp = &greedy(m, &alone(src), None, BOS, EOS, &cfg).unwrap()[0];
        assert!(!hyp.tokens.contains(&EOS), "EOS inside {:?}", hyp.tokens);
        let logits = teacher_forced(m, src, &hyp.tokens);
        for (i, &t) in hyp.tokens.iter().enumerate() {
            assert_eq!(argmax(&logits[i]), t, "step {i} of {:?}", hyp.tokens);
        }
        if hyp.tokens.len() < cfg.max_len(src.len()) {
            assert_eq!(argmax(&logits[hyp.tokens.len()]), EOS, "ended without EOS");
            ended_by_eos += 1;
        }
    }
    // The fixture exercises both endings.
    assert!(ended_by_eos > 0 && ended_by_eos < sents.len(), "{ended_by_eos}");
}

#[test]
fn beam_search_with_a_beam_of_one_is_greedy_search() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let (src, mask) = padded(&sentences(&[5, 8, 3, 6, 1, 7], c.vocab(), 200));
    for alpha in [0.0, 0.6, 1.0] {
        for min_len in [0, 4] {
            let cfg = BeamConfig {
                min_len,
                ..beam(1, 1, alpha)
            };
            let g = greedy(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
            let b = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
            assert_eq!(g.len(), b.len());
            for (i, (g, b)) in g.iter().zip(&b).enumerate() {
                assert_eq!(b.len(), 1);
                assert_same(g, &b[0], &format!("α={alpha} min_len={min_len} sentence {i}"));
            }
        }
    }
}

#[test]
fn decoding_with_and_without_the_kv_cache_gives_the_same_outputs() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let (src, mask) = padded(&sentences(&[6, 2, 9, 4], c.vocab(), 300));
    let cached = BeamConfig {
        min_len: 3,
        ..beam(4, 4, 0.6)
    };
    let uncached = BeamConfig {
        use_cache: false,
        ..cached.clone()
    };
    let (a, b) = (
        greedy(m, &src, Some(&mask), BOS, EOS, &cached).unwrap(),
        greedy(m, &src, Some(&mask), BOS, EOS, &uncached).unwrap(),
    );
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        assert_same(a, b, &format!("greedy, sentence {i}"));
    }
    let (a, b) = (
        beam_search(m, &src, Some(&mask), BOS, EOS, &cached).unwrap(),
        beam_search(m, &src, Some(&mask), BOS, EOS, &uncached).unwrap(),
    );
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        assert_eq!(a.len(), b.len());
        for (j, (a, b)) in a.iter().zip(b).enumerate() {
            assert_same(a, b, &format!("beam, sentence {i}, hypothesis {j}"));
        }
    }
}

#[test]
fn a_batch_of_padded_sentences_decodes_exactly_as_each_sentence_alone() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    // Different lengths, so that sentences finish (and leave the batch) at different steps.
    let sents = sentences(&[7, 3, 5, 1, 10], c.vocab(), 400);
    let (src, mask) = padded(&sents);
    let cfg = beam(3, 3, 0.6);
    let batched = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    let batched_greedy = greedy(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    for (i, s) in sents.iter().enumerate() {
        let single = beam_search(m, &alone(s), None, BOS, EOS, &cfg).unwrap();
        assert_eq!(batched[i].len(), single[0].len());
        for (j, (a, b)) in batched[i].iter().zip(&single[0]).enumerate() {
            assert_same(a, b, &format!("beam, sentence {i}, hypothesis {j}"));
        }
        let single = greedy(m, &alone(s), None, BOS, EOS, &cfg).unwrap();
        assert_same(&batched_greedy[i], &single[0], &format!("greedy, sentence {i}"));
    }
}

#[test]
fn a_hypothesis_logprob_is_its_teacher_forced_log_probability_and_its_score_applies_the_gnmt_penalty() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let sents = sentences(&[4, 7, 2], c.vocab(), 500);
    let (src, mask) = padded(&sents);
    // min_len and a short maximum exercise suppressed and forced EOS: neither may touch the
    // log-probabilities themselves.
    for (min_len, max_len_b) in [(0, 10), (3, 10), (0, 2)] {
        let cfg = BeamConfig {
            min_len,
            max_len_b,
            max_len_a: 0.5,
            ..beam(4, 4, 0.7)
        };
        let lists = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
        let greedy = greedy(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
        for (i, list) in lists.iter().enumerate() {
            for hyp in list.iter().chain([&greedy[i]]) {
                let expected = rescore(m, &sents[i], &hyp.tokens);
                assert!(
                    (hyp.logprob - expected).abs() <= 1e-4,
                    "{hyp:?}: rescored {expected}"
                );
                let len = (hyp.tokens.len() + 1) as f64;
                let penalty = ((5.0 + len) / 6.0).powf(0.7);
                assert!((hyp.score - hyp.logprob / penalty).abs() <= 1e-9, "{hyp:?}");
            }
        }
    }
}

/// With its products in bf16 (`Model::set_precision`, what a `train.precision: bf16` run's
/// evaluation and `ember translate` use) greedy and beam search decode in bf16 too: the logits
/// are not f32's, and a hypothesis's logprob is still its teacher-forced log-probability — to
/// bf16's rounding rather than f32's: the cached one-position passes and the full pass differ
/// in the last f32 place (as in f32), and that can move an operand across a bf16 rounding
/// boundary, 2⁻⁹ of its value.
#[test]
fn in_bf16_a_hypothesis_logprob_is_still_its_teacher_forced_log_probability() {
    // bf16 on any CPU: natively where it has AVX512_BF16, else emulated with the same bits.
    ember_kernels::emulate_bf16_products();
    let (mut model, c) = translator(32);
    let sents = sentences(&[4, 7, 2], c.vocab(), 500);
    let in_f32 = teacher_forced(model.as_seq2seq().unwrap(), &sents[0], &[5, 6]);
    model.set_precision(ember_kernels::Precision::Bf16);
    let m = model.as_seq2seq().unwrap();
    assert_ne!(
        teacher_forced(m, &sents[0], &[5, 6]),
        in_f32,
        "the logits were f32's"
    );
    let (src, mask) = padded(&sents);
    let lists = beam_search(m, &src, Some(&mask), BOS, EOS, &beam(4, 4, 0.7)).unwrap();
    let greedy = greedy(m, &src, Some(&mask), BOS, EOS, &BeamConfig::greedy()).unwrap();
    for (i, list) in lists.iter().enumerate() {
        for hyp in list.iter().chain([&greedy[i]]) {
            let expected = rescore(m, &sents[i], &hyp.tokens);
            assert!(
                (hyp.logprob - expected).abs() <= 1e-2,
                "{hyp:?}: rescored {expected}"
            );
        }
    }
}

#[test]
fn n_best_lists_hold_n_best_distinct_hypotheses_sorted_by_score() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let (src, mask) = padded(&sentences(&[5, 8, 3], c.vocab(), 600));
    for n_best in [1, 3, 5] {
        let lists = beam_search(m, &src, Some(&mask), BOS, EOS, &beam(5, n_best, 0.6)).unwrap();
        for list in &lists {
            assert_eq!(list.len(), n_best);
            assert!(list.windows(2).all(|w| w[0].score >= w[1].score), "{list:?}");
            for (i, a) in list.iter().enumerate() {
                assert!(list[i + 1..].iter().all(|b| b.tokens != a.tokens), "{list:?}");
            }
        }
    }
}

#[test]
fn a_beam_as_wide_as_the_search_space_returns_every_output_ranked_exactly() {
    // Vocabulary {0, 1 = BOS, 2 = EOS, 3} and outputs of at most 3 tokens: 1 + 3 + 9 + 27 = 40
    // possible outputs, all of which a beam of 64 keeps alive.
    let (model, _) = translator(4);
    let m = model.as_seq2seq().unwrap();
    let src = [3u32, 0, 3, 1];
    let mut all: Vec<Vec<u32>> = vec![vec![]];
    for len in 1..=3 {
        let longer: Vec<Vec<u32>> = all
            .iter()
            .filter(|s| s.len() == len - 1)
            .flat_map(|s| {
                [0u32, 1, 3].map(|t| {
                    let mut s = s.clone();
                    s.push(t);
                    s
                })
            })
            .collect();
        all.extend(longer);
    }
    assert_eq!(all.len(), 40);
    for alpha in [0.0, 1.0] {
        let cfg = BeamConfig {
            max_len_a: 0.0,
            max_len_b: 3,
            ..beam(64, 40, alpha)
        };
        let list = beam_search(m, &alone(&src), None, BOS, EOS, &cfg)
            .unwrap()
            .remove(0);
        assert_eq!(list.len(), 40);
        let mut brute: Vec<(f64, &Vec<u32>)> = all
            .iter()
            .map(|s| (cfg.score(rescore(m, &src, s), s.len()), s))
            .collect();
        brute.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (hyp, (score, tokens)) in list.iter().zip(&brute) {
            assert_eq!(&hyp.tokens, *tokens, "α={alpha}");
            assert!((hyp.score - score).abs() <= 1e-4, "α={alpha}: {hyp:?} vs {score}");
        }
    }
}

#[test]
fn outputs_respect_min_len_and_each_sentences_own_max_len() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let lens = [7, 3, 5, 1];
    let (src, mask) = padded(&sentences(&lens, c.vocab(), 700));
    let base = BeamConfig {
        max_len_a: 1.5,
        max_len_b: 2,
        ..beam(3, 3, 0.6)
    };
    // max_len = ⌊1.5 · len⌋ + 2.
    let max_lens = [12, 6, 9, 3];
    for (i, &l) in lens.iter().enumerate() {
        assert_eq!(base.max_len(l), max_lens[i]);
    }
    // A minimum beyond every maximum: each output runs to exactly its own maximum length.
    let cfg = BeamConfig {
        min_len: 100,
        ..base.clone()
    };
    let g = greedy(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    let b = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    for i in 0..lens.len() {
        assert_eq!(g[i].tokens.len(), max_lens[i]);
        assert!(b[i].iter().all(|h| h.tokens.len() == max_lens[i]), "{:?}", b[i]);
    }
    // An ordinary minimum: no output shorter than it (nor longer than its maximum).
    let cfg = BeamConfig {
        min_len: 4,
        ..base.clone()
    };
    let g = greedy(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    let b = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    for i in 0..lens.len() {
        let allowed = 4.min(max_lens[i])..=max_lens[i];
        assert!(allowed.contains(&g[i].tokens.len()), "{:?}", g[i]);
        assert!(
            b[i].iter().all(|h| allowed.contains(&h.tokens.len())),
            "{:?}",
            b[i]
        );
    }
}

#[test]
fn max_seq_len_caps_the_output_so_the_decoder_stays_within_its_positions() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let src = alone(&sentences(&[5], c.vocab(), 800)[0]);
    // Asked for 100 tokens from a model with 64 positions: BOS + 63 tokens fit.
    let cfg = BeamConfig {
        min_len: 1000,
        max_len_b: 100,
        max_seq_len: Some(c.max_seq_len),
        ..beam(2, 2, 0.6)
    };
    let b = beam_search(m, &src, None, BOS, EOS, &cfg).unwrap();
    assert!(b[0].iter().all(|h| h.tokens.len() == c.max_seq_len - 1));
    let g = greedy(m, &src, None, BOS, EOS, &cfg).unwrap();
    assert_eq!(g[0].tokens.len(), c.max_seq_len - 1);
    // Without the cap the model itself refuses the position, with an error that says why.
    let uncapped = BeamConfig {
        max_seq_len: None,
        ..cfg
    };
    let err = greedy(m, &src, None, BOS, EOS, &uncapped)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_seq_len"), "{err}");
}

#[test]
fn a_zero_max_len_yields_the_empty_output_scored_by_its_eos() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let src = sentences(&[5], c.vocab(), 900).remove(0);
    let cfg = BeamConfig {
        max_len_a: 0.0,
        max_len_b: 0,
        min_len: 3,
        ..beam(3, 1, 0.6)
    };
    for hyp in [
        greedy(m, &alone(&src), None, BOS, EOS, &cfg).unwrap().remove(0),
        beam_search(m, &alone(&src), None, BOS, EOS, &cfg)
            .unwrap()
            .remove(0)
            .remove(0),
    ] {
        assert!(hyp.tokens.is_empty());
        assert!((hyp.logprob - rescore(m, &src, &[])).abs() <= 1e-4, "{hyp:?}");
    }
}

#[test]
fn empty_sources_and_empty_batches_decode_without_error() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let cfg = BeamConfig::default();
    let empty = Tensor::zeros((2, 0), DType::U32, &Device::Cpu).unwrap();
    let max_len = cfg.max_len(0);
    for out in [
        greedy(m, &empty, None, BOS, EOS, &cfg).unwrap(),
        beam_search(m, &empty, None, BOS, EOS, &cfg)
            .unwrap()
            .into_iter()
            .map(|mut l| l.remove(0))
            .collect(),
    ] {
        assert_eq!(out.len(), 2);
        assert!(out
            .iter()
            .all(|h| h.tokens.len() <= max_len && h.logprob.is_finite()));
    }
    // A sentence with no real token inside a padded batch.
    let (src, mask) = padded(&sentences(&[4, 0, 2], c.vocab(), 1000));
    let out = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    assert_eq!(out.len(), 3);
    assert!(out[1][0].tokens.len() <= max_len);
    // No sentences at all.
    let none = Tensor::zeros((0, 5), DType::U32, &Device::Cpu).unwrap();
    assert!(greedy(m, &none, None, BOS, EOS, &cfg).unwrap().is_empty());
    assert!(beam_search(m, &none, None, BOS, EOS, &cfg).unwrap().is_empty());
}

#[test]
fn invalid_settings_and_inputs_are_errors_not_panics() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let src = alone(&sentences(&[5], c.vocab(), 1100)[0]);
    let ok = BeamConfig::default();
    let bad_cfgs = [
        BeamConfig {
            beam_size: 0,
            ..ok.clone()
        },
        BeamConfig {
            n_best: 0,
            ..ok.clone()
        },
        BeamConfig {
            n_best: 6,
            ..ok.clone()
        },
        BeamConfig {
            length_penalty: LengthPenalty::Gnmt(f64::NAN),
            ..ok.clone()
        },
        BeamConfig {
            length_penalty: LengthPenalty::Fairseq(-1.0),
            ..ok.clone()
        },
        BeamConfig {
            max_len_a: -1.0,
            ..ok.clone()
        },
        BeamConfig {
            max_seq_len: Some(0),
            ..ok.clone()
        },
    ];
    for cfg in &bad_cfgs {
        assert!(beam_search(m, &src, None, BOS, EOS, cfg).is_err(), "{cfg:?}");
    }
    let flat = src.flatten_all().unwrap();
    let wrong_mask = lengths_mask(&[5, 5], 5);
    assert!(beam_search(m, &flat, None, BOS, EOS, &ok).is_err());
    assert!(greedy(m, &flat, None, BOS, EOS, &ok).is_err());
    assert!(beam_search(m, &src, Some(&wrong_mask), BOS, EOS, &ok).is_err());
    for (bos, eos) in [(BOS, 32), (32, EOS), (BOS, u32::MAX)] {
        assert!(
            beam_search(m, &src, None, bos, eos, &ok).is_err(),
            "bos {bos} eos {eos}"
        );
        assert!(
            greedy(m, &src, None, bos, eos, &ok).is_err(),
            "bos {bos} eos {eos}"
        );
    }
}

/// Beam search written straight from the rule, one sentence at a time, with a full forward
/// pass per hypothesis and step and every candidate considered: what the batched, cached,
/// top-2k implementation must reproduce.
fn reference_beam_search(m: &Seq2Seq, src: &[u32], cfg: &BeamConfig) -> Vec<Hypothesis> {
    let k = cfg.beam_size;
    let max_len = cfg.max_len(src.len());
    let mut live: Vec<(Vec<u32>, f64)> = vec![(vec![], 0.0)];
    let mut finished: Vec<Hypothesis> = vec![];
    for step in 0.. {
        let mut candidates: Vec<(f64, usize, u32)> = vec![];
        for (h, (tokens, logprob)) in live.iter().enumerate() {
            let lp = log_softmax(teacher_forced(m, src, tokens).last().unwrap());
            for (t, &v) in lp.iter().enumerate() {
                let t = t as u32;
                let allowed = if step >= max_len {
                    t == EOS
                } else {
                    t != EOS || step >= cfg.min_len
                };
                if allowed {
                    candidates.push((logprob + v, h, t));
                }
            }
        }
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut next = vec![];
        for (rank, &(logprob, h, t)) in candidates.iter().enumerate() {
            let tokens = &live[h].0;
            if t == EOS {
                if rank < k {
                    finished.push(Hypothesis {
                        tokens: tokens.clone(),
                        score: cfg.score(logprob, tokens.len()),
                        logprob,
                    });
                }
            } else if next.len() < k {
                let mut longer = tokens.clone();
                longer.push(t);
                next.push((longer, logprob));
            }
        }
        if finished.len() >= k || next.is_empty() {
            break;
        }
        live = next;
    }
    finished.sort_by(|a, b| b.score.total_cmp(&a.score));
    finished.truncate(cfg.n_best);
    finished
}

#[test]
fn beam_search_matches_a_direct_transcription_of_the_stopping_rule() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let sents = sentences(&[5, 8, 3, 6, 1], c.vocab(), 1400);
    let (src, mask) = padded(&sents);
    for (k, alpha, min_len) in [(2, 0.0, 0), (4, 0.6, 2), (6, 1.0, 0)] {
        let cfg = BeamConfig {
            min_len,
            ..beam(k, k, alpha)
        };
        let lists = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
        for (i, list) in lists.iter().enumerate() {
            let expected = reference_beam_search(m, &sents[i], &cfg);
            assert_eq!(list.len(), expected.len(), "k={k} sentence {i}");
            for (j, (a, b)) in list.iter().zip(&expected).enumerate() {
                assert_same(a, b, &format!("k={k} α={alpha} sentence {i} hypothesis {j}"));
            }
        }
    }
}

#[test]
fn one_search_ranked_under_any_length_penalty_is_the_search_with_that_penalty() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let sents = sentences(&[5, 8, 3, 6, 1, 9], c.vocab(), 1500);
    let (src, mask) = padded(&sents);
    let searched_once = beam_search_finished(m, &src, Some(&mask), BOS, EOS, &beam(5, 5, 0.6)).unwrap();
    let penalties = [
        LengthPenalty::Gnmt(0.0),
        LengthPenalty::Gnmt(0.6),
        LengthPenalty::Gnmt(1.2),
        LengthPenalty::Fairseq(0.5),
        LengthPenalty::Fairseq(1.0),
    ];
    let mut winners = std::collections::BTreeSet::new();
    for penalty in penalties {
        let cfg = BeamConfig {
            length_penalty: penalty,
            ..beam(5, 3, 0.0)
        };
        let direct = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
        for (i, (list, finished)) in direct.iter().zip(&searched_once).enumerate() {
            let ranked = rank(finished.clone(), penalty, 3);
            assert_eq!(ranked.len(), list.len(), "{penalty} sentence {i}");
            for (a, b) in ranked.iter().zip(list) {
                assert_eq!(a.tokens, b.tokens, "{penalty} sentence {i}");
                assert_eq!(a.score, b.score, "{penalty} sentence {i}");
            }
            winners.insert((i, list[0].tokens.clone()));
        }
    }
    // The test means something only if the penalties disagree somewhere.
    assert!(
        winners.len() > sents.len(),
        "every penalty picked the same outputs"
    );
}

#[test]
fn fairseqs_length_penalty_divides_by_the_length_to_the_power_p() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let (src, mask) = padded(&sentences(&[4, 7], c.vocab(), 1600));
    let cfg = BeamConfig {
        length_penalty: LengthPenalty::Fairseq(1.0),
        ..beam(4, 4, 0.0)
    };
    for list in beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap() {
        for hyp in &list {
            // fairseq's default: the mean log-probability per token, EOS counted.
            let mean = hyp.logprob / (hyp.tokens.len() + 1) as f64;
            assert!((hyp.score - mean).abs() <= 1e-12, "{hyp:?}");
        }
    }
}

#[test]
fn length_penalties_read_and_print_as_kind_colon_strength() {
    for (text, penalty) in [
        ("0.6", LengthPenalty::Gnmt(0.6)),
        ("gnmt:1.2", LengthPenalty::Gnmt(1.2)),
        ("fairseq:1", LengthPenalty::Fairseq(1.0)),
        (" fairseq : 0.5 ", LengthPenalty::Fairseq(0.5)),
    ] {
        let read: LengthPenalty = text.parse().unwrap();
        assert_eq!(read, penalty, "{text}");
        assert_eq!(read.to_string().parse::<LengthPenalty>().unwrap(), penalty);
    }
    for bad in ["", "x", "gnmt:", "fairseq:-1", "gnmt:nan", "wu:0.6", "gnmt:inf"] {
        let err = bad.parse::<LengthPenalty>().unwrap_err();
        assert!(err.contains("length") || err.contains("penalty"), "{bad}: {err}");
    }
}

/// In a config (`eval.length_penalty`) a penalty is written as on the command line, or as a bare
/// number (GNMT's α); it is saved in the `kind:strength` form and read back the same.
#[test]
fn length_penalties_in_a_config_read_as_on_the_command_line_and_round_trip() {
    for (json, penalty) in [
        ("1.6", LengthPenalty::Gnmt(1.6)),
        ("2", LengthPenalty::Gnmt(2.0)),
        ("\"gnmt:1.8\"", LengthPenalty::Gnmt(1.8)),
        ("\"fairseq:1\"", LengthPenalty::Fairseq(1.0)),
    ] {
        let read: LengthPenalty = serde_json::from_str(json).unwrap();
        assert_eq!(read, penalty, "{json}");
        let saved = serde_json::to_string(&read).unwrap();
        assert_eq!(
            serde_json::from_str::<LengthPenalty>(&saved).unwrap(),
            penalty,
            "{saved}"
        );
    }
    for bad in ["-1", "\"gnmt:-1\"", "\"wu:0.6\"", "true", "[0.6]"] {
        let err = serde_json::from_str::<LengthPenalty>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("length") || err.contains("penalty"), "{bad}: {err}");
    }
}

/// Not a theorem (a beam can prune the greedy path, and stops at k finished hypotheses), but
/// what beam search is for: on these fixture sentences, without length penalty, the beam's
/// best output is never less probable than greedy's, and is more probable on some.
#[test]
fn beam_search_finds_outputs_at_least_as_probable_as_greedy_on_fixture_sentences() {
    let (model, c) = translator(32);
    let m = model.as_seq2seq().unwrap();
    let sents = sentences(&[5, 8, 3, 6, 4, 7, 2, 9, 5, 6], c.vocab(), 1200);
    let (src, mask) = padded(&sents);
    let cfg = beam(5, 1, 0.0);
    let g = greedy(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    let b = beam_search(m, &src, Some(&mask), BOS, EOS, &cfg).unwrap();
    let mut better = 0;
    for (g, b) in g.iter().zip(&b) {
        assert!(b[0].logprob >= g.logprob - 1e-9, "beam {:?} < greedy {g:?}", b[0]);
        better += (b[0].logprob > g.logprob + 1e-6) as usize;
    }
    assert!(better > 0, "the beam never improved on greedy");
}

// ---------------------------------------------------------------------------------------------
// Language-model sampling

fn prompt(c: &ModelConfig, len: usize) -> Vec<u32> {
    std::iter::once(BOS)
        .chain(sentences(&[len - 1], c.vocab(), 1300).remove(0))
        .collect()
}

fn sampled(m: &LanguageModel, prompt: &[u32], cfg: &SampleConfig) -> Vec<u32> {
    sample(m, prompt, &Device::Cpu, cfg).unwrap()
}

/// The greedy continuation by full forward passes over the growing sequence (no cache).
fn greedy_continuation(m: &LanguageModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut ids = prompt.to_vec();
    for _ in 0..n {
        let x = Tensor::from_vec(ids.clone(), (1, ids.len()), &Device::Cpu).unwrap();
        let logits: Vec<Vec<f32>> = m
            .forward(&x, ForwardCtx::eval())
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        ids.push(argmax(logits.last().unwrap()));
    }
    ids[prompt.len()..].to_vec()
}

/// The next-token distribution after `prompt` at temperature `t`.
fn next_token_probs(m: &LanguageModel, prompt: &[u32], t: f64) -> Vec<f64> {
    let x = Tensor::from_vec(prompt.to_vec(), (1, prompt.len()), &Device::Cpu).unwrap();
    let logits: Vec<Vec<f32>> = m
        .forward(&x, ForwardCtx::eval())
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2()
        .unwrap();
    let scaled: Vec<f32> = logits
        .last()
        .unwrap()
        .iter()
        .map(|&v| (v as f64 / t) as f32)
        .collect();
    log_softmax(&scaled).into_iter().map(f64::exp).collect()
}

/// The first sampled token under `seed`s 0..n.
fn first_tokens(m: &LanguageModel, prompt: &[u32], cfg: &SampleConfig, n: u64) -> Vec<u32> {
    (0..n)
        .map(|seed| {
            let cfg = SampleConfig {
                seed,
                max_new_tokens: 1,
                ..cfg.clone()
            };
            sampled(m, prompt, &cfg)[0]
        })
        .collect()
}

#[test]
fn sampling_is_reproducible_under_a_seed_and_differs_across_seeds() {
    let (model, c) = language_model();
    let m = model.as_lm().unwrap();
    let p = prompt(&c, 4);
    let cfg = SampleConfig {
        max_new_tokens: 20,
        ..SampleConfig::default()
    };
    let a = sampled(m, &p, &cfg);
    assert_eq!(a.len(), 20);
    assert_eq!(a, sampled(m, &p, &cfg));
    for seed in 1..4 {
        let other = SampleConfig { seed, ..cfg.clone() };
        assert_ne!(a, sampled(m, &p, &other), "seed {seed}");
    }
}

#[test]
fn temperature_zero_top_k_one_and_a_tiny_top_p_all_give_the_greedy_continuation() {
    let (model, c) = language_model();
    let m = model.as_lm().unwrap();
    let p = prompt(&c, 5);
    let expected = greedy_continuation(m, &p, 15);
    let base = SampleConfig {
        max_new_tokens: 15,
        seed: 3,
        ..SampleConfig::default()
    };
    for cfg in [
        SampleConfig {
            temperature: 0.0,
            ..base.clone()
        },
        SampleConfig {
            top_k: Some(1),
            ..base.clone()
        },
        SampleConfig {
            top_p: Some(1e-9),
            temperature: 2.0,
            ..base.clone()
        },
    ] {
        assert_eq!(sampled(m, &p, &cfg), expected, "{cfg:?}");
    }
}

#[test]
fn draws_follow_the_temperature_scaled_softmax() {
    let (model, c) = language_model();
    let m = model.as_lm().unwrap();
    let p = prompt(&c, 3);
    for t in [0.7, 1.5] {
        let probs = next_token_probs(m, &p, t);
        let n = 4000;
        let cfg = SampleConfig {
            temperature: t,
            ..SampleConfig::default()
        };
        let mut counts = vec![0usize; c.vocab()];
        for tok in first_tokens(m, &p, &cfg, n) {
            counts[tok as usize] += 1;
        }
        for (i, (&k, &q)) in counts.iter().zip(&probs).enumerate() {
            // Five standard errors of a frequency, plus a little.
            let tolerance = 5.0 * (q * (1.0 - q) / n as f64).sqrt() + 1e-3;
            let freq = k as f64 / n as f64;
            assert!((freq - q).abs() <= tolerance, "T={t} token {i}: {freq} vs {q}");
        }
    }
}

#[test]
fn top_k_and_top_p_draw_only_from_the_most_probable_tokens() {
    let (model, c) = language_model();
    let m = model.as_lm().unwrap();
    let p = prompt(&c, 3);
    let probs = next_token_probs(m, &p, 1.0);
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let check = |cfg: SampleConfig, allowed: &[usize]| {
        let drawn = first_tokens(m, &p, &cfg, 300);
        assert!(
            drawn.iter().all(|t| allowed.contains(&(*t as usize))),
            "{cfg:?}: {drawn:?}"
        );
        let distinct: std::collections::BTreeSet<_> = drawn.iter().collect();
        assert_eq!(
            distinct.len(),
            allowed.len(),
            "{cfg:?}: every allowed token is drawn"
        );
    };
    check(
        SampleConfig {
            top_k: Some(3),
            ..SampleConfig::default()
        },
        &order[..3],
    );
    // The nucleus: the fewest most-probable tokens whose mass reaches p.
    let top_p = 0.5;
    let mut mass = 0.0;
    let nucleus = order
        .iter()
        .position(|&i| {
            mass += probs[i];
            mass >= top_p
        })
        .unwrap()
        + 1;
    assert!(nucleus > 1 && nucleus < 10, "fixture: nucleus of {nucleus}");
    check(
        SampleConfig {
            top_p: Some(top_p),
            ..SampleConfig::default()
        },
        &order[..nucleus],
    );
}

#[test]
fn generation_stops_at_the_stop_token_without_emitting_it() {
    let (model, c) = language_model();
    let m = model.as_lm().unwrap();
    let p = prompt(&c, 4);
    let full = greedy_continuation(m, &p, 10);
    let stop = full[3];
    let first = full.iter().position(|&t| t == stop).unwrap();
    let cfg = SampleConfig {
        temperature: 0.0,
        max_new_tokens: 10,
        stop_token: Some(stop),
        ..SampleConfig::default()
    };
    assert_eq!(sampled(m, &p, &cfg), full[..first]);
}

#[test]
fn generation_respects_the_models_max_seq_len() {
    let (model, c) = language_model();
    let m = model.as_lm().unwrap();
    let l = c.max_seq_len;
    let capped = SampleConfig {
        max_new_tokens: 10,
        max_seq_len: Some(l),
        ..SampleConfig::default()
    };
    // Prompt and output together fill the context exactly.
    assert_eq!(sampled(m, &prompt(&c, l - 4), &capped).len(), 4);
    assert!(sampled(m, &prompt(&c, l), &capped).is_empty());
    let err = sample(m, &prompt(&c, l + 1), &Device::Cpu, &capped)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_seq_len"), "{err}");
    // Without the cap, running past the rotary table is the model's (explained) error.
    let uncapped = SampleConfig {
        max_seq_len: None,
        ..capped
    };
    let err = sample(m, &prompt(&c, l - 4), &Device::Cpu, &uncapped)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_seq_len"), "{err}");
}

#[test]
fn invalid_sampling_settings_are_errors_not_panics() {
    let (model, c) = language_model();
    let m = model.as_lm().unwrap();
    let p = prompt(&c, 3);
    assert!(sample(m, &[], &Device::Cpu, &SampleConfig::default()).is_err());
    assert!(sample(m, &[40], &Device::Cpu, &SampleConfig::default()).is_err());
    let ok = SampleConfig::default();
    for cfg in [
        SampleConfig {
            temperature: -1.0,
            ..ok.clone()
        },
        SampleConfig {
            temperature: f64::NAN,
            ..ok.clone()
        },
        SampleConfig {
            top_k: Some(0),
            ..ok.clone()
        },
        SampleConfig {
            top_p: Some(0.0),
            ..ok.clone()
        },
        SampleConfig {
            top_p: Some(1.5),
            ..ok.clone()
        },
    ] {
        assert!(sample(m, &p, &Device::Cpu, &cfg).is_err(), "{cfg:?}");
    }
}

#[test]
fn a_sliding_window_keeps_generating_past_max_seq_len_conditioned_on_the_newest_tokens() {
    let (model, c) = language_model();
    let m = model.as_lm().unwrap();
    let window = 8;
    let p = prompt(&c, 3);
    let cfg = SampleConfig {
        max_new_tokens: 20,
        temperature: 0.0,
        max_seq_len: Some(window),
        sliding_window: true,
        ..SampleConfig::default()
    };
    let got = sampled(m, &p, &cfg);
    assert_eq!(got.len(), 20, "generation goes past the window");
    // Reference: nanoGPT's loop — a full forward pass over the last `window` tokens per step.
    let mut ids = p.clone();
    for _ in 0..20 {
        let ctx = &ids[ids.len().saturating_sub(window)..];
        ids.push(greedy_continuation(m, ctx, 1)[0]);
    }
    assert_eq!(got, ids[p.len()..].to_vec());
    let capped = sampled(
        m,
        &p,
        &SampleConfig {
            sliding_window: false,
            ..cfg
        },
    );
    assert_eq!(
        capped,
        got[..window - p.len()].to_vec(),
        "without the window it stops when full"
    );
}
