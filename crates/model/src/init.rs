//! How a model's parameters start: `model.init_scheme` (normal, or fairseq's `transformer` as
//! it is now or as its 0.9 release drew it) for the projections and their biases; embeddings are
//! normal(0, `init_std`) under every scheme.

use candle_nn::Init;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the projections start (embeddings and an untied output layer are normal(0, `init_std`)
/// under every scheme).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InitScheme {
    /// normal(0, `init_std`), the projections that end a pre-norm block's branches scaled down
    /// with depth (GPT-2's rule).
    #[default]
    Normal,
    /// fairseq's `transformer`: q, k and v Xavier-uniform with gain 1/√2 and the attention's
    /// output Xavier-uniform (its `MultiheadAttention.reset_parameters`), the MLP's two
    /// projections PyTorch's `nn.Linear` default, uniform on ±1/√fan_in (fairseq since its
    /// Quant-Noise change of 2020, 0.10 on).
    Fairseq,
    /// fairseq's `transformer` as of its 0.9 release (2019), the code Wu et al. (2021) trained
    /// their published Transformer-Tiny with (their fork's `transformer_layer.py`): the
    /// attention as under `fairseq`, but the MLP's two projections Xavier-uniform (gain 1) with
    /// their biases at 0.
    #[serde(rename = "fairseq_0_9")]
    Fairseq09,
}

/// What a projection does in its block, for [`InitScheme::projection`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProjectionRole {
    /// q, k or v.
    AttentionIn,
    /// The attention's output projection.
    AttentionOut,
    /// A projection of the MLP (gate, up or down).
    Mlp,
}

impl InitScheme {
    pub(crate) fn is_normal(&self) -> bool {
        *self == InitScheme::Normal
    }

    /// The initial distribution of a projection from `fan_in` to `fan_out` in `role`;
    /// `normal_std` is the std `normal` draws it from (`init_std`, or a pre-norm output
    /// projection's depth-scaled std).
    pub(crate) fn projection(
        self,
        role: ProjectionRole,
        fan_in: usize,
        fan_out: usize,
        normal_std: f64,
    ) -> Init {
        let bound = match (self, role) {
            (InitScheme::Normal, _) => {
                return Init::Randn {
                    mean: 0.0,
                    stdev: normal_std,
                }
            }
            // xavier_uniform_(gain): gain·√(6 / (fan_in + fan_out)), gain 1/√2 for q, k, v.
            (_, ProjectionRole::AttentionIn) => (3.0 / (fan_in + fan_out) as f64).sqrt(),
            (_, ProjectionRole::AttentionOut) | (InitScheme::Fairseq09, ProjectionRole::Mlp) => {
                (6.0 / (fan_in + fan_out) as f64).sqrt()
            }
            // nn.Linear's kaiming_uniform_(a = √5): √(6 / ((1 + 5)·fan_in)).
            (InitScheme::Fairseq, ProjectionRole::Mlp) => 1.0 / (fan_in as f64).sqrt(),
        };
        Init::Uniform {
            lo: -bound,
            up: bound,
        }
    }

    /// The initial distribution of the bias of a projection from `fan_in` in `role`: fairseq's
    /// (`nn.Linear`'s default, uniform on ±1/√fan_in; the attention's output at 0, as its
    /// `MultiheadAttention` sets it; the MLP's at 0 under `fairseq_0_9`, whose `Linear` helper
    /// zeroes them), else 0.
    pub(crate) fn bias(self, role: ProjectionRole, fan_in: usize) -> Init {
        match (self, role) {
            (InitScheme::Fairseq, ProjectionRole::Mlp)
            | (InitScheme::Fairseq | InitScheme::Fairseq09, ProjectionRole::AttentionIn) => {
                let bound = 1.0 / (fan_in as f64).sqrt();
                Init::Uniform {
                    lo: -bound,
                    up: bound,
                }
            }
            _ => Init::Const(0.0),
        }
    }
}
