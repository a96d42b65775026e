//! With `Prefill::Invariant`, a position's logits are the same bits however it is reached:
//! one token at a time (a decoding step, `Generator::decode_rows` with one row), a prompt in
//! one pass or split at random points, a cache reused (truncated, then continued) or forked,
//! and a verify pass of up to 16 rows after a prompt. On every family fixture (burn-flex at
//! 1 and 3 threads; burn-ndarray, the composed ops, for two), and on the real
//! SmolLM2-135M-Instruct artifact with every weight format the loader keeps and every
//! `--matmul`. The default (`Prefill::Fast`) is checked to differ somewhere, so that the
//! comparison is one that can fail.
//!
//! The real model is skipped when its artifact is missing; `REQUIRE_MODEL=1` (set by
//! `just test`) makes that a failure instead.

mod common;

use kernels::int8::Matmul;
use kernels::quant::BlockType;
use runtime::generate::{Generator, Prefill};
use runtime::model::backend::KernelBackend;
use runtime::weights::layout::Weights;
use runtime::{FlexBackend, NdArrayBackend, in_thread_pool};

/// A small deterministic generator of split points (xorshift).
struct Splits(u64);

impl Splits {
    /// Up to `n` cut points inside `0..len`, sorted, distinct.
    fn cuts(&mut self, len: usize, n: usize) -> Vec<usize> {
        let mut cuts: Vec<usize> = (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                1 + (self.0 % (len as u64 - 1)) as usize
            })
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }
}

/// Every position's logits, decoded one token at a time as a generation step decodes.
fn stepped<B: KernelBackend>(generator: &Generator<B>, ids: &[u32]) -> Vec<f32> {
    let mut cache = generator.new_cache(ids.len() + 16).unwrap();
    (ids.iter())
        .flat_map(|&id| {
            generator
                .decode_rows(&[id], &mut [&mut cache], &[1])
                .unwrap()
        })
        .collect()
}

/// Every position's logits from a prompt run in the pieces `cuts` makes, after `cache`.
fn prompted<B: KernelBackend>(
    generator: &Generator<B>,
    cache: &mut runtime::model::cache::KvCache<B>,
    ids: &[u32],
    cuts: &[usize],
) -> Vec<f32> {
    let bounds: Vec<usize> = (std::iter::once(0).chain(cuts.iter().copied()))
        .chain(std::iter::once(ids.len()))
        .collect();
    (bounds.windows(2))
        .flat_map(|w| (generator.forward_logits(&ids[w[0]..w[1]], cache, true)).unwrap())
        .collect()
}

/// The first position (counting from `from`) whose logits differ in any bit, if one does.
fn first_difference(a: &[f32], b: &[f32], vocab: usize, from: usize) -> Option<usize> {
    assert_eq!(a.len(), b.len(), "as many logits");
    (a.chunks_exact(vocab).zip(b.chunks_exact(vocab)))
        .position(|(a, b)| a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits()))
        .map(|p| p + from)
}

fn assert_same(a: &[f32], b: &[f32], vocab: usize, from: usize, what: &str) {
    if let Some(p) = first_difference(a, b, vocab, from) {
        panic!("{what}: position {p}'s logits differ from a one-token step's");
    }
}

/// Checks every way of reaching `ids`' positions against one-token steps, with
/// `Prefill::Invariant`; returns whether `Prefill::Fast`'s whole prompt differed.
fn check<B: KernelBackend>(
    generator: &mut Generator<B>,
    ids: &[u32],
    seed: u64,
    what: &str,
) -> bool {
    let (n, vocab) = (ids.len(), generator.config.vocab_size);
    generator.prefill = Prefill::Fast;
    let steps = stepped(generator, ids);
    let fast = prompted(
        generator,
        &mut generator.new_cache(n + 16).unwrap(),
        ids,
        &[],
    );
    let fast_differs = first_difference(&fast, &steps, vocab, 0).is_some();

    generator.prefill = Prefill::Invariant;
    let g = &*generator;
    let whole = prompted(g, &mut g.new_cache(n + 16).unwrap(), ids, &[]);
    assert_same(
        &whole,
        &steps,
        vocab,
        0,
        &format!("{what}: one prompt pass"),
    );
    let mut splits = Splits(seed | 1);
    for pieces in [1, 3, 7] {
        let cuts = splits.cuts(n, pieces);
        let split = prompted(g, &mut g.new_cache(n + 16).unwrap(), ids, &cuts);
        assert_same(
            &split,
            &steps,
            vocab,
            0,
            &format!("{what}: prompt split at {cuts:?}"),
        );
    }

    // A reused cache: positions stepped (an earlier answer), cut back, continued.
    let [at] = splits.cuts(n, 1)[..] else {
        unreachable!()
    };
    let mut cache = g.new_cache(n + 16).unwrap();
    for &id in ids {
        g.decode_rows(&[id], &mut [&mut cache], &[1]).unwrap();
    }
    cache.truncate(at);
    let rest = prompted(g, &mut cache, &ids[at..], &[]);
    let what_at = format!("{what}: after a stepped cache cut back to {at}");
    assert_same(&rest, &steps[at * vocab..], vocab, at, &what_at);

    // A prompted cache forked at `at`: the fork and the original go on alike.
    let mut cache = g.new_cache(n + 16).unwrap();
    prompted(g, &mut cache, &ids[..at], &[]);
    let mut fork = cache.fork(at, n + 16);
    for (cache, who) in [(&mut fork, "fork"), (&mut cache, "original")] {
        let rest = prompted(g, cache, &ids[at..], &[]);
        let what_at = format!("{what}: the {who} of a cache prompted to {at}");
        assert_same(&rest, &steps[at * vocab..], vocab, at, &what_at);
    }

    // A verify pass of up to 16 rows after a prompt.
    let rows = (n - at).min(16);
    let mut cache = g.new_cache(n + 16).unwrap();
    prompted(g, &mut cache, &ids[..at], &[]);
    let checked = g
        .decode_rows(&ids[at..at + rows], &mut [&mut cache], &[rows])
        .unwrap();
    let what_at = format!("{what}: a verify pass of {rows} rows at {at}");
    assert_same(
        &checked,
        &steps[at * vocab..(at + rows) * vocab],
        vocab,
        at,
        &what_at,
    );
    fast_differs
}

/// Ids spread over the vocabulary.
fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}

fn data_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn every_family_reaches_a_position_in_the_same_bits_every_way() {
    let mut fast_differs = false;
    for (i, variant) in common::FAMILIES.into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let run = common::converter(&[&"convert", &data_dir(variant), &tmp.path()]);
        assert!(run.success, "{variant}: {}", run.stderr);
        let mut flex = Generator::<FlexBackend>::load(tmp.path(), &Default::default()).unwrap();
        // Longer than a pass of the invariant prompt (64 rows) and a decoding batch (16).
        let ids = ids(150, flex.config.vocab_size);
        for threads in [1, 3] {
            let what = format!("{variant}, flex, {threads} threads");
            let seed = (i * 10 + threads) as u64;
            fast_differs |=
                in_thread_pool(Some(threads), || check(&mut flex, &ids, seed, &what)).unwrap();
        }
        if variant == "tiny" || variant == "tiny-gemma3" {
            let mut ndarray =
                Generator::<NdArrayBackend>::load(tmp.path(), &Default::default()).unwrap();
            check(
                &mut ndarray,
                &ids[..40],
                i as u64,
                &format!("{variant}, ndarray"),
            );
        }
    }
    assert!(
        fast_differs,
        "a fast prompt never differed: the check cannot fail"
    );
}

#[test]
fn the_real_model_reaches_a_position_in_the_same_bits_every_way() {
    let root = common::workspace_root().join("artifacts/smollm2-135m-instruct");
    let Some(_) = common::model_file(root.join("model.mpk"), "just fetch convert") else {
        return;
    };
    let tokenizer = runtime::text::tokenizer::Tokenizer::from_dir(&root).unwrap();
    let text = "The little boat sailed across the quiet lake at dawn, and the fisherman \
        counted the birds that circled above the water: three gulls, a heron and a crow.";
    let ids = tokenizer.encode_chat(None, text).unwrap();
    assert!(ids.len() > 64, "{} ids: not longer than a pass", ids.len());
    let mut fast_differs = false;
    // Each weight format with a --matmul that takes another kernel for it, at 1 or 2
    // threads (f32 and bf16 weights take the exact products under auto and int8).
    let cases = [
        (Weights::Auto, Matmul::Exact, 1),
        (Weights::Auto, Matmul::Bf16, 2),
        (Weights::F32, Matmul::Exact, 2),
        (Weights::Blocks(BlockType::Q8_0), Matmul::Auto, 1),
        (Weights::Blocks(BlockType::Q4_0), Matmul::Exact, 2),
        (Weights::Blocks(BlockType::Q4K), Matmul::Auto, 2),
    ];
    for (i, (weights, matmul, threads)) in cases.into_iter().enumerate() {
        let mut generator =
            Generator::<FlexBackend>::load_with(&root, &Default::default(), weights).unwrap();
        generator.matmul = matmul;
        let what = format!("SmolLM2, {weights} weights, --matmul {matmul:?}, {threads} threads");
        fast_differs |= in_thread_pool(Some(threads), || {
            check(&mut generator, &ids, i as u64 + 1, &what)
        })
        .unwrap();
    }
    assert!(
        fast_differs,
        "a fast prompt never differed: the check cannot fail"
    );
}
