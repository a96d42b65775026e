//! Speculative decoding changes no token, on every Llama-family fixture: a sequence whose
//! drafts (prompt lookup, `Sequence::start_drafting`) are checked in one pass generates the
//! tokens it generates stepped one token at a time, greedy and sampled with a seed, alone
//! and in a batch of four, at 1 and 3 threads, on burn-flex and on burn-ndarray (the
//! composed ops). The prompts repeat a run of tokens so that drafts are made; each family's
//! test also checks that some were kept, so that the comparison exercises the checks.

mod common;

use runtime::generate::sampling::SamplingParams;
use runtime::generate::{Draft, GenerateOptions, Generator, Sequence};
use runtime::model::backend::KernelBackend;
use runtime::text::tokenizer::Tokenizer;
use runtime::{FlexBackend, NdArrayBackend};

fn data_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn options(temperature: f32, seed: u64, max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        sampling: SamplingParams {
            temperature,
            seed,
            ..Default::default()
        },
        stop: vec![],
        grammar: None,
    }
}

/// Each prompt's generated tokens, the sequences stepped together, drafting or not; and
/// the drafted tokens kept in all.
fn generate<B: KernelBackend>(
    generator: &Generator<B>,
    tokenizer: &Tokenizer,
    prompts: &[(Vec<u32>, GenerateOptions)],
    draft: bool,
) -> (Vec<Vec<u32>>, usize) {
    let mut sequences: Vec<Sequence<'_, B>> = (prompts.iter())
        .map(|(prompt, options)| {
            let mut sequence = generator.start(tokenizer, prompt, options.clone()).unwrap();
            if draft {
                sequence.start_drafting(Draft::Ngram);
            }
            sequence
        })
        .collect();
    loop {
        let mut all: Vec<&mut Sequence<'_, B>> = sequences.iter_mut().collect();
        let results = generator.step_each(&mut all, |_, _| {});
        if results.into_iter().all(|r| r.unwrap().is_some()) {
            break;
        }
    }
    let kept = sequences.iter().map(|s| s.drafted().1).sum();
    (
        sequences.iter().map(|s| s.tokens().to_vec()).collect(),
        kept,
    )
}

/// Prompts from the fixture's ids, each repeating a run of them (so that n-grams recur).
fn prompts(ids: &[u32], vocab_size: usize) -> Vec<Vec<u32>> {
    (0..4)
        .map(|p| {
            let run: Vec<u32> = (ids.iter().skip(p * 7).take(12))
                .map(|&id| id % vocab_size as u32)
                .collect();
            run.iter().chain(&run).chain(&run[..5]).copied().collect()
        })
        .collect()
}

/// The same tokens drafting or not, greedy and sampled, alone and four at once; the drafted
/// tokens kept in all.
fn assert_same<B: KernelBackend>(
    generator: &Generator<B>,
    tokenizer: &Tokenizer,
    what: &str,
) -> usize {
    let vocab = generator.config.vocab_size;
    let ids: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % vocab as u32).collect();
    let prompts = prompts(&ids, vocab);
    let mut kept = 0;
    for (temperature, seed) in [(0.0, 0), (0.9, 5)] {
        let batch: Vec<(Vec<u32>, GenerateOptions)> = (prompts.iter().enumerate())
            .map(|(i, p)| {
                (
                    p.clone(),
                    options(temperature, seed + i as u64, 60 + 10 * i),
                )
            })
            .collect();
        for set in [&batch[..1], &batch[..]] {
            let (plain, _) = generate(generator, tokenizer, set, false);
            let (drafted, k) = generate(generator, tokenizer, set, true);
            assert_eq!(
                drafted,
                plain,
                "{what}, temperature {temperature}, {} sequences",
                set.len()
            );
            kept += k;
        }
    }
    kept
}

#[test]
fn every_family_generates_the_same_tokens_with_drafts() {
    for variant in common::FAMILIES {
        let tmp = tempfile::tempdir().unwrap();
        let run = common::converter(&[&"convert", &data_dir(variant), &tmp.path()]);
        assert!(run.success, "{variant}: {}", run.stderr);
        let tokenizer = Tokenizer::from_dir(tmp.path()).unwrap();
        let flex = Generator::<FlexBackend>::load(tmp.path(), &Default::default()).unwrap();
        let mut kept = 0;
        for threads in [1, 3] {
            let what = format!("{variant}, flex, {threads} threads");
            kept +=
                runtime::in_thread_pool(Some(threads), || assert_same(&flex, &tokenizer, &what))
                    .unwrap();
        }
        if variant == "tiny" || variant == "tiny-gemma3" {
            let ndarray =
                Generator::<NdArrayBackend>::load(tmp.path(), &Default::default()).unwrap();
            kept += assert_same(&ndarray, &tokenizer, &format!("{variant}, ndarray"));
        }
        assert!(kept > 0, "{variant}: no drafted token was kept");
    }
}

/// A sequence that stops drafting part-way (a draft model that failed, a request limited
/// to no drafts) drafts nothing more, and still counts what it drafted before (`/metrics`
/// adds it up when the request ends).
#[test]
fn stopping_drafts_keeps_the_counts_of_those_made() {
    let tmp = tempfile::tempdir().unwrap();
    let run = common::converter(&[&"convert", &data_dir("tiny"), &tmp.path()]);
    assert!(run.success, "{}", run.stderr);
    let tokenizer = Tokenizer::from_dir(tmp.path()).unwrap();
    let generator = Generator::<FlexBackend>::load(tmp.path(), &Default::default()).unwrap();
    let vocab = generator.config.vocab_size;
    let ids: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % vocab as u32).collect();
    let prompt = &prompts(&ids, vocab)[0];
    let mut sequence = generator
        .start(&tokenizer, prompt, options(0.0, 0, 80))
        .unwrap();
    sequence.start_drafting(Draft::Ngram);
    while sequence.drafted().0 == 0 {
        let step = generator.step(&mut sequence, &mut |_| {}).unwrap();
        assert!(step.is_none(), "ended before a draft was made");
    }
    let made = sequence.drafted();
    sequence.stop_drafting();
    let mut step = || generator.step(&mut sequence, &mut |_| {}).unwrap();
    while step().is_none() {}
    assert_eq!(sequence.drafted(), made);
}
