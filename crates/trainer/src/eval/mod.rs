//! Evaluating a trained model: held-out loss and BLEU, evaluation at a chosen context length,
//! and decoding with scoring.

pub mod context;
pub(crate) mod evaluate;
pub mod translate;
