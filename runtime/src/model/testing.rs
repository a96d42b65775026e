//! Seeded random test data, so that a failing test reruns exactly.

use burn::module::{ModuleMapper, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Standard normal values (Box-Muller) from `seed`.
pub fn normal<B: Backend, const D: usize>(shape: [usize; D], seed: u64) -> Tensor<B, D> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|_| {
            let (u, v): (f32, f32) = (1.0 - rng.random::<f32>(), rng.random());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect();
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// Gives every parameter seeded random values: matrices normal with standard deviation
/// 0.15, vectors (norm weights, biases) uniform in `[0.5, 1.5)`, so that none is left at a
/// value (0, 1) that would hide a bug.
pub struct Randomize(pub u64);

impl<B: Backend> ModuleMapper<B> for Randomize {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        self.0 += 1;
        let seed = self.0;
        param.map(|t| {
            let shape: [usize; D] = t.dims();
            if D == 1 {
                let mut rng = StdRng::seed_from_u64(seed);
                let values: Vec<f32> = (0..shape[0]).map(|_| rng.random_range(0.5..1.5)).collect();
                Tensor::from_data(TensorData::new(values, shape), &t.device())
            } else {
                normal::<B, D>(shape, seed).to_device(&t.device()) * 0.15
            }
        })
    }
}
