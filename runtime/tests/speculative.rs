//! Speculative decoding changes no token: on the real SmolLM2-135M-Instruct artifact, a
//! sequence with an n-gram drafter (`Sequence::start_drafting`) generates the tokens it
//! generates without one, greedy and sampled with the same seed, alone and in a batch of
//! four, at 1 and 3 threads, and with every weight format the loader keeps. Each test also
//! checks that drafts were made and kept, so that the comparison exercises the checks.
//!
//! Skipped when the artifact is missing; `REQUIRE_MODEL=1` (set by `just test`) makes that
//! a failure instead.

mod common;

use kernels::quant::BlockType;
use runtime::generate::sampling::SamplingParams;
use runtime::generate::{Draft, GenerateOptions, Generator, Sequence};
use runtime::text::tokenizer::Tokenizer;
use runtime::weights::layout::Weights;
use runtime::{FlexBackend, in_thread_pool};

/// A request whose answer repeats much of its prompt, where drafts are kept.
const COPYING: &str = "Repeat the following text exactly, word for word:\n\nThe quick brown \
    fox jumps over the lazy dog. The lazy dog sleeps in the warm sun while the fox runs \
    into the forest to find its family. At night the fox returns and the dog is still asleep.";
/// An open question, where few drafts are kept.
const OPEN: &str = "Write a short poem about the sea.";

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

/// Each prompt's tokens, the sequences stepped together (`step_each`), drafting or not;
/// and the tokens drafted and kept in all.
fn generate_together(
    generator: &Generator<FlexBackend>,
    tokenizer: &Tokenizer,
    prompts: &[(&str, GenerateOptions)],
    draft: Option<Draft>,
) -> (Vec<Vec<u32>>, (usize, usize)) {
    let mut sequences: Vec<Sequence<'_, FlexBackend>> = (prompts.iter())
        .map(|(prompt, options)| {
            let ids = tokenizer.encode_chat(None, prompt).unwrap();
            let mut sequence = generator.start(tokenizer, &ids, options.clone()).unwrap();
            if let Some(draft) = draft {
                sequence.start_drafting(draft);
            }
            sequence
        })
        .collect();
    loop {
        let mut running: Vec<&mut Sequence<'_, FlexBackend>> = sequences.iter_mut().collect();
        let results = generator.step_each(&mut running, |_, _| {});
        let mut ended = true;
        for result in results {
            ended &= result.unwrap().is_some();
        }
        if ended {
            break;
        }
    }
    let drafted = sequences
        .iter()
        .map(Sequence::drafted)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let tokens = sequences.iter().map(|s| s.tokens().to_vec()).collect();
    (tokens, drafted)
}

/// Drafting by prompt lookup gives the same tokens, and some drafts were kept.
fn assert_same_tokens(
    generator: &Generator<FlexBackend>,
    tokenizer: &Tokenizer,
    prompts: &[(&str, GenerateOptions)],
    what: &str,
) {
    assert_same_tokens_with(generator, tokenizer, prompts, Draft::Ngram, what);
}

/// Drafting with `draft` gives the same tokens, and some drafts were kept.
fn assert_same_tokens_with(
    generator: &Generator<FlexBackend>,
    tokenizer: &Tokenizer,
    prompts: &[(&str, GenerateOptions)],
    draft: Draft,
    what: &str,
) {
    let (plain, _) = generate_together(generator, tokenizer, prompts, None);
    let (drafted, (made, kept)) = generate_together(generator, tokenizer, prompts, Some(draft));
    for (i, (plain, drafted)) in plain.iter().zip(&drafted).enumerate() {
        assert_eq!(drafted, plain, "{what}: prompt {i}");
    }
    assert!(
        kept > 0 && made >= kept,
        "{what}: {kept} of {made} drafted tokens kept"
    );
}

#[test]
fn greedy_tokens_are_the_same_with_drafts_alone_and_in_a_batch() {
    let Some(dir) = common::artifact_dir() else {
        return;
    };
    let generator = Generator::<FlexBackend>::load(&dir, &Default::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    for threads in [1, 3] {
        in_thread_pool(Some(threads), || {
            let alone = [(COPYING, options(0.0, 0, 80))];
            assert_same_tokens(&generator, &tokenizer, &alone, "alone");
            let batch = [
                (COPYING, options(0.0, 0, 80)),
                (OPEN, options(0.0, 0, 40)),
                ("Say the word hello five times.", options(0.0, 0, 30)),
                (COPYING, options(0.0, 0, 50)),
            ];
            assert_same_tokens(&generator, &tokenizer, &batch, "a batch of four");
        })
        .unwrap();
    }
}

/// Sampled with a seed, each token is drawn from the same logits with the same draw: the
/// same tokens, drafting or not.
#[test]
fn sampled_tokens_are_the_same_with_drafts_for_a_seed() {
    let Some(dir) = common::artifact_dir() else {
        return;
    };
    let generator = Generator::<FlexBackend>::load(&dir, &Default::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let prompts = [
        (COPYING, options(0.7, 11, 80)),
        (COPYING, options(0.3, 12, 80)),
        (OPEN, options(1.0, 13, 40)),
    ];
    assert_same_tokens(&generator, &tokenizer, &prompts, "sampled");
}

/// With the weights kept as f32 and as q8_0 and q4_0 blocks (int8 products, the default
/// `--matmul`), the checks still change nothing.
#[test]
fn every_weight_format_gives_the_same_tokens_with_drafts() {
    let Some(dir) = common::artifact_dir() else {
        return;
    };
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    for weights in [
        Weights::F32,
        Weights::Blocks(BlockType::Q8_0),
        Weights::Blocks(BlockType::Q4_0),
    ] {
        let generator =
            Generator::<FlexBackend>::load_with(&dir, &Default::default(), weights).unwrap();
        let prompts = [(COPYING, options(0.0, 0, 60)), (OPEN, options(0.0, 0, 20))];
        assert_same_tokens(&generator, &tokenizer, &prompts, &format!("{weights:?}"));
    }
}

/// The model's own copy in q4_0 blocks drafting for it (`Draft::Model`): the same tokens,
/// greedy and sampled, alone and three at once; most drafts kept.
#[test]
fn a_draft_model_changes_no_token() {
    let Some(dir) = common::artifact_dir() else {
        return;
    };
    let mut generator = Generator::<FlexBackend>::load(&dir, &Default::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let draft = Generator::<FlexBackend>::load_with(
        &dir,
        &Default::default(),
        Weights::Blocks(BlockType::Q4_0),
    )
    .unwrap();
    generator.set_draft_model(draft).unwrap();
    let prompts = [
        (OPEN, options(0.0, 0, 60)),
        (COPYING, options(0.7, 3, 60)),
        ("Name three colours.", options(0.0, 0, 30)),
    ];
    assert_same_tokens_with(&generator, &tokenizer, &prompts[..1], Draft::Model, "alone");
    assert_same_tokens_with(&generator, &tokenizer, &prompts, Draft::Model, "three");
}
