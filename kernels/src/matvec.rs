//! Single-row matrix products: the whole of decoding's arithmetic, split across threads.
//!
//! Decoding one token is a matrix-vector product per weight, bound by how fast the weights
//! stream from memory. burn-flex runs each on one thread through gemm; here every thread
//! streams its own contiguous share of each product's rows, worked in bundles of four rows,
//! one from each quarter of the share, so a thread keeps four sequential streams in flight
//! (`bundles::matvec_bundles`). Products that share an input (q, k, v; gate, up) go in one
//! parallel region, one hand-off instead of three, to threads kept spinning (`team`).
//!
//! Equal shares do not finish together on these machines: for a while one core is often a
//! few percent slower than the other (it takes the interrupts, or the hypervisor takes it),
//! and the other then waits at the end of each of a token's ~150 products. So a thread done
//! with its own shares takes bundles from the far end of the others', a few at a time: the
//! owner keeps streaming forward, the other works backward from the end, and they meet
//! wherever their speeds put them. It pays most when memory is fast, where such waits weigh
//! most (docs/BENCHMARKS.md).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::int8::{self, Inputs, Matmul};
use crate::quant::BlockType;
use crate::{bundles, dpbf16, team};

/// Below this many output rows per thread, splitting a product costs more than it saves.
const MIN_ROWS_PER_THREAD: usize = 64;

/// Bundles an owner claims at a time: 64 rows, one compare-and-swap per ~150 KB of weights.
const OWNER_BUNDLES: usize = 16;

/// Bundles a thread claims at a time from the end of another's share: few, so that neither is
/// left computing a long last claim while the other waits.
const HELPER_BUNDLES: usize = 4;

/// A weight's rows, contiguous (a `[d_in, d_out]` weight stored column-major): how a matrix
/// is stored, which every kernel over weights dispatches on. In f32, in bf16 (see
/// [`Stored`](crate::stored::Stored): the products are the same to the bit), or in ggml's
/// blocks, each row a whole number of them (the products are those of the values they
/// decode to, to the bit).
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    F32(&'a [f32]),
    Bf16(&'a [half::bf16]),
    Blocks(BlockType, &'a [u8]),
}

impl<'a> Rows<'a> {
    /// Elements, rows × d_in.
    pub fn len(&self) -> usize {
        match self {
            Rows::F32(rows) => rows.len(),
            Rows::Bf16(rows) => rows.len(),
            Rows::Blocks(ty, rows) => rows.len() / ty.bytes() * ty.values(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Consecutive pieces of `n` elements (the last may be shorter).
    fn chunks(self, n: usize) -> Vec<Rows<'a>> {
        match self {
            Rows::F32(rows) => rows.chunks(n).map(Rows::F32).collect(),
            Rows::Bf16(rows) => rows.chunks(n).map(Rows::Bf16).collect(),
            Rows::Blocks(ty, rows) => (rows.chunks(n / ty.values() * ty.bytes()))
                .map(|rows| Rows::Blocks(ty, rows))
                .collect(),
        }
    }

    /// Whether its products take `inputs` (rounded to integers) rather than the f32 ones.
    fn takes_int8(&self, d_in: usize) -> bool {
        matches!(*self, Rows::Blocks(ty, _) if int8::runs(ty, d_in))
    }

    fn bundles(
        self,
        xs: &[f32],
        rounded: Rounded<'_>,
        d_in: usize,
        out: &[AtomicU32],
        stride: usize,
        bundles: Range<usize>,
    ) {
        if let (Rows::Blocks(ty, rows), Some(inputs)) = (self, rounded.int8)
            && self.takes_int8(d_in)
        {
            return int8::bundles(ty, rows, inputs, out, stride, bundles);
        }
        if let (Rows::Bf16(rows), Some(xs)) = (self, rounded.bf16) {
            return dpbf16::bundles(rows, xs, d_in, out, stride, bundles);
        }
        match self {
            Rows::F32(rows) => bundles::matvec_bundles(rows, xs, d_in, out, stride, bundles),
            Rows::Bf16(rows) => bundles::matvec_bundles_bf16(rows, xs, d_in, out, stride, bundles),
            Rows::Blocks(ty, rows) => {
                bundles::matvec_bundles_blocks(ty, rows, xs, d_in, out, stride, bundles)
            }
        }
    }
}

/// `out[i][b d_out_i + j] = weights[i] row j · x_b` for each weight and each of the `n`
/// vectors `x_b` of `d_in` that `xs` holds one after another, all split across the pool's
/// threads in one parallel region (one hand-off for q, k and v together). Each weight is
/// read once for all the vectors (a batch of decoded tokens), and a vector's products are
/// the same, bit for bit, whatever else is in `xs`. Unless [`Matmul::Exact`], products over
/// blocks that have an int8 kernel take `xs` rounded to integers, once for all of them;
/// with [`Matmul::Bf16`], products over bf16 weights take them rounded to bf16.
pub fn matvecs(weights: &[Rows<'_>], xs: &[f32], d_in: usize, matmul: Matmul) -> Vec<Vec<f32>> {
    let threads = rayon::current_num_threads();
    let n = xs.len() / d_in;
    let int8_types = (weights.iter()).filter_map(|rows| match rows {
        Rows::Blocks(ty, _) if rows.takes_int8(d_in) => Some(*ty),
        _ => None,
    });
    let inputs = matmul
        .rounds_inputs()
        .then(|| Inputs::new(xs, d_in, int8_types));
    let has_bf16 = weights.iter().any(|rows| matches!(rows, Rows::Bf16(_)));
    let bf16 = (matmul.rounds_to_bf16() && has_bf16 && dpbf16::runs()).then(|| dpbf16::round(xs));
    let inputs = Rounded {
        int8: inputs.as_ref(),
        bf16: bf16.as_deref(),
    };
    // Whichever thread computes a row stores it, so the outputs are atomics; a relaxed
    // store is a plain store on x86, and the region's end orders them before the reads.
    let d_outs: Vec<usize> = weights.iter().map(|rows| rows.len() / d_in).collect();
    let outs: Vec<Vec<AtomicU32>> = d_outs
        .iter()
        .map(|&d_out| (0..n * d_out).map(|_| AtomicU32::new(0)).collect())
        .collect();
    let mut shares: Vec<Vec<Share>> = (0..threads).map(|_| Vec::new()).collect();
    for ((&rows, out), &d_out) in weights.iter().zip(&outs).zip(&d_outs) {
        if threads < 2 || d_out < threads * MIN_ROWS_PER_THREAD {
            shares[0].push(Share::new(rows, d_out, out, d_out));
            continue;
        }
        // A multiple of four rows per thread: each share splits into four whole quarters.
        let per_thread = d_out.div_ceil(threads).next_multiple_of(4);
        let parts = rows.chunks(per_thread * d_in).into_iter().enumerate();
        for (share, (i, rows)) in shares.iter_mut().zip(parts) {
            // The share's outputs start at its first row; each vector's are `d_out` apart.
            let n_rows = rows.len() / d_in;
            share.push(Share::new(rows, n_rows, &out[i * per_thread..], d_out));
        }
    }
    team::for_each_chunk(threads, &|own| {
        for share in &shares[own] {
            while let Some(bundles) = share.claim_front(OWNER_BUNDLES) {
                share.run(xs, inputs, d_in, bundles);
            }
        }
        for other in (1..threads).map(|k| (own + k) % threads) {
            // The other's last share first: the farthest from where its owner is working.
            for share in shares[other].iter().rev() {
                while let Some(bundles) = share.claim_back(HELPER_BUNDLES) {
                    share.run(xs, inputs, d_in, bundles);
                }
            }
        }
    });
    outs.into_iter()
        .map(|out| {
            out.into_iter()
                .map(|bits| f32::from_bits(bits.into_inner()))
                .collect()
        })
        .collect()
}

/// The vectors rounded as some of the weights' products take them: to 8-bit integers per
/// block (for blocks), to bf16 (for bf16 weights, with [`Matmul::Bf16`]).
#[derive(Clone, Copy)]
struct Rounded<'a> {
    int8: Option<&'a Inputs>,
    bf16: Option<&'a [half::bf16]>,
}

/// One thread's rows of one product, in the bundles `bundles::matvec_bundles` counts, claimed from
/// the front by the owner and from the back by a thread with nothing left of its own.
struct Share<'a> {
    rows: Rows<'a>,
    /// From the output of the share's first row for the first vector; each vector's outputs
    /// `stride` apart.
    out: &'a [AtomicU32],
    stride: usize,
    /// The bundles nobody has claimed, `front..back`, packed as `front << 32 | back` so that one
    /// compare-and-swap moves either end and the two can never cross.
    unclaimed: AtomicU64,
}

impl<'a> Share<'a> {
    /// `n_rows` rows, whose outputs start at `out`.
    fn new(rows: Rows<'a>, n_rows: usize, out: &'a [AtomicU32], stride: usize) -> Self {
        let bundles = bundles::matvec_bundle_count(n_rows);
        Self {
            rows,
            out,
            stride,
            unclaimed: AtomicU64::new(pack(0..bundles)),
        }
    }

    /// Computes `bundles` of the share's rows for every vector of `xs` (or of `inputs`, its
    /// vectors rounded, where the rows take those).
    fn run(&self, xs: &[f32], inputs: Rounded<'_>, d_in: usize, bundles: Range<usize>) {
        (self.rows).bundles(xs, inputs, d_in, self.out, self.stride, bundles);
    }

    /// Up to `n` bundles from the front, if any are left.
    fn claim_front(&self, n: usize) -> Option<Range<usize>> {
        self.claim(|left| {
            let end = (left.start + n).min(left.end);
            (left.start..end, end..left.end)
        })
    }

    /// Up to `n` bundles from the back, if any are left.
    fn claim_back(&self, n: usize) -> Option<Range<usize>> {
        self.claim(|left| {
            let start = left.end.saturating_sub(n).max(left.start);
            (start..left.end, left.start..start)
        })
    }

    /// Splits the unclaimed bundles into (claimed, still unclaimed) with `split`, atomically.
    fn claim(
        &self,
        split: impl Fn(Range<usize>) -> (Range<usize>, Range<usize>),
    ) -> Option<Range<usize>> {
        let mut current = self.unclaimed.load(Ordering::Relaxed);
        loop {
            let left = unpack(current);
            if left.is_empty() {
                return None;
            }
            let (claimed, rest) = split(left);
            match self.unclaimed.compare_exchange_weak(
                current,
                pack(rest),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(claimed),
                Err(now) => current = now,
            }
        }
    }
}

fn pack(bundles: Range<usize>) -> u64 {
    ((bundles.start as u64) << 32) | bundles.end as u64
}

fn unpack(packed: u64) -> Range<usize> {
    (packed >> 32) as usize..(packed & 0xffff_ffff) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::uniform;

    /// Every row computed once and right, with the work split, stolen or not, including a
    /// product too small to split and row counts that leave rows outside the quarters.
    #[test]
    fn matvecs_match_the_definition() {
        let d_in = 48;
        let x: Vec<f32> = (0..d_in).map(|i| (i % 7) as f32 - 3.0).collect();
        let weights: Vec<Vec<f32>> = [1000, 130, 7, 259]
            .iter()
            .map(|&d_out| (0..d_out * d_in).map(|i| (i % 11) as f32 - 5.0).collect())
            .collect();
        let slices: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
        let rows: Vec<Rows> = slices.iter().map(|&w| Rows::F32(w)).collect();
        for threads in [1, 2, 3, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            for in_team in [false, true] {
                let outs = pool.install(|| {
                    if in_team {
                        team::with_team(|| matvecs(&rows, &x, d_in, Matmul::Exact))
                    } else {
                        matvecs(&rows, &x, d_in, Matmul::Exact)
                    }
                });
                for (weight, out) in slices.iter().zip(&outs) {
                    assert_eq!(out.len(), weight.len() / d_in);
                    for (row, got) in weight.chunks(d_in).zip(out) {
                        let want: f32 = row.iter().zip(&x).map(|(w, x)| w * x).sum();
                        assert_eq!(*got, want, "small integers: exact in any order");
                    }
                }
            }
        }
    }

    #[test]
    fn claims_from_both_ends_meet_without_overlap() {
        let out: Vec<AtomicU32> = (0..4 * 10 + 3).map(|_| AtomicU32::new(0)).collect();
        let share = Share::new(Rows::F32(&[]), out.len(), &out, out.len());
        let mut taken = vec![0; bundles::matvec_bundle_count(out.len())];
        let mut front = true;
        while let Some(bundles) = if front {
            share.claim_front(3)
        } else {
            share.claim_back(2)
        } {
            bundles.for_each(|s| taken[s] += 1);
            front = !front;
        }
        assert!(taken.iter().all(|&t| t == 1), "{taken:?}");
    }

    /// Each vector of a batch gets, bit for bit, what it gets alone: random values (sums that
    /// round differently in any other order), every batch up to sixteen (one pass of up to
    /// seven vectors, or passes of four, or several of either), shapes the threads split
    /// differently.
    #[test]
    fn batched_vectors_equal_each_alone() {
        let mut next = uniform(0x9e37_79b9_7f4a_7c15);
        for (d_in, d_out) in [(48, 1000), (576, 130), (37, 7), (64, 259)] {
            let bf16: Vec<half::bf16> = (0..d_in * d_out)
                .map(|_| half::bf16::from_f32(next()))
                .collect();
            let f32s: Vec<f32> = (0..d_in * d_out).map(|_| next()).collect();
            for n in 2..=16 {
                let xs: Vec<f32> = (0..n * d_in).map(|_| next()).collect();
                for threads in [1, 2, 3, 5] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .expect("a thread pool");
                    for weight in [Rows::Bf16(&bf16), Rows::F32(&f32s)] {
                        let (batched, alone) = pool.install(|| {
                            team::with_team(|| {
                                let alone: Vec<Vec<f32>> = xs
                                    .chunks(d_in)
                                    .flat_map(|x| {
                                        matvecs(&[weight, weight], x, d_in, Matmul::Exact)
                                    })
                                    .collect();
                                (matvecs(&[weight, weight], &xs, d_in, Matmul::Exact), alone)
                            })
                        });
                        for (i, out) in batched.iter().enumerate() {
                            for (b, row) in out.chunks(d_out).enumerate() {
                                let bits =
                                    |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                                assert_eq!(
                                    bits(row),
                                    bits(&alone[2 * b + i]),
                                    "{d_in} x {d_out}, vector {b} of {n}, {threads} threads"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// bf16 weights give, bit for bit, what their f32 values give: random values (sums that
    /// round differently in any other order), every shape the kernel splits differently.
    #[test]
    fn bf16_rows_equal_their_f32_values() {
        let mut next = uniform(0x2545_f491_4f6c_dd1d);
        for (d_in, d_out) in [(48, 1000), (576, 130), (37, 7), (64, 259)] {
            let x: Vec<f32> = (0..d_in).map(|_| next()).collect();
            let bf16: Vec<half::bf16> = (0..d_in * d_out)
                .map(|_| half::bf16::from_f32(next()))
                .collect();
            let f32s: Vec<f32> = bf16.iter().map(|w| w.to_f32()).collect();
            for threads in [1, 2, 3, 5] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a thread pool");
                let (a, b) = pool.install(|| {
                    team::with_team(|| {
                        (
                            matvecs(&[Rows::Bf16(&bf16)], &x, d_in, Matmul::Exact),
                            matvecs(&[Rows::F32(&f32s)], &x, d_in, Matmul::Exact),
                        )
                    })
                });
                let bits = |v: &Vec<Vec<f32>>| v[0].iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{d_in} x {d_out}, {threads} threads");
            }
        }
    }
}
