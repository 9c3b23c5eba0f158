//! Specification: gradient accumulation is exact. The micro-batches of one step give the same
//! loss and gradients as one batch holding all their rows, because every micro-batch's loss is
//! divided by the real target tokens of the whole step (not averaged per micro-batch).

use candle_core::{DType, Device, Tensor};
use ember_data::{Batch, LmBatch, Seq2SeqBatch, BOS_ID, EOS_ID, PAD_ID};
use ember_model::{init_model, Arch, Model, ModelConfig, ParamStore};
use ember_trainer::config::TrainConfig;
use ember_trainer::optim::AdamW;
use ember_trainer::{forward_backward, StepOutput};

const VOCAB: usize = 32;

/// A training config with label smoothing and z-loss switched on (both change the per-token
/// objective, so they must be normalised the same way as the NLL).
fn train_cfg() -> TrainConfig {
    serde_json::from_value(serde_json::json!({
        "steps": 1,
        "seed": 11,
        "lr": 1e-3,
        "label_smoothing": 0.1,
        "z_loss": 1e-4,
    }))
    .unwrap()
}

fn tiny(arch: Arch) -> (Model, ParamStore) {
    let mut cfg = ModelConfig::tiny(arch);
    cfg.vocab_size = Some(VOCAB);
    cfg.dropout = 0.0;
    cfg.attn_dropout = 0.0;
    cfg.n_layers = Some(1);
    init_model(&cfg, 42, DType::F32, &Device::Cpu).unwrap()
}

/// Deterministic pseudo-random token ids in 4..VOCAB (never a special token).
fn ids(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            4 + (x % (VOCAB as u64 - 4)) as u32
        })
        .collect()
}

fn lm_batch(rows: &[Vec<u32>]) -> LmBatch {
    let block = rows[0].len() - 1;
    let mut b = LmBatch {
        batch_size: rows.len(),
        block_size: block,
        input: vec![],
        target: vec![],
        offsets: vec![],
    };
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.len(), block + 1);
        b.input.extend_from_slice(&r[..block]);
        b.target.extend_from_slice(&r[1..]);
        b.offsets.push(i * 1000);
    }
    b
}

/// A translation batch of (source, target) pairs, right-padded to `src_len` / `tgt_len` (which
/// may exceed the longest row, as in a merged batch).
fn s2s_batch(pairs: &[(Vec<u32>, Vec<u32>)], src_len: usize, tgt_len: usize) -> Seq2SeqBatch {
    let b = pairs.len();
    let mut out = Seq2SeqBatch {
        batch_size: b,
        src_len,
        tgt_len,
        src: vec![PAD_ID; b * src_len],
        src_mask: vec![0; b * src_len],
        tgt_in: vec![PAD_ID; b * tgt_len],
        tgt_out: vec![PAD_ID; b * tgt_len],
        tgt_mask: vec![0; b * tgt_len],
        n_src_tokens: 0,
        n_tgt_tokens: 0,
        indices: (0..b).collect(),
    };
    for (row, (src, tgt)) in pairs.iter().enumerate() {
        assert!(src.len() <= src_len && tgt.len() < tgt_len);
        let s = row * src_len;
        out.src[s..s + src.len()].copy_from_slice(src);
        out.src_mask[s..s + src.len()].fill(1);
        let t = row * tgt_len;
        let n = tgt.len();
        out.tgt_in[t] = BOS_ID;
        out.tgt_in[t + 1..t + 1 + n].copy_from_slice(tgt);
        out.tgt_out[t..t + n].copy_from_slice(tgt);
        out.tgt_out[t + n] = EOS_ID;
        out.tgt_mask[t..t + n + 1].fill(1);
        out.n_src_tokens += src.len();
        out.n_tgt_tokens += n + 1;
    }
    out
}

/// Tight padding, as the batcher makes it.
fn s2s_tight(pairs: &[(Vec<u32>, Vec<u32>)]) -> Seq2SeqBatch {
    let src_len = pairs.iter().map(|p| p.0.len()).max().unwrap();
    let tgt_len = pairs.iter().map(|p| p.1.len() + 1).max().unwrap();
    s2s_batch(pairs, src_len, tgt_len)
}

fn run(model: &Model, params: &ParamStore, batches: &[Batch]) -> StepOutput {
    let cfg = train_cfg();
    let opt = AdamW::new(params.vars(), &cfg).unwrap();
    forward_backward(model, opt.params(), batches, &cfg, &Device::Cpu, 1, false).unwrap()
}

fn max_abs(t: &Tensor) -> f64 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// Every parameter's gradient agrees to `tol` relative to its largest entry.
fn assert_grads_close(names: &[String], a: &[Option<Tensor>], b: &[Option<Tensor>], tol: f64) {
    assert_eq!(a.len(), b.len());
    let mut with_grad = 0;
    for ((name, ga), gb) in names.iter().zip(a).zip(b) {
        match (ga, gb) {
            (Some(ga), Some(gb)) => {
                let scale = max_abs(gb);
                let diff = max_abs(&(ga - gb).unwrap());
                assert!(scale > 0.0, "{name}: zero gradient");
                assert!(
                    diff <= tol * scale,
                    "{name}: max |Δgrad| = {diff:e}, max |grad| = {scale:e} (relative {:e} > {tol:e})",
                    diff / scale
                );
                with_grad += 1;
            }
            (None, None) => {}
            _ => panic!("{name}: gradient present in one run only"),
        }
    }
    assert!(with_grad > 0, "no parameter got a gradient");
}

fn assert_same_step(params: &ParamStore, acc: &StepOutput, big: &StepOutput) {
    assert_eq!(acc.tokens, big.tokens, "token counts");
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    let (acc_loss, acc_nll) = acc.per_token().unwrap();
    let (big_loss, big_nll) = big.per_token().unwrap();
    assert!(acc_loss.is_finite() && acc_loss > 0.0, "loss {acc_loss}");
    assert!(
        rel(acc_loss, big_loss) <= 1e-6,
        "loss: accumulated {acc_loss} vs one batch {big_loss}"
    );
    assert!(
        rel(acc_nll, big_nll) <= 1e-6,
        "nll: accumulated {acc_nll} vs one batch {big_nll}"
    );
    assert!(
        acc_loss != acc_nll,
        "label smoothing and z-loss make the objective differ from the NLL"
    );
    let names: Vec<String> = params.vars().into_iter().map(|(n, _)| n).collect();
    assert_grads_close(&names, &acc.grads, &big.grads, 1e-5);
}

fn lm_rows(seed: u64, n: usize, block: usize) -> Vec<Vec<u32>> {
    (0..n).map(|i| ids(seed * 100 + i as u64, block + 1)).collect()
}

#[test]
fn an_accumulated_language_model_step_equals_one_big_batch() {
    let (model, params) = tiny(Arch::Lm);
    let (r1, r2) = (lm_rows(1, 2, 12), lm_rows(2, 2, 12));
    let b1 = Batch::Lm(lm_batch(&r1));
    let b2 = Batch::Lm(lm_batch(&r2));
    let big = Batch::Lm(lm_batch(&[r1, r2].concat()));
    let acc = run(&model, &params, &[b1, b2]);
    let one = run(&model, &params, &[big]);
    assert_eq!(acc.tokens, 4 * 12);
    assert_same_step(&params, &acc, &one);
}

fn s2s_pairs(seed: u64, lens: &[(usize, usize)]) -> Vec<(Vec<u32>, Vec<u32>)> {
    lens.iter()
        .enumerate()
        .map(|(i, &(s, t))| {
            (
                ids(seed * 100 + 2 * i as u64, s),
                ids(seed * 100 + 2 * i as u64 + 1, t),
            )
        })
        .collect()
}

#[test]
fn an_accumulated_translation_step_equals_one_big_padded_batch() {
    let (model, params) = tiny(Arch::Seq2seq);
    // Each micro-batch has its own padding; the merged batch pads to the longer lengths.
    let p1 = s2s_pairs(1, &[(5, 4), (3, 6)]);
    let p2 = s2s_pairs(2, &[(9, 7), (6, 2)]);
    let b1 = s2s_tight(&p1);
    let b2 = s2s_tight(&p2);
    let merged = s2s_batch(
        &[p1.clone(), p2.clone()].concat(),
        b1.src_len.max(b2.src_len),
        b1.tgt_len.max(b2.tgt_len),
    );
    assert!(
        merged.src_len > b1.src_len && merged.tgt_len > b1.tgt_len,
        "b1 gains padding"
    );
    let acc = run(&model, &params, &[Batch::Seq2Seq(b1), Batch::Seq2Seq(b2)]);
    let one = run(&model, &params, &[Batch::Seq2Seq(merged)]);
    assert_eq!(acc.tokens, (4 + 1) + (6 + 1) + (7 + 1) + (2 + 1));
    assert_same_step(&params, &acc, &one);
}

#[test]
fn extra_padding_changes_neither_loss_nor_gradients() {
    let (model, params) = tiny(Arch::Seq2seq);
    let pairs = s2s_pairs(3, &[(4, 3), (6, 5)]);
    let tight = run(&model, &params, &[Batch::Seq2Seq(s2s_tight(&pairs))]);
    let padded = run(&model, &params, &[Batch::Seq2Seq(s2s_batch(&pairs, 13, 11))]);
    assert_same_step(&params, &padded, &tight);
}

/// Gradient of a step as a weighted sum of per-micro-batch gradients.
fn combine(a: &StepOutput, wa: f64, b: &StepOutput, wb: f64) -> Vec<Option<Tensor>> {
    a.grads
        .iter()
        .zip(&b.grads)
        .map(|(x, y)| match (x, y) {
            (Some(x), Some(y)) => Some(((x * wa).unwrap() + (y * wb).unwrap()).unwrap()),
            (None, None) => None,
            _ => panic!("gradient present in one micro-batch only"),
        })
        .collect()
}

#[test]
fn the_loss_is_normalised_by_all_target_tokens_of_the_step_not_per_micro_batch() {
    // Micro-batches of very different sizes: 3 rows against 1 (and, for translation, short
    // against long rows). Averaging per micro-batch would weight the lone row's tokens 3× more.
    let (lm, lm_params) = tiny(Arch::Lm);
    let (r1, r2) = (lm_rows(4, 3, 10), lm_rows(5, 1, 10));
    let (b1, b2) = (Batch::Lm(lm_batch(&r1)), Batch::Lm(lm_batch(&r2)));
    let acc = run(&lm, &lm_params, &[b1.clone(), b2.clone()]);
    let one = run(&lm, &lm_params, &[Batch::Lm(lm_batch(&[r1, r2].concat()))]);
    assert_eq!((acc.tokens, one.tokens), (40, 40));
    assert_same_step(&lm_params, &acc, &one);

    // The same rule stated directly: the step's gradient is the token-weighted mean of the
    // micro-batches' own gradients, and not their plain mean.
    let (g1, g2) = (run(&lm, &lm_params, &[b1]), run(&lm, &lm_params, &[b2]));
    let (n1, n2) = (g1.tokens as f64, g2.tokens as f64);
    let names: Vec<String> = lm_params.vars().into_iter().map(|(n, _)| n).collect();
    let weighted = combine(&g1, n1 / (n1 + n2), &g2, n2 / (n1 + n2));
    assert_grads_close(&names, &acc.grads, &weighted, 1e-5);
    let loss = |s: &StepOutput| s.per_token().unwrap().0;
    let weighted_loss = (loss(&g1) * n1 + loss(&g2) * n2) / (n1 + n2);
    assert!(
        (loss(&acc) - weighted_loss).abs() <= 1e-6 * weighted_loss,
        "{} vs {weighted_loss}",
        loss(&acc)
    );
    let plain = combine(&g1, 0.5, &g2, 0.5);
    let differs = acc.grads.iter().zip(&plain).any(|(a, p)| match (a, p) {
        (Some(a), Some(p)) => max_abs(&(a - p).unwrap()) > 1e-3 * max_abs(a),
        _ => false,
    });
    assert!(differs, "the plain mean of micro-batch gradients must not match");

    let (s2s, s2s_params) = tiny(Arch::Seq2seq);
    let p1 = s2s_pairs(6, &[(3, 2), (2, 3), (4, 1)]);
    let p2 = s2s_pairs(7, &[(14, 12)]);
    let (b1, b2) = (s2s_tight(&p1), s2s_tight(&p2));
    assert_eq!((b1.n_tgt_tokens, b2.n_tgt_tokens), (9, 13));
    let merged = s2s_batch(&[p1, p2].concat(), b2.src_len, b2.tgt_len);
    let acc = run(&s2s, &s2s_params, &[Batch::Seq2Seq(b1), Batch::Seq2Seq(b2)]);
    let one = run(&s2s, &s2s_params, &[Batch::Seq2Seq(merged)]);
    assert_eq!(acc.tokens, 22);
    assert_same_step(&s2s_params, &acc, &one);
}
