//! RoPE's frequencies as the model computes them from the config: what the rotary tables
//! (`model::rope`) are made of, and what `LlamaConfig::from_hf` checks a config's values
//! through (a value fine as an f64 can be 0 or infinite as an f32).

use super::RopeScaling;

/// RoPE's inverse frequencies, `[head_dim / 2]`, and the factor on cos and sin (1 but for
/// YaRN), as transformers' `modeling_rope_utils` computes them: in f32, in the same order,
/// so angles round the same way.
pub fn rope_frequencies(dim: usize, rope_theta: f64, scaling: &RopeScaling) -> (Vec<f32>, f32) {
    let theta = rope_theta as f32;
    // `base ** (arange(0, dim, 2) / dim)`
    let powers: Vec<f32> = (0..dim / 2)
        .map(|i| theta.powf((2 * i) as f32 / dim as f32))
        .collect();
    let plain = powers.iter().map(|p| 1.0 / p);
    match *scaling {
        RopeScaling::None => (plain.collect(), 1.0),
        RopeScaling::Linear { factor } => (plain.map(|f| f / factor as f32).collect(), 1.0),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: context,
        } => {
            let (factor, low, high, context) = (
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                context as f32,
            );
            let (low_freq_wavelen, high_freq_wavelen) = (context / low, context / high);
            let scaled = plain.map(|f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < high_freq_wavelen {
                    f
                } else if wavelen > low_freq_wavelen {
                    f / factor
                } else {
                    let smooth = (context / wavelen - low) / (high - low);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            });
            (scaled.collect(), 1.0)
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: context,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } => {
            // The dimension (of `dim`) where a frequency turns `rotations` times over the
            // original context: `find_correction_dim`, in f64 as Python computes it.
            let (base, dims) = (rope_theta, dim as f64);
            let correction = |rotations: f64| {
                dims * (context / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
            };
            let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dims - 1.0));
            if low == high {
                high += 0.001; // transformers' guard against a zero-width ramp
            }
            let scaled = powers.iter().enumerate().map(|(i, p)| {
                let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                let interpolated = 1.0 / (factor as f32 * p);
                interpolated * (1.0 - extrapolation) + (1.0 / p) * extrapolation
            });
            (scaled.collect(), attention_factor as f32)
        }
    }
}
