//! Each test says what it needs of the CPU (`cpu::testing`): the decoding kernels the AVX2
//! tier, and tests that call a build directly loop over every build the running tier has
//! (`Kernels::runnable`), so one run on an AVX-512 VNNI host covers the AVX2 build too.

use super::*;
use crate::cpu::testing::{Needs, runs as tier_runs};
use crate::testing::uniform;

/// `rows` random rows of `d_in` quantized to `ty` (scales of every size, some values large).
fn blocks(ty: BlockType, rows: usize, d_in: usize, seed: u64) -> Vec<u8> {
    let mut next = uniform(seed);
    let values: Vec<f32> = (0..rows * d_in)
        .map(|i| {
            next()
                * if i % 97 == 0 {
                    40.0
                } else {
                    1.0 + (i / d_in) as f32
                }
        })
        .collect();
    let mut out = Vec::new();
    ty.quantize(&values, &mut out);
    out
}

/// What the kernel computes, from the definitions: the row decoded by `quant` (its tested
/// decoder), times the inputs as rounded (integer times scale), summed in f64. Also the sum
/// of the terms' sizes, for a tolerance.
fn reference(ty: BlockType, row: &[u8], inputs: &Inputs, b: usize) -> (f64, f64) {
    let d_in = inputs.d_in;
    let mut w = vec![0.0f32; d_in];
    ty.decode(row, &mut w);
    let x: Vec<f64> = match Format::of(ty).expect("an int8 type") {
        Format::Blocks32 => (0..d_in)
            .map(|i| {
                let k = b * d_in + i;
                f64::from(inputs.q32[k]) * f64::from(inputs.d32[k / 32])
            })
            .collect(),
        Format::Blocks256 => (0..d_in)
            .map(|i| {
                let k = b * d_in + i;
                f64::from(inputs.q256[k]) * f64::from(inputs.scales256[k / 256])
            })
            .collect(),
    };
    let terms = w.iter().zip(&x).map(|(&w, x)| f64::from(w) * x);
    let size = w
        .iter()
        .zip(&x)
        .map(|(&w, x)| (f64::from(w) * x).abs())
        .sum();
    (terms.sum(), size)
}

const TYPES: [BlockType; 4] = [
    BlockType::Q8_0,
    BlockType::Q4_0,
    BlockType::Q4K,
    BlockType::Q6K,
];

/// Every row times every vector, through `four` and `one`, equals the definition up to the
/// order of f32 additions, for batches that use both of `four`'s tiles: each build the
/// tier runs (AVX2 from the avx2 tier, VNNI from avx512vnni).
#[test]
fn products_match_the_definition() {
    if !tier_runs(Needs::Tier(Tier::Avx2)) {
        return;
    }
    for kernels in Kernels::runnable() {
        products_match_the_definition_on(kernels);
    }
}

fn products_match_the_definition_on(kernels: Kernels) {
    let mut next = uniform(0x9e37_79b9_7f4a_7c15);
    for ty in TYPES {
        for d_in in [256, 512, 576, 1536] {
            if !runs(ty, d_in) {
                continue;
            }
            let weight = blocks(ty, 5, d_in, d_in as u64);
            let row_bytes = ty.row_bytes(d_in).unwrap();
            let rows: Vec<&[u8]> = weight.chunks(row_bytes).collect();
            for n in [1, 3, 6] {
                let xs: Vec<f32> = (0..n * d_in).map(|_| next() * 3.0).collect();
                let inputs = Inputs::for_kernels(&xs, d_in, [ty], kernels);
                let mut got = vec![f32::NAN; n * 5];
                four(
                    ty,
                    [rows[0], rows[1], rows[2], rows[3]],
                    &inputs,
                    &mut |b, r, v| got[b * 5 + r] = v,
                );
                one(ty, rows[4], &inputs, &mut |b, v| got[b * 5 + 4] = v);
                for b in 0..n {
                    for (r, row) in rows.iter().enumerate() {
                        let (want, size) = reference(ty, row, &inputs, b);
                        let error = (f64::from(got[b * 5 + r]) - want).abs();
                        assert!(
                            error <= 1e-5 * size,
                            "{kernels:?} {ty} d_in {d_in} vector {b}/{n} row {r}: {} vs {want} \
                             (size {size})",
                            got[b * 5 + r]
                        );
                    }
                }
            }
        }
    }
}

/// The two builds multiply the same integers: their products differ only by the order of
/// f32 additions (both builds: the avx512vnni tier).
#[test]
fn the_builds_agree() {
    if !tier_runs(Needs::Tier(Tier::Avx512Vnni)) {
        return;
    }
    assert_eq!(Kernels::runnable(), [Kernels::Avx2, Kernels::Vnni]);
    let mut next = uniform(0x51_7cc1_b727_220a);
    for ty in TYPES {
        for d_in in [576, 1536, 2048] {
            if !runs(ty, d_in) {
                continue;
            }
            let weight = blocks(ty, 4, d_in, 11);
            let row_bytes = ty.row_bytes(d_in).unwrap();
            let rows: Vec<&[u8]> = weight.chunks(row_bytes).collect();
            let rows = [rows[0], rows[1], rows[2], rows[3]];
            let xs: Vec<f32> = (0..d_in).map(|_| next() * 2.0).collect();
            let products = |kernels| {
                let inputs = Inputs::for_kernels(&xs, d_in, [ty], kernels);
                let mut out = [0.0f32; 4];
                four(ty, rows, &inputs, &mut |_, r, v| out[r] = v);
                out
            };
            let (avx2, vnni) = (products(Kernels::Avx2), products(Kernels::Vnni));
            for r in 0..4 {
                let (_, size) = reference(ty, rows[r], &Inputs::new(&xs, d_in, [ty]), 0);
                assert!(
                    f64::from((avx2[r] - vnni[r]).abs()) <= 1e-6 * size,
                    "{ty} d_in {d_in} row {r}: AVX2 {} vs VNNI {} (size {size})",
                    avx2[r],
                    vnni[r]
                );
            }
        }
    }
}

/// A vector's products are the same bits alone and in a batch of any size, with each build
/// the tier runs.
#[test]
fn batched_vectors_equal_each_alone() {
    if !tier_runs(Needs::Tier(Tier::Avx2)) {
        return;
    }
    for kernels in Kernels::runnable() {
        batched_vectors_equal_each_alone_on(kernels);
    }
}

fn batched_vectors_equal_each_alone_on(kernels: Kernels) {
    let mut next = uniform(0x2545_f491_4f6c_dd1d);
    let d_in = 512;
    for ty in TYPES {
        let weight = blocks(ty, 4, d_in, 7);
        let row_bytes = ty.row_bytes(d_in).unwrap();
        let rows: Vec<&[u8]> = weight.chunks(row_bytes).collect();
        let rows = [rows[0], rows[1], rows[2], rows[3]];
        let xs: Vec<f32> = (0..9 * d_in).map(|_| next()).collect();
        let products = |xs: &[f32]| {
            let inputs = Inputs::for_kernels(xs, d_in, [ty], kernels);
            let mut out = vec![0u32; inputs.len() * 4];
            four(ty, rows, &inputs, &mut |b, r, v| {
                out[b * 4 + r] = v.to_bits()
            });
            out
        };
        let alone: Vec<u32> = xs.chunks(d_in).flat_map(products).collect();
        for n in 2..=9 {
            assert_eq!(
                products(&xs[..n * d_in]),
                alone[..n * 4],
                "{kernels:?} {ty}, batch of {n}"
            );
        }
    }
}

/// Inputs round as ggml's reference rounds them: a block's largest magnitude to ±127, the
/// rest to the nearest step, an all-zero block to zeros with a zero scale.
#[test]
fn inputs_round_as_ggml() {
    let mut x: Vec<f32> = (0..256).map(|i| (i as f32 - 100.0) / 10.0).collect();
    x[..32].fill(0.0);
    // Laid out for the VNNI kernels, which read the most (only laid out: any CPU does it).
    let types = [BlockType::Q4_0, BlockType::Q4K];
    let inputs = Inputs::for_kernels(&x, 256, types, Kernels::Vnni);
    assert_eq!(inputs.d32[0], 0.0);
    assert!(inputs.q32[..32].iter().all(|&q| q == 0));
    assert_eq!(inputs.q256[255], 127);
    assert_eq!(inputs.scales256[0], 15.5 / 127.0);
    assert_eq!(
        inputs.q256[32],
        (x[32] * (1.0 / (15.5f32 / 127.0))).round_ties_even() as i8
    );
    let sum: i32 = inputs.q256[..16].iter().map(|&q| i32::from(q)).sum();
    assert_eq!(i32::from(inputs.sums16[0]), sum);
    assert_eq!(
        &inputs.paired[32..64],
        &inputs.q256[64..96],
        "Q4_K's order: group 2 second"
    );
}

/// Throughput of each kernel on one vector, from L2 and from memory: `cargo test --release
/// -p runtime --lib int8::tests::speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn speed() {
    let d_in = 2048;
    for ty in TYPES {
        for rows in [64, 16384] {
            let weight = blocks(ty, rows, d_in, 3);
            let xs: Vec<f32> = (0..d_in).map(|i| (i as f32).sin()).collect();
            let inputs = Inputs::new(&xs, d_in, [ty]);
            let out: Vec<AtomicU32> = (0..rows).map(|_| AtomicU32::new(0)).collect();
            let reps = (1 << 30) / weight.len();
            let start = std::time::Instant::now();
            for _ in 0..reps {
                bundles(ty, &weight, &inputs, &out, rows, 0..rows / 4);
            }
            let s = start.elapsed().as_secs_f64();
            println!(
                "{ty} {rows} rows: {:.1} GB/s, {:.2} ns per block-row",
                (reps * weight.len()) as f64 / s / 1e9,
                s * 1e9 / (reps * weight.len() / ty.bytes() * ty.values() / 256) as f64
            );
        }
    }
}

/// A prompt's products through `rows::linear_rows` equal the definition (each row rounded
/// as `round_block` rounds it, per 32 or per 256, times the decoded weights, summed in
/// f64) up to the order of f32 additions; and each row's result is the one it gets alone,
/// to the bit, at 1, 2 and 3 threads: shapes with partial tiles, panels, groups of panels
/// and (for the types of 32) steps. With each build of the prompt kernel the tier runs
/// (VNNI's takes every type; the AVX2 build, 4- and 6-bit codes), and the two builds give
/// the same bits.
#[test]
fn prompt_rows() {
    if !tier_runs(Needs::Tier(Tier::Avx2)) {
        return;
    }
    assert!(rows::runs(BlockType::Q4_0, 256));
    for ty in TYPES {
        let shapes = match values_per_scale(ty) {
            32 => [(13, 576, 70), (25, 64, 130), (30, 768, 16)],
            _ => [(13, 512, 70), (25, 256, 130), (30, 768, 16)],
        };
        for (rows, d_in, d_out) in shapes {
            let weight = blocks(ty, d_out, d_in, rows as u64);
            let mut next = uniform(5 + rows as u64);
            let x: Vec<f32> = (0..rows * d_in)
                .map(|i| next() * if i % 53 == 0 { 30.0 } else { 1.0 })
                .collect();
            let builds: Vec<Kernels> = (Kernels::runnable().into_iter())
                .filter(|&kernels| rows::runs_on(ty, d_in, kernels))
                .collect();
            let products = |x: &[f32], kernels| {
                rows::Prompt::for_kernels(x, d_in, kernels).linear(ty, &weight)
            };
            let mut each = Vec::new();
            for &kernels in &builds {
                let got = products(&x, kernels);
                prompt_rows_follow_the_definition(ty, (rows, d_in, d_out), &x, &weight, &got);
                for threads in [1, 2, 3] {
                    crate::testing::in_pool(threads, || {
                        let again = products(&x, kernels);
                        assert!(
                            same_bits(&again, &got),
                            "{ty} {kernels:?}: {threads} threads"
                        );
                        for r in [0, rows / 2, rows - 1] {
                            let alone = products(&x[r * d_in..][..d_in], kernels);
                            assert!(
                                same_bits(&alone, &got[r * d_out..][..d_out]),
                                "{ty} {kernels:?}: row {r} alone at {threads} threads"
                            );
                        }
                    });
                }
                each.push(got);
            }
            assert!(
                each.windows(2).all(|two| same_bits(&two[0], &two[1])),
                "{ty} {rows}x{d_in}x{d_out}: the builds {builds:?} differ"
            );
        }
    }
}

/// Weights whose every code is its largest (Q8_0's 127, 4-bit 15, 6-bit 63) times inputs
/// that all round to the largest integer of one sign: where the AVX2 prompt kernel's sums
/// in i16 lanes are largest, and would overflow if it kept them there a step too long.
#[test]
fn prompt_rows_at_the_extremes() {
    if !tier_runs(Needs::Tier(Tier::Avx2)) {
        return;
    }
    let (rows, d_in, d_out) = (14, 512, 16);
    for ty in TYPES {
        let mut weight = blocks(ty, d_out, d_in, 9);
        let (codes, largest) = match ty {
            BlockType::Q8_0 => (2..34, 0x7f),
            BlockType::Q4_0 => (2..18, 0xff),
            BlockType::Q4K => (16..144, 0xff),
            _ => (0..192, 0xff),
        };
        for block in weight.chunks_exact_mut(ty.bytes()) {
            block[codes.clone()].fill(largest);
        }
        for sign in [1.0, -1.0] {
            let x = vec![sign; rows * d_in];
            for kernels in Kernels::runnable() {
                if rows::runs_on(ty, d_in, kernels) {
                    let got = rows::Prompt::for_kernels(&x, d_in, kernels).linear(ty, &weight);
                    prompt_rows_follow_the_definition(ty, (rows, d_in, d_out), &x, &weight, &got);
                }
            }
        }
    }
}

/// The inputs rounded with one scale for `ty`'s products: 32 (Q8_0, Q4_0) or 256.
fn values_per_scale(ty: BlockType) -> usize {
    match Format::of(ty).expect("an int8 type") {
        Format::Blocks32 => 32,
        Format::Blocks256 => 256,
    }
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// `got`, the products of the prompt `x` (`rows` rows of `d_in`) with the `d_out` rows of
/// `ty` blocks in `weight`, as the definition says (see [`prompt_rows`]).
fn prompt_rows_follow_the_definition(
    ty: BlockType,
    (rows, d_in, d_out): (usize, usize, usize),
    x: &[f32],
    weight: &[u8],
    got: &[f32],
) {
    let per = values_per_scale(ty);
    let row_bytes = ty.row_bytes(d_in).expect("whole blocks");
    let mut w = vec![0.0f32; d_in];
    let mut q = vec![0i8; d_in];
    for r in 0..rows {
        let x = &x[r * d_in..][..d_in];
        let scales: Vec<f32> = (x.chunks_exact(per).zip(q.chunks_exact_mut(per)))
            .map(|(x, q)| round_block(x, q))
            .collect();
        for j in 0..d_out {
            ty.decode(&weight[j * row_bytes..][..row_bytes], &mut w);
            let terms =
                (0..d_in).map(|k| f64::from(w[k]) * f64::from(q[k]) * f64::from(scales[k / per]));
            let (want, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
            let value = f64::from(got[r * d_out + j]);
            assert!(
                (value - want).abs() <= 1e-5 * size,
                "{ty} {rows}x{d_in}x{d_out}: row {r} column {j}: {value} vs {want}"
            );
        }
    }
}

/// Multiply-adds per second of `rows::linear_rows` on a prompt of 512 at 1B's widest
/// shape: `cargo test --release -p runtime prompt_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn prompt_speed() {
    let (rows, d_in, d_out) = (512, 2048, 8192);
    let x: Vec<f32> = (0..rows * d_in).map(|i| (i as f32).sin()).collect();
    for ty in TYPES.into_iter().filter(|&ty| rows::runs(ty, d_in)) {
        let weight = blocks(ty, d_out, d_in, 3);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let start = std::time::Instant::now();
            std::hint::black_box(rows::linear_rows(&x, ty, &weight, d_in));
            best = best.min(start.elapsed().as_secs_f64());
        }
        let macs = (rows * d_in * d_out) as f64;
        println!(
            "{ty}: {:.1} ms, {:.1} GMAC/s",
            best * 1e3,
            macs / best / 1e9
        );
    }
}

/// The vectorized rounding (the avx512 tier's, called directly) gives the scalar one's scale
/// and integers, bit for bit, on values of every size, halves that tie (2.5 * d and the
/// like), zeros, a NaN and an infinity.
#[cfg(target_arch = "x86_64")]
#[test]
fn rounding_alike() {
    if !tier_runs(Needs::Tier(Tier::Avx512)) {
        return;
    }
    let mut next = uniform(17);
    for case in 0..200 {
        let mut x: Vec<f32> = (0..256).map(|_| next() * (case as f32 + 0.01)).collect();
        if case % 3 == 0 {
            // Exact ties once scaled: max |x| = 127 makes d = 1.
            x[0] = 127.0;
            for (i, v) in x.iter_mut().enumerate().skip(1) {
                *v = (i % 40) as f32 - 19.5;
            }
        }
        if case == 4 {
            x.fill(0.0);
        }
        if case == 5 {
            x[7] = f32::NAN;
        }
        if case == 7 {
            x[9] = f32::INFINITY;
        }
        let (mut a, mut b) = (vec![0i8; 256], vec![0i8; 256]);
        // SAFETY: the tier has AVX-512 F and BW (checked above); 256 values, as many bytes.
        let da = unsafe { avx512::round_block(&x, &mut a) };
        let db = round_scalar(&x, &mut b);
        assert_eq!((da.to_bits(), &a), (db.to_bits(), &b), "case {case}");
        // And `round_block`, which picks one of them.
        assert_eq!(
            round_block(&x, &mut a).to_bits(),
            db.to_bits(),
            "case {case}"
        );
        assert_eq!(a, b, "case {case}");
    }
}
