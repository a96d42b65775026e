use super::*;
use crate::testing::{in_pool, uniform};

/// One query row's attention in f64, from the keys and values as stored.
fn reference<S: Stored>(
    query: &[f32],
    keys: &[S],
    values: &[S],
    visible: std::ops::Range<usize>,
    heads: Heads,
) -> Vec<f64> {
    let Heads {
        n_heads,
        n_kv_heads,
        head_dim,
    } = heads;
    let kv_width = n_kv_heads * head_dim;
    let mut out = vec![0.0; n_heads * head_dim];
    for head in 0..n_heads {
        let column = head / (n_heads / n_kv_heads) * head_dim;
        let q = &query[head * head_dim..][..head_dim];
        let scores: Vec<f64> = (visible.clone())
            .map(|j| {
                let k = &keys[j * kv_width + column..][..head_dim];
                q.iter()
                    .zip(k)
                    .map(|(&q, k)| f64::from(q) * f64::from(k.widen()))
                    .sum()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for (j, w) in visible.clone().zip(&weights) {
            let v = &values[j * kv_width + column..][..head_dim];
            for (o, v) in out[head * head_dim..][..head_dim].iter_mut().zip(v) {
                *o += w / total * f64::from(v.widen());
            }
        }
    }
    out
}

/// Decoding's attention, for each of a batch of query rows at its own position, within
/// rounding of the f64 reference: for groups of 1, 2, 3, 4, 5 and 7 query heads (every
/// run of heads each instruction set's blocks take), head widths the grouped span takes
/// and one it does not (48), every cache type, with and without a window, at context
/// lengths around the blocks' and tiles' edges, on 1 to 3 threads.
fn decodes_as_reference<S: Stored>() {
    let shapes = [
        (9, 3, 64),
        (4, 1, 256),
        (14, 2, 64),
        (8, 8, 64),
        (8, 2, 128),
        (10, 2, 64),
        (4, 2, 64),
        (6, 2, 48),
    ];
    for (n_heads, n_kv_heads, head_dim) in shapes {
        let heads = Heads {
            n_heads,
            n_kv_heads,
            head_dim,
        };
        let kv_width = n_kv_heads * head_dim;
        let capacity = 300;
        let mut random = uniform((n_heads * 1000 + head_dim) as u64);
        let mut stored = |n: usize, scale: f32| -> Vec<S> {
            (0..n).map(|_| S::narrow(random() * scale)).collect()
        };
        // Keys scaled so that the scores spread over several units: softmax is not flat.
        let keys = stored(capacity * kv_width, 4.0);
        let values = stored(capacity * kv_width, 1.0);
        let queries: Vec<f32> = stored(2 * n_heads * head_dim, 1.0)
            .iter()
            .map(|q| q.widen())
            .collect();
        for (start, window) in [
            (0, None),
            (6, None),
            (7, None),
            (8, None),
            (16, None),
            (41, None),
            (299, None),
            (130, Some(37)),
        ] {
            for threads in 1..=3 {
                // Two batch entries over one cache, at positions start and start / 2.
                let positions = [start, start / 2];
                let outs: Vec<Vec<f32>> = positions
                    .iter()
                    .enumerate()
                    .map(|(b, &position)| {
                        in_pool(threads, || {
                            CausalAttention {
                                queries: Matrix::rows_of(
                                    &queries[b * n_heads * head_dim..][..n_heads * head_dim],
                                    n_heads * head_dim,
                                ),
                                keys: Matrix::rows_of(&keys, kv_width),
                                values: Matrix::rows_of(&values, kv_width),
                                batch: 1,
                                seq: 1,
                                start: position,
                                heads,
                                window,
                            }
                            .decode()
                        })
                    })
                    .collect();
                for (b, (&position, out)) in positions.iter().zip(&outs).enumerate() {
                    let first = window.map_or(0, |w| (position + 1).saturating_sub(w));
                    let query = &queries[b * n_heads * head_dim..][..n_heads * head_dim];
                    let want = reference(query, &keys, &values, first..position + 1, heads);
                    for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            (f64::from(got) - want).abs() <= 1e-5 + 1e-4 * want.abs(),
                            "{heads:?}, position {position}, window {window:?}, {threads} \
                             threads, output {i}: {got} against {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn decoding_matches_the_reference_in_f32() {
    decodes_as_reference::<f32>();
}

#[test]
fn decoding_matches_the_reference_in_bf16() {
    decodes_as_reference::<half::bf16>();
}

#[test]
fn decoding_matches_the_reference_in_f16() {
    decodes_as_reference::<half::f16>();
}

/// Decoding's attention on SmolLM2's shapes (9 query heads, 3 key/value heads of 64, an
/// f32 cache), 30 layers' caches, on 2 threads: microseconds per layer with the caches
/// where the last token left them, and after 96 MB were read in between (as a decoded
/// token's weights evict them): `cargo test --release -p kernels --lib
/// attention::tests::decode_speed -- --ignored --nocapture`, with `RUNTIME_CPU` to pick
/// the blocks.
#[test]
#[ignore]
fn decode_speed() {
    let heads = Heads {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
    };
    let (layers, capacity, kv_width) = (30, 4096, 192);
    let mut random = uniform(7);
    let caches: Vec<Vec<f32>> = (0..2 * layers)
        .map(|_| (0..capacity * kv_width).map(|_| random()).collect())
        .collect();
    let query: Vec<f32> = (0..576).map(|_| random()).collect();
    let evict = vec![1u8; 96 << 20];
    in_pool(2, || {
        for position in [150, 400, 1000, 3600] {
            for cold in [false, true] {
                let reps = 20_000 / position + 2;
                let mut seconds = 0.0;
                let mut sink = 0.0f32;
                for _ in 0..reps {
                    if cold {
                        sink += evict.iter().step_by(64).map(|&b| f32::from(b)).sum::<f32>();
                    }
                    crate::team::with_team(|| {
                        let start = std::time::Instant::now();
                        for layer in 0..layers {
                            let out = CausalAttention {
                                queries: Matrix::rows_of(&query, 576),
                                keys: Matrix::rows_of(&caches[2 * layer], kv_width),
                                values: Matrix::rows_of(&caches[2 * layer + 1], kv_width),
                                batch: 1,
                                seq: 1,
                                start: position,
                                heads,
                                window: None,
                            }
                            .decode();
                            sink += out[0];
                        }
                        seconds += start.elapsed().as_secs_f64();
                    });
                }
                let cache = if cold { "evicted" } else { "as left" };
                let us = seconds / (reps * layers) as f64 * 1e6;
                println!("position {position}, caches {cache}: {us:.1} us per layer ({sink})");
            }
        }
    });
}
