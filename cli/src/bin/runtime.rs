//! `runtime`: generate text with a converted Llama model on the CPU.
//! The work is in the library; this is a clap struct and one call.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use cli::BackendKind;
use cli::logprobs::{Logprobs, divergence};
use kernels::int8::Matmul;
use runtime::generate::sampling::{SamplingParams, defaults};
use runtime::generate::{GenerateOptions, Generation, Generator, Prefill};
use runtime::model::backend::KernelBackend;
use runtime::model::cache::KvDtype;
use runtime::text::grammar::Grammar;
use runtime::text::tokenizer::{ContentSpecials, Tokenizer};
use runtime::util::files;
use runtime::weights::file::WeightsMemory;
use runtime::weights::layout::Weights;
use runtime::{FlexBackend, NdArrayBackend};
use serde_json::json;

#[derive(Parser)]
#[command(
    version,
    about = "Generate text with a converted Llama model on the CPU",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    generate: GenerateArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Perplexity of a text file: mean next-token negative log-likelihood (no BOS added).
    Perplexity(PerplexityArgs),
    /// Chat in the terminal: multi-turn, the KV cache kept between turns; Ctrl-C stops an
    /// answer, /reset starts over, /exit (or Ctrl-D) quits.
    Chat(ChatArgs),
    /// Serve OpenAI's API over HTTP: /v1/chat/completions, /v1/completions,
    /// /v1/embeddings, /v1/models, /health, /metrics.
    Serve(ServeArgs),
    /// Embed texts: one JSON list of numbers per text, a line each, in order. An embedding
    /// model pools as its checkpoint says (its pooling.json); a model that generates, and
    /// an embedding model without a pooling file, by the last token, normalized.
    Embed(EmbedArgs),
    /// Internal: render a chat template request from stdin (see `runtime::text::chat`).
    #[command(hide = true)]
    RenderChat,
}

#[derive(Args, Clone)]
struct CommonArgs {
    /// Artifact directory written by `converter convert`.
    #[arg(long, default_value = "artifacts/smollm2-135m-instruct")]
    artifacts: PathBuf,
    /// CPU backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
    /// Worker threads, at most one per core (default: one per core).
    #[arg(long, value_parser = cli::thread_count)]
    threads: Option<usize>,
    /// How the weight matrices are kept in memory: auto (bf16 where that is exact, as for a
    /// bf16 checkpoint, else f32), bf16 (rounding where it is not), f32, or each projection
    /// quantized as it loads to ggml's q8_0, q4_0, q4_k or q6_k blocks (llama.cpp's
    /// reference quantizer; 1.06, 0.56, 0.56 and 0.82 bytes a weight; the K types need
    /// inputs a multiple of 256, other projections stay as auto keeps them; a tied embedding,
    /// which is also the lm_head, is kept as q8_0). The results of auto and f32 are the same to
    /// the bit; bf16 reads half the bytes.
    #[arg(long, default_value = "auto")]
    weights: Weights,
    /// Map the weights file instead of reading it into this process's memory (as llama.cpp
    /// does by default): a start in milliseconds from a cached file and one page cache
    /// shared by every process of the machine (replicas of a server), at the cost of
    /// decoding on some hosts, whose page cache reads slower than the process's own
    /// memory (see README). By default a file that takes at most half the memory
    /// available is read into memory in 2 MiB pages, and a larger one mapped.
    #[arg(long, conflicts_with = "no_mmap")]
    mmap: bool,
    /// Read the weights file into memory whatever its size (llama.cpp's --no-mmap).
    /// Both apply to weights.bin used as it is (--weights auto).
    #[arg(long)]
    no_mmap: bool,
    /// What the KV cache stores keys and values as: f32 (as transformers), f16 (as
    /// llama.cpp) or bf16. f16 and bf16 halve what decoding reads at long context, and round
    /// every key and value.
    #[arg(long, default_value = "f32")]
    kv_cache: KvDtype,
    /// How products over weights kept as ggml blocks (q8_0, q4_0, q4_k, q6_k; from --weights
    /// or a quantized GGUF) take their inputs: auto (each block of inputs rounded to 8-bit
    /// integers and multiplied as integers, as llama.cpp does, on any x86-64 with AVX2; else
    /// exact), int8 (the same, with a note when it changes nothing) or exact (as f32: the
    /// products of the decoded weights, to the bit; decoding 3.4x slower on Q4_K_M).
    /// f32 and bf16 weights are exact, unless bf16 (as auto, and products over bf16
    /// weights take the inputs rounded to bf16, two a lane per `vdpbf16ps`, as llama.cpp's
    /// BF16 path; on CPUs with AVX512_BF16, else exact).
    #[arg(long, default_value = "auto")]
    matmul: Matmul,
    /// How prompts run: fast (many positions per product, through kernels that sum in
    /// another order than decoding's) or invariant (through the decoding kernels: every
    /// position's logits are the bits one-token steps give, however the prompt is split or
    /// a cached conversation is continued, so a reply never depends on what the server had
    /// cached; prompts slower, see docs/BENCHMARKS.md).
    #[arg(long, default_value = "fast", value_name = "fast|invariant")]
    prefill: Prefill,
    /// Speculative decoding: `ngram` drafts the next tokens from an earlier occurrence of
    /// the last ones in the prompt and the answer (prompt lookup); a directory names a
    /// smaller model's artifact, with the same tokenizer, that drafts them greedily. The
    /// model checks a draft in one pass over its weights. It changes no token (the output
    /// is the plain decoding's, greedy or sampled with a seed); drafting pauses itself
    /// where its drafts are rejected.
    #[arg(long, value_name = "ngram|DIR")]
    draft: Option<String>,
    /// How the draft model's weight matrices are kept (as --weights): q4_0 makes a quick
    /// drafter of the model's own artifact.
    #[arg(long, default_value = "auto", requires = "draft")]
    draft_weights: Weights,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Render chats with this Jinja template instead of the model's (as llama-server's
    /// --chat-template-file): one that teaches tool calls, say.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Variables for the chat template, a JSON object (as llama-server's): e.g.
    /// '{"enable_thinking": false}' for Qwen3 to answer without thinking first.
    #[arg(long, value_name = "JSON", value_parser = template_kwargs)]
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

impl CommonArgs {
    /// Where the weights file lies once loaded.
    fn memory(&self) -> WeightsMemory {
        WeightsMemory::from_flags(self.mmap, self.no_mmap)
    }
}

/// `--chat-template-kwargs`: a JSON object.
fn template_kwargs(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(kwargs)) => Ok(kwargs),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

#[derive(Args)]
struct GenerateArgs {
    /// Text to continue (or, with --chat, the user's message).
    #[arg(long, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from a file (UTF-8).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Render the prompt with the model's chat template as one user turn.
    #[arg(long)]
    chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// With --chat: special-token text in the prompt and --system (`<|im_start|>`) becomes
    /// the control token itself, as in the template's own markup, instead of plain text.
    #[arg(long, requires = "chat")]
    special_in_content: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    common: CommonArgs,
}

/// How to generate: length, sampling, stop strings.
#[derive(Args)]
struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_new_tokens: u32,
    /// Sampling temperature; 0 picks the most likely token every time (greedy).
    #[arg(long, default_value_t = defaults::TEMPERATURE)]
    temperature: f32,
    /// Sample from the K most likely tokens only (0: no limit).
    #[arg(long, default_value_t = defaults::TOP_K)]
    top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches P (1: no limit).
    #[arg(long, default_value_t = defaults::TOP_P)]
    top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0: none).
    #[arg(long, default_value_t = defaults::MIN_P)]
    min_p: f32,
    /// Penalty for tokens among the last --repeat-last-n (1: none).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Window of the repetition penalty, in tokens.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// OpenAI's presence penalty, in [-2, 2]: taken off the logit of every token generated
    /// so far, once (0: none).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// OpenAI's frequency penalty, in [-2, 2]: taken off a token's logit once per time it
    /// has been generated so far (0: none).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// ID=BIAS: add BIAS (-100 to 100) to token ID's logit before sampling (repeatable; -100
    /// all but bans the token, 100 all but forces it), as OpenAI's logit_bias.
    #[arg(long, value_parser = logit_bias, allow_hyphen_values = true)]
    logit_bias: Vec<(u32, f32)>,
    /// Random seed: the same seed gives the same text.
    #[arg(long, default_value_t = 299_792_458)]
    seed: u64,
    /// End generation before this string (repeatable). `\n`, `\t` and `\r` are read as
    /// newline, tab and carriage return, `\\` as a backslash, as llama.cpp reads them.
    #[arg(long, value_parser = unescape)]
    stop: Vec<String>,
    /// Generate JSON valid against the JSON Schema in FILE (constrained decoding: every
    /// token the schema cannot continue with is masked before sampling).
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    json_schema: Option<PathBuf>,
    /// Generate text the grammar in FILE accepts (llguidance's Lark dialect, as
    /// llama-server's `--grammar` takes GBNF).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
}

/// `--logit-bias ID=BIAS`.
fn logit_bias(text: &str) -> Result<(u32, f32), String> {
    let (id, bias) = (text.split_once('=')).ok_or_else(|| format!("{text:?} is not ID=BIAS"))?;
    let id = (id.trim().parse()).map_err(|_| format!("{id:?} is not a token id"))?;
    let bias = (bias.trim().parse()).map_err(|_| format!("{bias:?} is not a number"))?;
    Ok((id, bias))
}

impl SamplingArgs {
    fn options(&self) -> Result<GenerateOptions> {
        let sampling = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
            seed: self.seed,
        };
        sampling
            .validate()
            .map_err(|e| anyhow::anyhow!("invalid option: {e}"))?;
        Ok(GenerateOptions {
            max_new_tokens: self.max_new_tokens as usize,
            sampling,
            stop: self.stop.clone(),
            grammar: self.grammar()?,
        })
    }

    /// `--json-schema` or `--grammar`, read.
    fn grammar(&self) -> Result<Option<Grammar>> {
        const MAX_BYTES: u64 = 1 << 20;
        if let Some(path) = &self.json_schema {
            let text = files::read_text_bounded(path, MAX_BYTES)?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {}: not JSON", path.display()))?;
            return Ok(Some(Grammar::JsonSchema(schema)));
        }
        match &self.grammar {
            Some(path) => Ok(Some(Grammar::Lark(files::read_text_bounded(
                path, MAX_BYTES,
            )?))),
            None => Ok(None),
        }
    }
}

#[derive(Args)]
struct ChatArgs {
    /// System message at the start of the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Special-token text typed in a message (`<|im_start|>`) becomes the control token
    /// itself instead of plain text.
    #[arg(long)]
    special_in_content: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args)]
struct PerplexityArgs {
    /// Text file to score (UTF-8).
    #[arg(long)]
    file: PathBuf,
    /// Score only the first N tokens (default: the model's context length).
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    max_tokens: Option<u32>,
    /// Save every position's log-probabilities to this file, as a base for --kl-base.
    #[arg(long)]
    save_logprobs: Option<PathBuf>,
    /// Also report the mean KL divergence of this run from the log-probabilities saved in
    /// this file (by --save-logprobs, or from llama.cpp by scripts/llamacpp_logprobs.py) over
    /// the same tokens, as llama-perplexity's --kl-divergence does.
    #[arg(long)]
    kl_base: Option<PathBuf>,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args)]
struct EmbedArgs {
    /// A text to embed (repeatable). Without any, each line of stdin is one.
    #[arg(long)]
    text: Vec<String>,
    /// Cut each embedding to its first N values (then normalized if the model normalizes),
    /// for a model that lists N among its matryoshka_dimensions.
    #[arg(long, value_name = "N")]
    dimensions: Option<usize>,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests generated at once; more wait in a queue.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    parallel: u16,
    /// Requests that may wait for a free slot; past them a new one gets 429 with
    /// Retry-After. Each holds a connection: a value not below --max-connections is lowered
    /// to half of them, so that waiting requests never take every connection.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    max_queue: u64,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on the /v1 routes.
    #[arg(long)]
    api_key: Option<String>,
    /// Special-token text in a chat message (`<|im_start|>`) becomes the control token
    /// itself, as llama-server and vLLM read it, instead of plain text.
    #[arg(long)]
    special_in_content: bool,
    /// Leave a thinking model's `<think>` section (Qwen3's) at the start of a chat answer's
    /// content, instead of moving it to `reasoning_content` as vLLM and llama-server do.
    #[arg(long)]
    keep_thinking: bool,
    /// Largest request body, in bytes (larger ones get 413).
    #[arg(long, default_value_t = 1 << 20)]
    body_limit: usize,
    /// Seconds a client has to send a request's head (counted from when the server starts
    /// waiting for it, so also how long an idle connection is kept), and then its body.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    read_timeout: u64,
    /// Seconds requests under way get to finish after SIGTERM or Ctrl-C before the server
    /// exits anyway (a second signal: at once).
    #[arg(long, value_name = "SECS", default_value_t = 20)]
    shutdown_timeout: u64,
    /// Connections open at once (at most what the open-file limit allows); at the cap a new
    /// one closes the connection waiting longest without a request under way.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// Allow cross-origin requests from browser pages of this origin (CORS), e.g.
    /// http://localhost:3000; `*` allows any. Repeatable. Others get 403.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// When bound to a loopback address, also serve requests whose Host header names this
    /// (e.g. behind a proxy that passes the client's Host on); `*` allows any. Repeatable.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// A proxy's IP address whose X-Forwarded-Proto header is believed: behind one that
    /// ends TLS, a browser's page at https:// + Host is then this server's own. Repeatable.
    #[arg(long = "trusted-proxy", value_name = "IP")]
    trusted_proxies: Vec<std::net::IpAddr>,
    /// MiB the KV caches kept from finished requests (so that a conversation's next turn
    /// prefills only what is new) may take in all; the least recently used go first.
    /// 0 keeps none. Default: a quarter of the memory available at start, at most 8192.
    #[arg(long, value_name = "MIB")]
    cache_ram: Option<u64>,
    /// The model's name in responses and `/v1/models` (default: the artifact directory's
    /// name); given again, further names a request's `model` may use (as vLLM's).
    #[arg(long = "served-model-name", value_name = "NAME")]
    served_model_names: Vec<String>,
    /// Do not serve the chat page at `/` (the API is served either way).
    #[arg(long)]
    no_webui: bool,
    #[command(flatten)]
    common: CommonArgs,
}

fn main() -> ExitCode {
    let started = Instant::now();
    runtime::keep_freed_memory();
    let cli = Cli::parse();
    match run(cli, started) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, started: Instant) -> Result<()> {
    // A mistyped tier would otherwise be ignored and the figures taken for that tier's.
    kernels::cpu::requested().map_err(anyhow::Error::msg)?;
    let common = match &cli.command {
        Some(Command::Perplexity(args)) => &args.common,
        Some(Command::Chat(args)) => &args.common,
        Some(Command::Embed(args)) => &args.common,
        Some(Command::RenderChat) => return Ok(runtime::text::chat::serve()?),
        Some(Command::Serve(args)) => return serve(args),
        None => &cli.generate.common,
    };
    runtime::in_thread_pool(common.threads, || match common.backend {
        BackendKind::Flex => run_on::<FlexBackend>(&cli, started),
        BackendKind::Ndarray => run_on::<NdArrayBackend>(&cli, started),
    })
    .context("cannot start the thread pool")?
}

fn run_on<B: KernelBackend>(cli: &Cli, started: Instant) -> Result<()> {
    match &cli.command {
        Some(Command::Perplexity(args)) => perplexity::<B>(args),
        Some(Command::Embed(args)) => embed::<B>(args),
        Some(Command::Chat(args)) => {
            let (generator, tokenizer) = load::<B>(&args.common)?;
            cli::repl::run(
                &generator,
                &tokenizer,
                args.system.as_deref(),
                args.sampling.options()?,
                specials(args.special_in_content),
            )
        }
        Some(Command::RenderChat | Command::Serve(_)) => {
            unreachable!("run before the thread pool starts")
        }
        None => generate::<B>(&cli.generate, started),
    }
}

/// `runtime serve`: the engine thread starts its own pool, and loads the model after the
/// port is bound.
fn serve(args: &ServeArgs) -> Result<()> {
    let common = args.common.clone();
    let directory = (common.artifacts.file_name())
        .map_or("model".into(), |name| name.to_string_lossy().into_owned());
    let (model, aliases) = match args.served_model_names.split_first() {
        Some((first, rest)) => (first.clone(), rest.to_vec()),
        None => (directory, Vec::new()),
    };
    let cache_budget = match args.cache_ram {
        Some(mib) => mib.saturating_mul(1 << 20),
        None => runtime::util::memory::available()
            .map_or(1 << 30, |a| a / 4)
            .min(8 << 30),
    };
    check_parallel(&common, args.parallel.into())?;
    let options = server::Options {
        host: args.host.clone(),
        port: args.port,
        parallel: args.parallel.into(),
        max_queue: usize::try_from(args.max_queue).unwrap_or(usize::MAX),
        api_key: args.api_key.clone(),
        model,
        aliases,
        body_limit: args.body_limit,
        threads: common.threads,
        cache_budget,
        read_timeout: std::time::Duration::from_secs(args.read_timeout),
        shutdown_timeout: std::time::Duration::from_secs(args.shutdown_timeout),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        allowed_origins: args.allowed_origins.clone(),
        allowed_hosts: args.allowed_hosts.clone(),
        trusted_proxies: args.trusted_proxies.clone(),
        content_specials: specials(args.special_in_content),
        keep_thinking: args.keep_thinking,
        webui: !args.no_webui,
    };
    let listening = |address| {
        println!("listening on http://{address}");
        let _ = std::io::stdout().flush();
    };
    match common.backend {
        BackendKind::Flex => server::serve::<FlexBackend, _>(
            options,
            move || load::<FlexBackend>(&common).map_err(|e| format!("{e:#}")),
            listening,
        ),
        BackendKind::Ndarray => server::serve::<NdArrayBackend, _>(
            options,
            move || load::<NdArrayBackend>(&common).map_err(|e| format!("{e:#}")),
            listening,
        ),
    }?;
    Ok(())
}

fn load<B: KernelBackend>(common: &CommonArgs) -> Result<(Generator<B>, Tokenizer)> {
    let (dir, device) = (&common.artifacts, Default::default());
    if common.weights == Weights::Bf16 && !B::BF16_WEIGHTS {
        bail!("--weights bf16 needs the flex backend");
    }
    let mut generator = cli::with_load_progress("loading the model", |progress| {
        Generator::<B>::load_watched(dir, &device, common.weights, common.memory(), progress)
    })?;
    generator.kv_dtype = common.kv_cache;
    generator.matmul = common.matmul;
    generator.prefill = common.prefill;
    if let Some(draft) = &common.draft {
        cli::set_draft(&mut generator, draft, common.draft_weights, common.memory())?;
    }
    // A rounding asked for by name that this CPU or these weights leave unused.
    let asked = match common.matmul {
        Matmul::Int8 => Some((
            "int8",
            kernels::int8::available(),
            "AVX2",
            generator.kept.blocks,
            "changes nothing here: no weight is kept as blocks",
        )),
        Matmul::Bf16 => Some((
            "bf16",
            kernels::dpbf16::runs(),
            "AVX512_BF16",
            generator.kept.bf16,
            "rounds nothing here: no weight is kept as bf16",
        )),
        _ => None,
    };
    if let Some((name, runs, feature, kept, unused)) = asked {
        if !runs {
            eprintln!("note: this CPU has no {feature}: --matmul {name} runs the exact products");
        } else if kept == 0 {
            eprintln!("note: --matmul {name} {unused} (see --weights)");
        }
    }
    if generator.kept.rounded > 0 {
        eprintln!(
            "note: --weights bf16 rounded {} of the {} weight matrices, which hold values bf16 does not (results differ from --weights f32)",
            generator.kept.rounded,
            generator.kept.bf16 + generator.kept.f32
        );
    }
    let mut tokenizer = Tokenizer::from_dir(dir)?;
    tokenizer.check_fits(generator.config.vocab_size)?;
    if let Some(path) = &common.chat_template {
        let template = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the chat template {}", path.display()))?;
        tokenizer.set_chat_template(template);
    }
    if let Some(kwargs) = &common.chat_template_kwargs {
        tokenizer.set_template_kwargs(kwargs.clone());
    }
    Ok((generator, tokenizer))
}

/// What special-token text in a chat message becomes (`--special-in-content`).
fn specials(live: bool) -> ContentSpecials {
    if live {
        ContentSpecials::Live
    } else {
        ContentSpecials::Text
    }
}

/// Refuses a `--parallel` whose requests could not each hold even a short prompt's KV cache
/// (one block of positions) in the memory available: caches grow as they fill, so this is
/// the least `--parallel` requests need, not the most.
fn check_parallel(common: &CommonArgs, parallel: usize) -> Result<()> {
    let path = common
        .artifacts
        .join(runtime::util::file_names::CONFIG_FILE);
    // An unreadable config is the loader's to report, with the rest of the artifact.
    let Ok(config) = runtime::model::config::LlamaConfig::from_file(&path) else {
        return Ok(());
    };
    let blocks =
        runtime::model::cache::bytes_for(&config, runtime::model::cache::BLOCK, common.kv_cache)
            .saturating_mul(parallel as u64);
    match runtime::util::memory::available() {
        Some(available) if blocks > available => bail!(
            "--parallel {parallel} needs {} MB for the KV caches of {parallel} short requests, more than the {} MB available; ask for fewer",
            blocks >> 20,
            available >> 20
        ),
        _ => Ok(()),
    }
}

/// The most bytes of text `tokens` tokens can cover: more is never tokenized whole.
fn text_limit(tokenizer: &Tokenizer, tokens: usize) -> u64 {
    (tokens as u64).saturating_mul(tokenizer.max_token_bytes() as u64)
}

/// Writes `line` to stdout. A reader that closed the pipe early (`| head`) is not an
/// error: it has what it wanted.
fn print_line(line: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result.context("cannot write to stdout"),
    }
}

fn generate<B: KernelBackend>(args: &GenerateArgs, started: Instant) -> Result<()> {
    let options = args.sampling.options()?;
    if args.prompt.is_none() && args.prompt_file.is_none() {
        bail!("give a prompt with --prompt TEXT or --prompt-file FILE");
    }
    let (generator, tokenizer) = load::<B>(&args.common)?;
    // A prompt longer than this cannot fit the context: refused before it is tokenized.
    let context = generator.config.max_position_embeddings;
    let limit = text_limit(&tokenizer, context);
    let prompt = match (&args.prompt, &args.prompt_file) {
        (Some(prompt), _) => prompt.clone(),
        (None, Some(path)) => files::read_text_bounded(path, limit)?,
        (None, None) => unreachable!("checked above"),
    };
    if prompt.len() as u64 > limit {
        bail!(
            "the prompt has {} bytes, more than the model's {context}-token context can hold",
            prompt.len()
        );
    }
    let prompt_ids = if args.chat {
        // In a child process: the template comes with the model, and memory is the one
        // thing rendering it in this process can't bound.
        let request = tokenizer.chat_request(args.system.as_deref(), &prompt)?;
        let specials = specials(args.special_in_content);
        tokenizer.encode_request(&request, &runtime::text::chat::render_in_child, specials)?
    } else {
        tokenizer.encode(&prompt)?
    };
    let load_s = started.elapsed().as_secs_f64();

    let mut stdout = std::io::stdout().lock();
    let mut pipe_closed = false;
    let generation = generator.generate(&tokenizer, &prompt_ids, &options, |piece| {
        if !args.common.json && !pipe_closed {
            // A closed pipe (`| head`) is the reader's choice, not an error.
            pipe_closed = stdout
                .write_all(piece.as_bytes())
                .and_then(|()| stdout.flush())
                .is_err();
        }
    })?;
    if args.common.json {
        print_line(&generation_json(&generation, load_s).to_string())?;
    } else {
        if !pipe_closed {
            writeln!(stdout).ok();
        }
        eprintln!(
            "load {load_s:.2} s | prompt {} tokens, {:.1} tok/s | generated {} tokens, {:.1} tok/s | stop: {}",
            generation.prompt_tokens,
            generation.timings.prefill_tokens_per_s,
            generation.tokens.len(),
            generation.timings.decode_tokens_per_s,
            json!(generation.stop_reason).as_str().unwrap_or_default(),
        );
    }
    Ok(())
}

/// `text` with the escapes `\n`, `\t`, `\r` and `\\` replaced by what they stand for, so
/// `--stop "\n\n"` typed in a shell means a blank line. Any other backslash is kept.
fn unescape(text: &str) -> Result<String, std::convert::Infallible> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some(other) => out.extend(['\\', other]),
            None => out.push('\\'),
        }
    }
    Ok(out)
}

fn generation_json(g: &Generation, load_s: f64) -> serde_json::Value {
    json!({
        "text": g.text,
        "tokens": g.tokens,
        "prompt_tokens": g.prompt_tokens,
        "generated_tokens": g.tokens.len(),
        "stop_reason": g.stop_reason,
        "timings": {
            "load_s": load_s,
            "prefill_tokens_per_s": g.timings.prefill_tokens_per_s,
            "decode_tokens_per_s": g.timings.decode_tokens_per_s,
        },
    })
}

/// `runtime embed`: the texts (or stdin's lines) checked and tokenized first, then each
/// embedded alone and printed as a JSON list, a line a text.
fn embed<B: KernelBackend>(args: &EmbedArgs) -> Result<()> {
    /// Most bytes read from stdin.
    const STDIN_LIMIT: u64 = 64 << 20;
    let texts = if args.text.is_empty() {
        let mut input = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(std::io::stdin().lock(), STDIN_LIMIT + 1),
            &mut input,
        )
        .context("cannot read stdin as UTF-8 text")?;
        if input.len() as u64 > STDIN_LIMIT {
            bail!("stdin holds more than {STDIN_LIMIT} bytes");
        }
        input.lines().map(str::to_string).collect()
    } else {
        args.text.clone()
    };
    if texts.is_empty() {
        bail!("nothing to embed: give --text TEXT, or lines on stdin");
    }
    if let Some(i) = texts.iter().position(String::is_empty) {
        bail!("text {} is empty", i + 1);
    }
    let (generator, tokenizer) = load::<B>(&args.common)?;
    generator.check_dimensions(args.dimensions)?;
    let context = generator.config.max_position_embeddings;
    let mut inputs = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let ids = tokenizer.encode(text)?;
        if ids.len() > context {
            bail!(
                "text {} has {} tokens; the model's context holds {context} (max_position_embeddings)",
                i + 1,
                ids.len()
            );
        }
        inputs.push(ids);
    }
    for ids in &inputs {
        let vector = generator.embed(ids, args.dimensions)?;
        print_line(&json!(vector).to_string())?;
    }
    Ok(())
}

fn perplexity<B: KernelBackend>(args: &PerplexityArgs) -> Result<()> {
    let (generator, tokenizer) = load::<B>(&args.common)?;
    let limit = args
        .max_tokens
        .map_or(generator.config.max_position_embeddings, |n| n as usize);
    // Only the beginning that `limit` tokens can cover is read and tokenized, with a margin
    // so that the cut never changes those tokens (a word split by it is past them).
    let prefix = text_limit(&tokenizer, limit).saturating_add(64 << 10);
    let text = files::read_text_prefix(&args.file, prefix)?;
    let mut ids = tokenizer.encode(&text)?;
    ids.truncate(limit);
    // Read first: a base that cannot be compared fails before the scoring.
    let base = args.kl_base.as_deref().map(Logprobs::load).transpose()?;
    let keep = args.save_logprobs.is_some() || base.is_some();
    let mut logprobs = Logprobs::new(&ids, generator.config.vocab_size);
    // Stderr, and not beside --json: its output is for programs.
    let bar = match args.common.json {
        true => indicatif::ProgressBar::hidden(),
        false => cli::progress_bar("scoring", ids.len() as u64, "tokens"),
    };
    let result = generator.score(&ids, |logits| {
        bar.inc(1);
        if keep {
            logprobs.push(logits)
        }
    });
    bar.finish_and_clear();
    let result = result?;
    if let Some(path) = &args.save_logprobs {
        logprobs.save(path)?;
    }
    let divergence = base.map(|base| divergence(&base, &logprobs)).transpose()?;
    if args.common.json {
        let mut value = json!(result);
        if let Some(d) = &divergence {
            value["divergence"] = json!(d);
        }
        print_line(&value.to_string())?;
    } else {
        let mut line = format!(
            "tokens {} | mean nll {:.6} | perplexity {:.4}",
            result.tokens, result.nll, result.ppl
        );
        if let Some(d) = divergence {
            line += &format!(
                " | mean KL {:.6} (max {:.4}) | same top token {:.2}%",
                d.mean_kl,
                d.max_kl,
                100.0 * d.same_top
            );
        }
        print_line(&line)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn stop_escapes_read_as_typed() {
        for (typed, meant) in [
            (r"\n\n", "\n\n"),
            (r"a\tb\r", "a\tb\r"),
            (r"back\\slash\n", "back\\slash\n"),
            (r"keep \x and a trailing \", "keep \\x and a trailing \\"),
            ("plain", "plain"),
        ] {
            assert_eq!(unescape(typed).unwrap(), meant, "{typed}");
        }
    }
}
