//! Seeded random test data, so that a failing test reruns exactly.

/// Values in [-0.5, 0.5), from a xorshift generator seeded with `state`: cheap streams of
/// f32 for kernels' tests (sums that round differently in any other order).
pub fn uniform(mut state: u64) -> impl FnMut() -> f32 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// Runs `work` on a pool of `threads` threads, as the runtime runs the model.
pub fn in_pool<R: Send>(threads: usize, work: impl FnOnce() -> R + Send) -> R {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
    pool.expect("a thread pool").install(work)
}
