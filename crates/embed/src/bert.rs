//! A BERT encoder (post-LayerNorm, absolute positions, GELU), as sentence-transformers models
//! of the MiniLM class use it, computing in f32 on the CPU.
//!
//! Sequences are never padded: the linear layers run over the tokens of every sequence of a
//! batch at once, and attention runs sequence by sequence, so a batch costs what its tokens
//! cost and a short query costs only its own tokens.

use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::kernel::matmul_t;

/// The fields of a Hugging Face `config.json` that the encoder needs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct BertConfig {
    pub(crate) hidden_size: usize,
    vocab_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_position_embedding_type")]
    position_embedding_type: String,
}

fn default_eps() -> f64 {
    1e-12
}

fn default_act() -> String {
    "gelu".to_owned()
}

fn default_position_embedding_type() -> String {
    "absolute".to_owned()
}

struct Linear {
    /// out × in, row-major.
    weight: Vec<f32>,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

impl Linear {
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let rows = x.len() / self.inputs;
        let mut y = vec![0.0; rows * self.outputs];
        matmul_t(x, &self.weight, Some(&self.bias), self.inputs, &mut y);
        y
    }
}

struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    /// Normalises every row of `x` in place.
    fn apply(&self, x: &mut [f32]) {
        let width = self.gamma.len() as f32;
        for row in x.chunks_exact_mut(self.gamma.len()) {
            let mean = row.iter().sum::<f32>() / width;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width;
            let scale = 1.0 / (var + self.eps).sqrt();
            for ((v, g), b) in row.iter_mut().zip(&self.gamma).zip(&self.beta) {
                *v = (*v - mean) * scale * g + b;
            }
        }
    }
}

struct Layer {
    /// Query, key and value projections stacked into one (3·hidden × hidden).
    qkv: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// The encoder's weights.
pub(crate) struct Bert {
    config: BertConfig,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
}

impl Bert {
    /// Loads the weights named as `transformers` saves a `BertModel` (with or without the
    /// `bert.` prefix of the task heads' checkpoints).
    pub(crate) fn load(config: BertConfig, weights: &[u8]) -> Result<Self, String> {
        if config.hidden_act != "gelu" {
            return Err(format!("hidden_act {:?} is not supported (gelu is)", config.hidden_act));
        }
        if config.position_embedding_type != "absolute" {
            return Err(format!(
                "position_embedding_type {:?} is not supported (absolute is)",
                config.position_embedding_type
            ));
        }
        if config.num_attention_heads == 0
            || !config.hidden_size.is_multiple_of(config.num_attention_heads)
        {
            return Err("hidden_size is not a multiple of num_attention_heads".to_owned());
        }
        let tensors = SafeTensors::deserialize(weights).map_err(|e| e.to_string())?;
        let prefix =
            if tensors.names().iter().any(|n| n.starts_with("bert.")) { "bert." } else { "" };
        let h = config.hidden_size;
        let eps = config.layer_norm_eps as f32;
        let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>, String> {
            let full = format!("{prefix}{name}");
            let view = tensors.tensor(&full).map_err(|e| format!("{full}: {e}"))?;
            if view.dtype() != Dtype::F32 {
                return Err(format!("{full}: dtype {:?}, only F32 is supported", view.dtype()));
            }
            if view.shape() != shape {
                return Err(format!("{full}: shape {:?}, expected {shape:?}", view.shape()));
            }
            Ok(view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        let linear = |name: &str, outputs: usize, inputs: usize| -> Result<Linear, String> {
            Ok(Linear {
                weight: get(&format!("{name}.weight"), &[outputs, inputs])?,
                bias: get(&format!("{name}.bias"), &[outputs])?,
                inputs,
                outputs,
            })
        };
        let norm = |name: &str| -> Result<LayerNorm, String> {
            Ok(LayerNorm {
                gamma: get(&format!("{name}.weight"), &[h])?,
                beta: get(&format!("{name}.bias"), &[h])?,
                eps,
            })
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let at = |part: &str| format!("encoder.layer.{l}.{part}");
            let (q, k, v) = (
                linear(&at("attention.self.query"), h, h)?,
                linear(&at("attention.self.key"), h, h)?,
                linear(&at("attention.self.value"), h, h)?,
            );
            layers.push(Layer {
                qkv: Linear {
                    weight: [q.weight, k.weight, v.weight].concat(),
                    bias: [q.bias, k.bias, v.bias].concat(),
                    inputs: h,
                    outputs: 3 * h,
                },
                attention_out: linear(&at("attention.output.dense"), h, h)?,
                attention_norm: norm(&at("attention.output.LayerNorm"))?,
                intermediate: linear(&at("intermediate.dense"), config.intermediate_size, h)?,
                output: linear(&at("output.dense"), h, config.intermediate_size)?,
                output_norm: norm(&at("output.LayerNorm"))?,
            });
        }
        Ok(Bert {
            word: get("embeddings.word_embeddings.weight", &[config.vocab_size, h])?,
            position: get(
                "embeddings.position_embeddings.weight",
                &[config.max_position_embeddings, h],
            )?,
            token_type: get("embeddings.token_type_embeddings.weight", &[2, h])?[..h].to_vec(),
            embedding_norm: norm("embeddings.LayerNorm")?,
            layers,
            config,
        })
    }

    /// Returns the longest sequence the position embeddings cover.
    pub(crate) fn max_tokens(&self) -> usize {
        self.config.max_position_embeddings
    }

    /// Returns the mean of the last hidden states of each sequence of token ids, L2-normalised.
    pub(crate) fn embed(&self, sequences: &[&[u32]]) -> Result<Vec<Vec<f32>>, String> {
        let h = self.config.hidden_size;
        let vocab = self.word.len() / h;
        let total: usize = sequences.iter().map(|s| s.len()).sum();
        let mut x = Vec::with_capacity(total * h);
        for ids in sequences {
            if ids.is_empty() || ids.len() > self.max_tokens() {
                return Err(format!(
                    "a sequence of {} tokens (1..={})",
                    ids.len(),
                    self.max_tokens()
                ));
            }
            for (position, &id) in ids.iter().enumerate() {
                let id = id as usize;
                if id >= vocab {
                    return Err(format!("token id {id} outside the vocabulary of {vocab}"));
                }
                let word = &self.word[id * h..(id + 1) * h];
                let pos = &self.position[position * h..(position + 1) * h];
                x.extend(word.iter().zip(pos).zip(&self.token_type).map(|((w, p), t)| w + p + t));
            }
        }
        self.embedding_norm.apply(&mut x);
        let lengths: Vec<usize> = sequences.iter().map(|s| s.len()).collect();
        for layer in &self.layers {
            x = self.layer(layer, x, &lengths);
        }
        Ok(lengths
            .iter()
            .scan(0, |start, &len| {
                let rows = &x[*start * h..(*start + len) * h];
                *start += len;
                let mut mean = vec![0.0f32; h];
                for row in rows.chunks_exact(h) {
                    for (m, v) in mean.iter_mut().zip(row) {
                        *m += v;
                    }
                }
                let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12 * len as f32);
                // mean/len, normalised: the division by the length cancels out.
                mean.iter_mut().for_each(|v| *v /= norm);
                Some(mean)
            })
            .collect())
    }

    fn layer(&self, layer: &Layer, x: Vec<f32>, lengths: &[usize]) -> Vec<f32> {
        let h = self.config.hidden_size;
        let qkv = layer.qkv.forward(&x);
        let mut context = vec![0.0; x.len()];
        let mut start = 0;
        for &len in lengths {
            self.attention(
                &qkv[start * 3 * h..(start + len) * 3 * h],
                &mut context[start * h..(start + len) * h],
            );
            start += len;
        }
        let mut attended = layer.attention_out.forward(&context);
        attended.iter_mut().zip(&x).for_each(|(a, x)| *a += x);
        layer.attention_norm.apply(&mut attended);
        let mut inner = layer.intermediate.forward(&attended);
        gelu(&mut inner);
        let mut out = layer.output.forward(&inner);
        out.iter_mut().zip(&attended).for_each(|(o, a)| *o += a);
        layer.output_norm.apply(&mut out);
        out
    }

    /// Multi-head self-attention over one sequence: `qkv` holds each token's query, key and
    /// value (3·hidden), `context` receives each token's attended values (hidden).
    fn attention(&self, qkv: &[f32], context: &mut [f32]) {
        let h = self.config.hidden_size;
        let heads = self.config.num_attention_heads;
        let d = h / heads;
        let len = qkv.len() / (3 * h);
        let scale = 1.0 / (d as f32).sqrt();
        let mut q = vec![0.0; len * d];
        let mut k = vec![0.0; len * d];
        let mut v_t = vec![0.0; d * len];
        let mut scores = vec![0.0; len * len];
        let mut out = vec![0.0; len * d];
        for head in 0..heads {
            for t in 0..len {
                let token = &qkv[t * 3 * h..(t + 1) * 3 * h];
                let at = head * d;
                q[t * d..(t + 1) * d].copy_from_slice(&token[at..at + d]);
                k[t * d..(t + 1) * d].copy_from_slice(&token[h + at..h + at + d]);
                for (c, value) in token[2 * h + at..2 * h + at + d].iter().enumerate() {
                    v_t[c * len + t] = *value;
                }
            }
            matmul_t(&q, &k, None, d, &mut scores);
            for row in scores.chunks_exact_mut(len) {
                let max = row.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s)) * scale;
                let mut sum = 0.0;
                for s in row.iter_mut() {
                    *s = (*s * scale - max).exp();
                    sum += *s;
                }
                row.iter_mut().for_each(|s| *s /= sum);
            }
            matmul_t(&scores, &v_t, None, len, &mut out);
            for t in 0..len {
                context[t * h + head * d..t * h + (head + 1) * d]
                    .copy_from_slice(&out[t * d..(t + 1) * d]);
            }
        }
    }
}

/// GELU as BERT defines it, `x · Φ(x)` with the exact normal CDF, over a slice, vectorised.
fn gelu(values: &mut [f32]) {
    pulp::Arch::new().dispatch(|| {
        for v in values.iter_mut() {
            *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
        }
    });
}

/// The error function to within a few ulp of f32: a rational fit `x·P(x²)/Q(x²)` on
/// [-4, 4], where erf has reached ±1 in f32 (the approximation Eigen and XLA use). Branch-free,
/// so the loops that call it vectorise.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    for a in [
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_6e-3,
        -1.609_603_3e-2,
    ] {
        p = p * x2 + a;
    }
    let mut q = -1.456_607_2e-5_f32;
    for b in [-2.133_740_6e-4, -1.682_827e-3, -7.373_329_2e-3, -1.426_473_9e-2] {
        q = q * x2 + b;
    }
    x * p / q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-1.0, -0.842_700_8),
            (2.0, 0.995_322_3),
            (-3.5, -0.999_999_3),
        ] {
            assert!((erf(x) - want).abs() < 3e-7, "erf({x}) = {} not {want}", erf(x));
        }
    }
}
