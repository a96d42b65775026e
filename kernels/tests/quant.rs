//! The kernels' ggml blocks (`kernels::quant`) against gguf-py, and the kernels over them
//! against the same kernels over the values the blocks decode to.
//!
//! Fixtures in tests/data/quant, made by scripts/quant_blocks_oracle.py:
//! - quantize.f32: 64 blocks of 32 hard inputs (random normals from 1e-3 to 1e4, zeros of
//!   both signs, exact ties at half steps, values a few ulps from a step where f32 rounding
//!   decides the code, the largest magnitude twice with opposite signs, scales past both
//!   ends of f16's range, f32 subnormals), named block by block in quantize.cases;
//!   TYPE.quantized: gguf-py's `gguf.quants.quantize` of them for Q8_0 and Q4_0, which the
//!   runtime must equal byte for byte; TYPE.ggml.quantized: llama.cpp's own quantizer
//!   (`ggml_quantize_chunk`, which runs `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`)
//!   on the same inputs. The two oracles agree on every byte of Q8_0 and on every Q4_0
//!   block but one: a block of -0.0s, whose d gguf-py stores as +0.0 and ggml as -0.0. A
//!   failure says, block by block, whether the runtime made ggml's bytes instead.
//! - TYPE.blocks and TYPE.f32 for all five types: 16 random blocks (random bits, finite
//!   f16 scales: small normals and arbitrary bit patterns) and gguf-py's
//!   `gguf.quants.dequantize` of them, which decoding must equal bit for bit.
//! - k_quantize.f32: 100 blocks of 256 f32 for the K types, which gguf-py does not quantize
//!   (so llama.cpp is the only oracle): 36 hard ones (normals from 1e-3 to 1e4, zeros of both
//!   signs, all one value, one outlier, one sign only, zero or constant groups, integers,
//!   scales down to under ggml's all-zero threshold) and, for each K type, 32 random blocks
//!   whose scale bytes ggml changes when the inputs move by an ulp, where a sum rounded in
//!   another order than ggml's would show; k_quantize.bf16: 160 random blocks of bf16
//!   (normal, heavy-tailed and uniform, at weight-like scales); k_quantize.cases: a name per
//!   block, f32 blocks first; Q4_K.ggml.quantized and Q6_K.ggml.quantized:
//!   `ggml_quantize_chunk` of them all (`quantize_row_q4_K_ref` / `quantize_row_q6_K_ref`,
//!   no importance matrix), which the runtime must equal byte for byte.

use std::path::PathBuf;

use half::f16;
use kernels::cpu::Tier;
use kernels::cpu::testing::{self, Needs};
use kernels::int8::Matmul;
use kernels::linear::linear_rows;
use kernels::matvec::{Rows, matvecs};
use kernels::quant::BlockType;
use kernels::team;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/quant")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (made by scripts/quant_blocks_oracle.py)",
            path.display()
        )
    })
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    (bytes.chunks_exact(4))
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Byte offsets of each type's f16 scale fields in a block, from ggml's block layouts
/// (`block_q8_0`, …, `block_q6_K`): written out here rather than asked of the code under test.
fn scale_offsets(ty: BlockType) -> &'static [usize] {
    match ty {
        BlockType::Q8_0 | BlockType::Q4_0 | BlockType::Q5_0 => &[0],
        BlockType::Q4K => &[0, 2],
        BlockType::Q6K => &[208],
        other => panic!("{other} is not kept, so not tested here"),
    }
}

/// The first index where `a` and `b` differ as bit patterns, with both values.
fn first_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len(), "lengths");
    (a.iter().zip(b).enumerate())
        .find(|(_, (a, b))| a.to_bits() != b.to_bits())
        .map(|(i, (&a, &b))| (i, a, b))
}

/// `ty.quantize` on every fixture block against gguf-py's bytes: every differing block
/// listed with its case, both byte strings and whether ours are ggml's.
fn quantizes_as_gguf_py(ty: BlockType) {
    let values = f32s(&fixture("quantize.f32"));
    let cases = String::from_utf8(fixture("quantize.cases")).expect("quantize.cases is text");
    let cases: Vec<&str> = cases.lines().collect();
    let gguf_py = fixture(&format!("{ty}.quantized"));
    let ggml = fixture(&format!("{ty}.ggml.quantized"));
    assert_eq!(cases.len() * 32, values.len(), "one case name per block");
    assert_eq!(
        gguf_py.len(),
        cases.len() * ty.bytes(),
        "{ty}: fixture size"
    );
    assert_eq!(ggml.len(), gguf_py.len(), "{ty}: ggml fixture size");
    let mut failures = Vec::new();
    for (i, block) in values.chunks_exact(32).enumerate() {
        let mut ours = Vec::new();
        ty.quantize(block, &mut ours);
        let want = &gguf_py[i * ty.bytes()..][..ty.bytes()];
        if ours != want {
            let ggml = &ggml[i * ty.bytes()..][..ty.bytes()];
            failures.push(format!(
                "{ty} block {i} ({}): ours {ours:?}, gguf-py {want:?}, ours {} ggml's",
                cases[i],
                if ours == ggml { "equal" } else { "differ from" }
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} blocks differ from gguf-py:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn q8_0_quantizes_as_gguf_py() {
    quantizes_as_gguf_py(BlockType::Q8_0);
}

#[test]
fn q4_0_quantizes_as_gguf_py() {
    quantizes_as_gguf_py(BlockType::Q4_0);
}

/// The K-quant fixtures' inputs: the hard blocks of k_quantize.f32, then the random blocks
/// of k_quantize.bf16 widened to f32, with each block's case name.
fn k_quantize_inputs() -> (Vec<String>, Vec<f32>) {
    let mut values = f32s(&fixture("k_quantize.f32"));
    let bf16 = fixture("k_quantize.bf16");
    values.extend(
        (bf16.chunks_exact(2))
            .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
    );
    let cases = String::from_utf8(fixture("k_quantize.cases")).expect("k_quantize.cases is text");
    let cases: Vec<String> = cases.lines().map(str::to_owned).collect();
    assert_eq!(
        cases.len() * 256,
        values.len(),
        "one case name per block of 256"
    );
    (cases, values)
}

/// `ty.quantize` on every K-quant fixture block against llama.cpp's `ggml_quantize_chunk`
/// (`quantize_row_q4_K_ref` / `quantize_row_q6_K_ref`): every differing block listed with
/// its case and first differing byte.
fn quantizes_as_ggml(ty: BlockType) {
    let (cases, values) = k_quantize_inputs();
    let ggml = fixture(&format!("{ty}.ggml.quantized"));
    assert_eq!(ggml.len(), cases.len() * ty.bytes(), "{ty}: fixture size");
    let mut failures = Vec::new();
    for (i, block) in values.chunks_exact(256).enumerate() {
        let mut ours = Vec::new();
        ty.quantize(block, &mut ours);
        let want = &ggml[i * ty.bytes()..][..ty.bytes()];
        assert_eq!(ours.len(), want.len(), "{ty} block {i}: bytes written");
        if let Some(at) = (ours.iter().zip(want)).position(|(a, b)| a != b) {
            failures.push(format!(
                "{ty} block {i} ({}): byte {at}: ours {}, ggml {}",
                cases[i], ours[at], want[at]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} blocks differ from ggml:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn q4_k_quantizes_as_ggml() {
    quantizes_as_ggml(BlockType::Q4K);
}

#[test]
fn q6_k_quantizes_as_ggml() {
    quantizes_as_ggml(BlockType::Q6K);
}

/// Decoding what `quantize` made gives back the inputs to within a quantization step: for
/// each block, one step at its widest (`range / 15` for Q4_K, `amax / 32` for Q6_K; half a
/// step from rounding, the rest from scales stored in 6 or 8 bits and fits that clip the
/// extremes), plus, for blocks so small that d is an f16 subnormal or rounds to zero, what
/// a block at f16's smallest step could hold. The mean error must stay under 0.3 steps
/// (rounding alone averages a quarter step), so codes that are right only at the extremes
/// fail too. (On the fixtures: at most 0.67 steps, mean at most 0.22.)
#[test]
fn k_quants_decode_near_their_inputs() {
    let (cases, values) = k_quantize_inputs();
    for (ty, levels) in [(BlockType::Q4K, 15.0), (BlockType::Q6K, 32.0)] {
        let mut blocks = Vec::new();
        ty.quantize(&values, &mut blocks);
        let mut decoded = vec![f32::NAN; values.len()];
        ty.decode(&blocks, &mut decoded);
        for (i, (x, y)) in values.chunks(256).zip(decoded.chunks(256)).enumerate() {
            let (lo, hi) = x
                .iter()
                .fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            let span = if ty == BlockType::Q4K {
                hi - lo
            } else {
                hi.max(-lo)
            };
            let step = span / levels;
            let subnormal_slack = 63.0 * 32.0 * f32::powi(2.0, -24);
            let errors: Vec<f32> = x.iter().zip(y).map(|(x, y)| (x - y).abs()).collect();
            let (max, mean) = (
                errors.iter().fold(0f32, |m, &e| m.max(e)),
                errors.iter().sum::<f32>() / 256.0,
            );
            assert!(
                max <= step + subnormal_slack && mean <= 0.3 * step + subnormal_slack,
                "{ty} block {i} ({}): max error {max:e}, mean {mean:e}, step {step:e}",
                cases[i]
            );
        }
    }
}

#[test]
fn every_type_decodes_as_gguf_py() {
    let mut failures = Vec::new();
    for ty in BlockType::KEPT {
        let blocks = fixture(&format!("{ty}.blocks"));
        let want = f32s(&fixture(&format!("{ty}.f32")));
        assert_eq!(blocks.len() % ty.bytes(), 0, "{ty}: whole blocks");
        assert_eq!(blocks.len() / ty.bytes() * ty.values(), want.len(), "{ty}");
        assert!(want.iter().any(|&v| v != 0.0), "{ty}: fixture all zeros");
        let mut ours = vec![f32::NAN; want.len()];
        ty.decode(&blocks, &mut ours);
        if let Some((i, ours, gguf_py)) = first_difference(&ours, &want) {
            failures.push(format!(
                "{ty}: value {i} (block {}, index {}): ours {ours:e} ({:#010x}), gguf-py {gguf_py:e} ({:#010x})",
                i / ty.values(),
                i % ty.values(),
                ours.to_bits(),
                gguf_py.to_bits()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A NaN or infinite scale (d, or Q4_K's dmin) in any block is found, the first such block
/// named; the fixture's finite blocks pass.
#[test]
fn first_bad_scale_finds_each_types_nan_and_inf() {
    for ty in BlockType::KEPT {
        let good = fixture(&format!("{ty}.blocks"));
        let blocks = good.len() / ty.bytes();
        assert_eq!(ty.first_bad_scale(&good), None, "{ty}: finite scales");
        for &at in scale_offsets(ty) {
            for bad in [f16::NAN, f16::INFINITY, f16::NEG_INFINITY] {
                for first in [0, 5, blocks - 1] {
                    let mut corrupted = good.clone();
                    for b in [first, blocks - 1] {
                        corrupted[b * ty.bytes() + at..][..2].copy_from_slice(&bad.to_le_bytes());
                    }
                    assert_eq!(
                        ty.first_bad_scale(&corrupted),
                        Some(first),
                        "{ty}: {bad} at byte {at} of blocks {first} and {}",
                        blocks - 1
                    );
                }
            }
        }
    }
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
}

/// Values in [-0.5, 0.5), from a xorshift generator seeded with `state`.
fn random(mut state: u64) -> impl FnMut() -> f32 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// `d_out` rows of `d_in` as random blocks of `ty` (random bits, scales small finite f16s)
/// and the f32 values they decode to.
fn random_weight(
    ty: BlockType,
    d_out: usize,
    d_in: usize,
    next: &mut impl FnMut() -> f32,
) -> (Vec<u8>, Vec<f32>) {
    let n_blocks = d_out * d_in / ty.values();
    let mut blocks: Vec<u8> = (0..n_blocks * ty.bytes())
        .map(|_| ((next() + 0.5) * 256.0) as u8)
        .collect();
    for block in blocks.chunks_exact_mut(ty.bytes()) {
        for &at in scale_offsets(ty) {
            let scale = f16::from_f32(next() * 0.02);
            block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
    }
    let mut values = vec![0.0; d_out * d_in];
    ty.decode(&blocks, &mut values);
    (blocks, values)
}

/// Inputs per row for each type: whole blocks, 256 for the K types.
fn widths(ty: BlockType) -> &'static [usize] {
    match ty {
        BlockType::Q4K | BlockType::Q6K => &[512],
        _ => &[96, 576],
    }
}

/// Row counts that the matrix-vector kernel splits across 2 and 3 threads or not, each
/// leaving rows outside its bundles of four.
const D_OUTS: [usize; 3] = [130, 259, 1000];

/// `matvecs` over blocks equals, bit for bit, `matvecs` over their decoded values, with
/// three weights in one call, at 1, 2 and 3 threads, in a team and not, for one vector and
/// batches; and each vector of a batch gets what it gets alone.
fn matvecs_equal_over_decoded_values(ty: BlockType, seed: u64) {
    let mut next = random(seed);
    for &d_in in widths(ty) {
        let weights: Vec<(Vec<u8>, Vec<f32>)> = (D_OUTS.iter())
            .map(|&d_out| random_weight(ty, d_out, d_in, &mut next))
            .collect();
        let blocks: Vec<Rows> = (weights.iter()).map(|(b, _)| Rows::Blocks(ty, b)).collect();
        let decoded: Vec<Rows> = weights.iter().map(|(_, v)| Rows::F32(v)).collect();
        for n in [1, 2, 5, 8, 9, 16] {
            let xs: Vec<f32> = (0..n * d_in).map(|_| next()).collect();
            for threads in [1, 2, 3] {
                let pool = pool(threads);
                for in_team in [false, true] {
                    let run = |weights: &[Rows], xs: &[f32]| {
                        pool.install(|| {
                            if in_team {
                                team::with_team(|| matvecs(weights, xs, d_in, Matmul::Exact))
                            } else {
                                matvecs(weights, xs, d_in, Matmul::Exact)
                            }
                        })
                    };
                    let (over_blocks, over_values) = (run(&blocks, &xs), run(&decoded, &xs));
                    let alone: Vec<Vec<Vec<f32>>> =
                        xs.chunks(d_in).map(|x| run(&blocks, x)).collect();
                    let alone_values: Vec<Vec<Vec<f32>>> =
                        xs.chunks(d_in).map(|x| run(&decoded, x)).collect();
                    for (w, &d_out) in D_OUTS.iter().enumerate() {
                        let at = format!(
                            "{ty}, {d_in} x {d_out}, {n} vectors, {threads} threads, team {in_team}"
                        );
                        assert!(over_values[w].iter().any(|&v| v != 0.0), "{at}: all zero");
                        if let Some((i, b, v)) = first_difference(&over_blocks[w], &over_values[w])
                        {
                            panic!(
                                "{at}: output {i} (vector {}, row {}): blocks {b:e}, decoded {v:e}",
                                i / d_out,
                                i % d_out
                            );
                        }
                        for (k, batched) in over_blocks[w].chunks(d_out).enumerate() {
                            let (alone, alone_values) = (&alone[k][w], &alone_values[k][w]);
                            if let Some((i, b, a)) = first_difference(batched, alone) {
                                panic!("{at}: vector {k} row {i}: in the batch {b:e}, alone {a:e}");
                            }
                            if let Some((i, b, v)) = first_difference(alone, alone_values) {
                                panic!(
                                    "{at}: vector {k} alone, row {i}: blocks {b:e}, decoded {v:e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// With `Matmul::Int8` (its kernels need the AVX2 tier: the AVX2 build up to the avx512
/// tier, VNNI's from avx512vnni, each run by `just test-tiers`), each vector of a batch
/// gets, bit for bit, what it gets alone, at 1, 2 and 3 threads, in a team and not; and the
/// products stay near the exact ones (the inputs rounded to 8 bits: about 1% of a
/// product's size). Where no kernel runs (a width they do not take, a tier below AVX2),
/// `Matmul::Int8` gives the exact products, bit for bit.
fn int8_batches_equal_each_alone(ty: BlockType, seed: u64) {
    let mut next = random(seed);
    let tier_runs = testing::runs(Needs::Tier(Tier::Avx2));
    for &d_in in widths(ty) {
        let weights: Vec<(Vec<u8>, Vec<f32>)> = (D_OUTS.iter())
            .map(|&d_out| random_weight(ty, d_out, d_in, &mut next))
            .collect();
        let blocks: Vec<Rows> = (weights.iter()).map(|(b, _)| Rows::Blocks(ty, b)).collect();
        let xs: Vec<f32> = (0..16 * d_in).map(|_| next()).collect();
        if !(tier_runs && kernels::int8::runs(ty, d_in)) {
            for threads in [1, 2] {
                let (int8, exact) = pool(threads).install(|| {
                    (
                        matvecs(&blocks, &xs, d_in, Matmul::Int8),
                        matvecs(&blocks, &xs, d_in, Matmul::Exact),
                    )
                });
                for (w, (int8, exact)) in int8.iter().zip(&exact).enumerate() {
                    if let Some((i, a, b)) = first_difference(int8, exact) {
                        panic!(
                            "{ty}, {d_in} x {}, {threads} threads, no int8 kernel: output {i}: \
                             int8 {a:e}, exact {b:e}",
                            D_OUTS[w]
                        );
                    }
                }
            }
            continue;
        }
        for threads in [1, 2, 3] {
            let pool = pool(threads);
            for in_team in [false, true] {
                let run = |xs: &[f32], matmul| {
                    pool.install(|| {
                        if in_team {
                            team::with_team(|| matvecs(&blocks, xs, d_in, matmul))
                        } else {
                            matvecs(&blocks, xs, d_in, matmul)
                        }
                    })
                };
                let exact = run(&xs, Matmul::Exact);
                for n in [1, 2, 5, 8, 9, 16] {
                    let batch = run(&xs[..n * d_in], Matmul::Int8);
                    for (k, x) in xs[..n * d_in].chunks(d_in).enumerate() {
                        let alone = run(x, Matmul::Int8);
                        for (w, &d_out) in D_OUTS.iter().enumerate() {
                            let at = format!(
                                "{ty}, {d_in} x {d_out}, vector {k} of {n}, {threads} threads, team {in_team}"
                            );
                            let batched = &batch[w][k * d_out..][..d_out];
                            if let Some((i, b, a)) = first_difference(batched, &alone[w]) {
                                panic!("{at}: row {i}: in the batch {b:e}, alone {a:e}");
                            }
                            let exact = &exact[w][k * d_out..][..d_out];
                            let size: f32 =
                                exact.iter().map(|v| v.abs()).sum::<f32>() / d_out as f32;
                            for (i, (&int8, &exact)) in batched.iter().zip(exact).enumerate() {
                                assert!(
                                    (int8 - exact).abs() < 0.05 * size,
                                    "{at}: row {i}: int8 {int8}, exact {exact}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn int8_batches_over_q8_0_equal_each_alone() {
    int8_batches_equal_each_alone(BlockType::Q8_0, 41);
}

#[test]
fn int8_batches_over_q4_0_equal_each_alone() {
    int8_batches_equal_each_alone(BlockType::Q4_0, 42);
}

#[test]
fn int8_batches_over_q4_k_equal_each_alone() {
    int8_batches_equal_each_alone(BlockType::Q4K, 43);
}

#[test]
fn int8_batches_over_q6_k_equal_each_alone() {
    int8_batches_equal_each_alone(BlockType::Q6K, 44);
}

#[test]
fn matvecs_over_q8_0_equal_over_decoded_values() {
    matvecs_equal_over_decoded_values(BlockType::Q8_0, 0x9e37_79b9_7f4a_7c15);
}

#[test]
fn matvecs_over_q4_0_equal_over_decoded_values() {
    matvecs_equal_over_decoded_values(BlockType::Q4_0, 0x2545_f491_4f6c_dd1d);
}

#[test]
fn matvecs_over_q5_0_equal_over_decoded_values() {
    matvecs_equal_over_decoded_values(BlockType::Q5_0, 0xd1b5_4a32_d192_ed03);
}

#[test]
fn matvecs_over_q4_k_equal_over_decoded_values() {
    matvecs_equal_over_decoded_values(BlockType::Q4K, 0x8cb9_2ba7_2f3d_8dd7);
}

#[test]
fn matvecs_over_q6_k_equal_over_decoded_values() {
    matvecs_equal_over_decoded_values(BlockType::Q6K, 0xaef1_7502_108e_f2d9);
}

/// `linear_rows` (panels on AVX-512, gemm elsewhere) over blocks equals, bit for bit,
/// `linear_rows` over their decoded values, for 1, 7, 13 and 40 rows at 1, 2 and 3 threads.
fn linear_rows_equal_over_decoded_values(ty: BlockType, seed: u64) {
    let mut next = random(seed);
    for &d_in in widths(ty) {
        for d_out in D_OUTS {
            let (blocks, values) = random_weight(ty, d_out, d_in, &mut next);
            for rows in [1, 7, 13, 40] {
                let x: Vec<f32> = (0..rows * d_in).map(|_| next()).collect();
                for threads in [1, 2, 3] {
                    let pool = pool(threads);
                    let (over_blocks, over_values) = pool.install(|| {
                        (
                            linear_rows(&x, Rows::Blocks(ty, &blocks), d_in),
                            linear_rows(&x, Rows::F32(&values), d_in),
                        )
                    });
                    let at = format!("{ty}, {d_in} x {d_out}, {rows} rows, {threads} threads");
                    assert_eq!(over_values.len(), rows * d_out, "{at}");
                    assert!(over_values.iter().any(|&v| v != 0.0), "{at}: all zero");
                    if let Some((i, b, v)) = first_difference(&over_blocks, &over_values) {
                        panic!(
                            "{at}: output {i} (row {}, column {}): blocks {b:e}, decoded {v:e}",
                            i / d_out,
                            i % d_out
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn linear_rows_over_q8_0_equal_over_decoded_values() {
    linear_rows_equal_over_decoded_values(BlockType::Q8_0, 0x1234_5678_9abc_def1);
}

#[test]
fn linear_rows_over_q4_0_equal_over_decoded_values() {
    linear_rows_equal_over_decoded_values(BlockType::Q4_0, 0x0fed_cba9_8765_4321);
}

#[test]
fn linear_rows_over_q5_0_equal_over_decoded_values() {
    linear_rows_equal_over_decoded_values(BlockType::Q5_0, 0x5555_aaaa_3333_cccc);
}

#[test]
fn linear_rows_over_q4_k_equal_over_decoded_values() {
    linear_rows_equal_over_decoded_values(BlockType::Q4K, 0x7777_1111_9999_2222);
}

#[test]
fn linear_rows_over_q6_k_equal_over_decoded_values() {
    linear_rows_equal_over_decoded_values(BlockType::Q6K, 0x4242_4242_1717_1717);
}
