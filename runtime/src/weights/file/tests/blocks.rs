//! Projections stored as ggml blocks (a quantized GGUF's, kept by the converter): written
//! only when they decode to the record's values, kept verbatim over the map, loaded as
//! their values under the other `Weights`, and every corruption refused naming the tensor.

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::model::params::FieldPath;

/// One layer whose every projection takes every block type (inputs of 256 and 512).
fn block_config() -> LlamaConfig {
    LlamaConfig::plain([256, 512, 1], [4, 2, 64], 40, 16)
}

/// The type each projection is stored as: all five types, some twice.
fn type_of(path: &str) -> BlockType {
    match path.rsplit('.').nth(1) {
        Some("q_proj" | "up_proj") => BlockType::Q8_0,
        Some("k_proj") => BlockType::Q4_0,
        Some("v_proj") => BlockType::Q5_0,
        Some("o_proj" | "down_proj") => BlockType::Q4K,
        _ => BlockType::Q6K, // gate_proj, lm_head
    }
}

/// Byte offsets of a block's f16 scales.
fn scale_offsets(ty: BlockType) -> &'static [usize] {
    match ty {
        BlockType::Q4K => &[0, 2],
        BlockType::Q6K => &[208],
        _ => &[0],
    }
}

/// `rows` rows of `d_in` values as random `ty` blocks with small finite scales.
fn random_blocks(ty: BlockType, rows: usize, d_in: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let bytes = rows * ty.row_bytes(d_in).unwrap();
    let mut blocks: Vec<u8> = (0..bytes).map(|_| rng.random()).collect();
    for block in blocks.chunks_exact_mut(ty.bytes()) {
        for &at in scale_offsets(ty) {
            let scale = f16::from_f32(rng.random_range(-0.002..0.002));
            block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
    }
    blocks
}

/// Sets every projection weight to the values of random blocks of [`type_of`] its path,
/// and keeps the blocks (rows of outputs, as the weights file stores them).
struct IntoBlocks {
    path: FieldPath,
    type_of: fn(&str) -> BlockType,
    blocks: HashMap<String, (BlockType, Vec<u8>)>,
}

impl<B: Backend> ModuleMapper<B> for IntoBlocks {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let path = self.path.path();
        let [d_in, d_out] = match param.lazy_shape().as_slice() {
            &[d_in, d_out] if self.path.owner() == "Linear" => [d_in, d_out],
            _ => return param,
        };
        let ty = (self.type_of)(&path);
        let blocks = random_blocks(ty, d_out, d_in, self.blocks.len() as u64);
        let mut rows = vec![0.0f32; d_in * d_out];
        ty.decode(&blocks, &mut rows);
        // The record stores a projection `[d_in, d_out]`: the rows transposed.
        let mut values = vec![0.0f32; d_in * d_out];
        for (o, row) in rows.chunks_exact(d_in).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                values[i * d_out + o] = v;
            }
        }
        self.blocks.insert(path, (ty, blocks));
        param.map(|t| Tensor::from_data(TensorData::new(values, vec![d_in, d_out]), &t.device()))
    }
}

type Blocks = HashMap<String, (BlockType, Vec<u8>)>;

fn stored(blocks: &Blocks) -> HashMap<String, StoredBlocks<'_>> {
    (blocks.iter())
        .map(|(path, (ty, bytes))| (path.clone(), StoredBlocks { ty: *ty, bytes }))
        .collect()
}

/// The record of a random model of [`block_config`] whose projections are blocks' values
/// (written in `dir`), the blocks, and the record's length.
fn block_model(dir: &Path) -> (Record, Blocks, u64) {
    block_model_of(dir, &block_config(), type_of)
}

/// [`block_model`] of `config`, each projection's type `type_of` its path.
fn block_model_of(
    dir: &Path,
    config: &LlamaConfig,
    type_of: fn(&str) -> BlockType,
) -> (Record, Blocks, u64) {
    let device = Default::default();
    let model = config.init::<B>(&device).map(&mut Randomize(11));
    let mut into_blocks = IntoBlocks {
        path: FieldPath::default(),
        type_of,
        blocks: HashMap::new(),
    };
    let model = model.map(&mut into_blocks);
    let path = dir.join("model.mpk");
    ArtifactRecorder::new()
        .record(model.into_record(), path.clone())
        .unwrap();
    let record_bytes = std::fs::metadata(&path).unwrap().len();
    (
        Record::open(&path).unwrap(),
        into_blocks.blocks,
        record_bytes,
    )
}

fn write_with(
    record: &Record,
    record_bytes: u64,
    blocks: &HashMap<String, StoredBlocks<'_>>,
) -> Result<Vec<u8>, String> {
    let id = RecordId {
        bytes: record_bytes,
        sha256: SHA256.into(),
    };
    let declared = params(&block_config().init::<B>(&Default::default()));
    let mut bytes = Vec::new();
    write(record, id, &declared, false, blocks, &mut bytes).map(|()| bytes)
}

/// [`block_model`] written as a weights file in `dir` with its blocks: the record, the
/// blocks, the file opened.
fn block_model_file(dir: &Path) -> (Record, Blocks, WeightsFile) {
    let (record, blocks, record_bytes) = block_model(dir);
    let bytes = write_with(&record, record_bytes, &stored(&blocks)).unwrap();
    let path = dir.join("weights.bin");
    std::fs::write(&path, &bytes).unwrap();
    (record, blocks, WeightsFile::open(&path).unwrap())
}

/// The bytes of a projection kept as blocks (burn-flex's tensor of them).
fn block_bytes(weight: &Param<Tensor<B, 2>>) -> Vec<u8> {
    let tensor = weight.val().into_primitive().tensor();
    tensor.bytes().to_vec()
}

/// Every projection of `model`: its path and weight.
fn projections(model: &crate::model::llama::Llama<B>) -> Vec<(String, &Param<Tensor<B, 2>>)> {
    let layer = &model.layers[0];
    let mut out = vec![("lm_head.weight".to_string(), &model.lm_head.weight)];
    for (name, linear) in [
        ("self_attn.q_proj", &layer.self_attn.q_proj),
        ("self_attn.k_proj", &layer.self_attn.k_proj),
        ("self_attn.v_proj", &layer.self_attn.v_proj),
        ("self_attn.o_proj", &layer.self_attn.o_proj),
        ("mlp.gate_proj", &layer.mlp.gate_proj),
        ("mlp.up_proj", &layer.mlp.up_proj),
        ("mlp.down_proj", &layer.mlp.down_proj),
    ] {
        out.push((format!("layers.0.{name}.weight"), &linear.weight));
    }
    out
}

/// `Weights::Auto` keeps each projection as the file's blocks, over its map (no copy), and
/// so does `Weights::Blocks` of the stored type; another type is quantized again from the
/// blocks' values, as loading the record quantizes them.
#[test]
fn blocks_are_kept_verbatim_over_the_map() {
    let dir = tempfile::tempdir().unwrap();
    let (record, blocks, file) = block_model_file(dir.path());
    let device = Default::default();
    let all_bytes: usize = blocks.values().map(|(_, b)| b.len()).sum();
    for (path, (ty, stored)) in &blocks {
        let entry = file.entry(path).unwrap();
        assert_eq!(entry.dtype, Dtype::Blocks(*ty), "{path}");
        assert!(file.bytes(entry)[..] == stored[..], "{path}");
    }
    let load = |source, weights| {
        let model = block_config().init::<B>(&device);
        load_into(source, model, false, weights, &device).unwrap()
    };

    let (model, kept) = load(Source::LaidOut(&file), Weights::Auto);
    let expected = Kept {
        f32: 1, // the embedding: random f32 values
        blocks: 8,
        block_bytes: all_bytes,
        mapped: true,
        ..Kept::default()
    };
    assert_eq!(kept, expected);
    for (path, weight) in projections(&model) {
        let mapped = file.bytes(file.entry(&path).unwrap());
        let tensor = weight.val().into_primitive().tensor();
        assert_eq!(tensor.bytes().as_ptr(), mapped.as_ptr(), "{path}");
    }

    let q8_0 = Weights::Blocks(BlockType::Q8_0);
    let (from_file, kept_from_file) = load(Source::LaidOut(&file), q8_0);
    let (from_record, kept) = load(Source::Record(&record), q8_0);
    assert_eq!(kept, kept_from_file);
    assert_eq!(kept.blocks, 8);
    for ((path, file_weight), (_, record_weight)) in projections(&from_file)
        .into_iter()
        .zip(projections(&from_record))
    {
        let (ty, stored) = &blocks[&path];
        if *ty == BlockType::Q8_0 {
            let mapped = file.bytes(file.entry(&path).unwrap());
            let tensor = file_weight.val().into_primitive().tensor();
            assert_eq!(tensor.bytes().as_ptr(), mapped.as_ptr(), "{path}");
            assert!(block_bytes(file_weight) == *stored, "{path}");
        } else {
            assert!(
                block_bytes(file_weight) == block_bytes(record_weight),
                "{path}"
            );
        }
    }
}

/// Whether `address` lies in anonymous memory advised `MADV_HUGEPAGE` (no file named on its
/// line of /proc/self/smaps, `hg` among its VmFlags), where the kernel gives it 2 MiB pages
/// if it can.
fn in_huge_page_memory(address: usize) -> bool {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut holds = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            // The sixth field names the mapped file, if any.
            let anonymous = fields.nth(4).is_none();
            holds = (start..end).contains(&address).then_some(anonymous);
        } else if let (Some(anonymous), Some(flags)) = (holds, line.strip_prefix("VmFlags:")) {
            return anonymous && flags.split_whitespace().any(|flag| flag == "hg");
        }
    }
    panic!("{address:#x} is in no mapping of /proc/self/smaps")
}

/// The matrices a load makes itself (quantized, widened to f32, laid out from the record)
/// lie in memory asked for in 2 MiB pages, as a copy of weights.bin does: decoding streams
/// them every token, at about half the rate from 4 KiB pages. Those used where they lie in
/// the file's map stay there. (Fails if `Loader::in_arena` passes its tensors through.)
#[test]
fn matrices_made_at_load_lie_in_huge_page_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (record, blocks, file) = block_model_file(dir.path());
    let device = Default::default();
    let address = |weight: &Param<Tensor<B, 2>>| {
        weight.val().into_primitive().tensor().bytes().as_ptr() as usize
    };
    // The embedding (f32 values) is used where it lies in the file's map, but laid out
    // from the record.
    for (source, weights, embedding_made) in [
        (
            Source::LaidOut(&file),
            Weights::Blocks(BlockType::Q4_0),
            false,
        ),
        (Source::LaidOut(&file), Weights::F32, false),
        (Source::Record(&record), Weights::Auto, true),
    ] {
        let model = block_config().init::<B>(&device);
        let (model, _) = load_into(source, model, false, weights, &device).unwrap();
        let embedding = address(&model.embed_tokens.weight);
        assert_eq!(in_huge_page_memory(embedding), embedding_made, "{weights}");
        for (path, weight) in projections(&model) {
            // A projection stored as the blocks asked for is used where it lies.
            let made = !matches!(source, Source::LaidOut(_))
                || weights != Weights::Blocks(blocks[&path].0);
            assert_eq!(
                in_huge_page_memory(address(weight)),
                made,
                "{weights}: {path}"
            );
        }
    }
    let model = block_config().init::<B>(&device);
    let (model, _) =
        load_into(Source::LaidOut(&file), model, false, Weights::Auto, &device).unwrap();
    for (path, weight) in projections(&model) {
        assert!(
            !in_huge_page_memory(address(weight)),
            "over the map: {path}"
        );
    }
}

/// `Weights::F32` decodes the blocks to exactly the record's values, `Weights::Bf16`
/// rounds those; burn-ndarray gets them decoded: each as loading the record gives.
#[test]
fn blocks_load_as_the_values_they_stand_for() {
    let dir = tempfile::tempdir().unwrap();
    let (record, _, file) = block_model_file(dir.path());
    let device = Default::default();
    for weights in [Weights::F32, Weights::Bf16] {
        let load = |source| {
            let model = block_config().init::<B>(&device);
            load_into(source, model, false, weights, &device).unwrap()
        };
        let (from_record, kept) = load(Source::Record(&record));
        let (from_file, kept_from_file) = load(Source::LaidOut(&file));
        assert_eq!(kept, kept_from_file, "{weights}");
        assert_eq!(kept.blocks, 0, "{weights}");
        assert!(snapshot(&from_record) == snapshot(&from_file), "{weights}");
    }
    let ndarray = |source| {
        let device = Default::default();
        let model = block_config().init::<crate::NdArrayBackend>(&device);
        let (model, kept) = load_into(source, model, false, Weights::Auto, &device).unwrap();
        (snapshot(&model), kept)
    };
    assert!(ndarray(Source::Record(&record)) == ndarray(Source::LaidOut(&file)));
}

/// Blocks that are not exactly the record's values, or not a projection's, are refused
/// with the tensor named.
#[test]
fn blocks_that_do_not_stand_for_the_record_are_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let (record, blocks, record_bytes) = block_model(dir.path());
    let q = "layers.0.self_attn.q_proj.weight";
    let edited = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut blocks = blocks.clone();
        edit(&mut blocks.get_mut(q).unwrap().1);
        blocks
    };
    // A quant of row 1's first block (Q8_0: 34 bytes a block, 8 blocks a row; value 3).
    let changed_value = edited(&|b| b[8 * 34 + 2 + 3] ^= 1);
    let nan_scale = edited(&|b| b[34..36].copy_from_slice(&f16::NAN.to_le_bytes()));
    let short = edited(&|b| b.truncate(b.len() - 34));
    let mut of_embedding = blocks.clone();
    of_embedding.insert(
        "embed_tokens.weight".into(),
        (BlockType::Q8_0, vec![0; 40 * 8 * 34]),
    );
    let mut of_nothing = blocks.clone();
    of_nothing.insert("layers.1.mlp.up_proj.weight".into(), blocks[q].clone());
    let mut wrong_type = blocks.clone();
    wrong_type.get_mut(q).unwrap().0 = BlockType::Q4K;
    let cases: [(Blocks, &[&str]); 6] = [
        (
            changed_value,
            &[
                "the Q8_0 blocks of layers.0.self_attn.q_proj.weight decode to ",
                " at row 1, column 3, where the record holds ",
            ],
        ),
        (
            nan_scale,
            &[
                "layers.0.self_attn.q_proj.weight: Q8_0 block 1 of row 0 has a NaN or infinite scale",
            ],
        ),
        (
            short,
            &[
                "the Q8_0 blocks of layers.0.self_attn.q_proj.weight are 69598 bytes, its 256 rows of 256 values take 69632",
            ],
        ),
        (
            // The embedding may be kept as blocks, but these are zeros, not its values.
            of_embedding,
            &["embed_tokens.weight", " where the record holds "],
        ),
        (
            of_nothing,
            &[
                "blocks are given for layers.1.mlp.up_proj.weight, which is not a stored parameter of the model",
            ],
        ),
        (
            wrong_type,
            &[
                "the Q4_K blocks of layers.0.self_attn.q_proj.weight are 69632 bytes, its 256 rows of 256 values take 36864",
            ],
        ),
    ];
    for (blocks, expected) in cases {
        let error = write_with(&record, record_bytes, &stored(&blocks)).unwrap_err();
        for part in expected {
            assert!(error.contains(part), "{error:?} lacks {part:?}");
        }
    }
}

/// Each way a block entry of the file can be wrong, one error naming the tensor: at open
/// (byte count, rows not whole blocks, a vector of blocks, an unknown type, truncated data,
/// a NaN or infinite scale of any type) or against the model (blocks for the embedding).
#[test]
fn every_block_corruption_is_refused_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let (record, blocks, record_bytes) = block_model(dir.path());
    let good = write_with(&record, record_bytes, &stored(&blocks)).unwrap();
    let check = |bytes: &[u8]| -> Result<(), String> {
        let path = dir.path().join("weights.bin");
        std::fs::write(&path, bytes).unwrap();
        let file = WeightsFile::open(&path)?;
        let declared = params(&block_config().init::<B>(&Default::default()));
        check_laid_out(&file, &declared, false)?;
        file.check_record(record_bytes, SHA256)
    };
    assert_eq!(check(&good), Ok(()));
    let index: Value = {
        let len = u64::from_le_bytes(good[16..24].try_into().unwrap()) as usize;
        serde_json::from_slice(&good[HEADER..HEADER + len]).unwrap()
    };
    let data_start = {
        let len = u64::from_le_bytes(good[16..24].try_into().unwrap()) as usize;
        (HEADER + len).next_multiple_of(ALIGN)
    };
    let position = |path: &str| {
        (index["tensors"].as_array().unwrap().iter())
            .position(|t| t["path"] == path)
            .unwrap()
    };
    let offset = |path: &str| {
        data_start + index["tensors"][position(path)]["offset"].as_u64().unwrap() as usize
    };
    let edit_entry = |path: &'static str, edit: fn(&mut Value)| {
        with_index(&good, move |i| edit(&mut i["tensors"][position(path)]))
    };
    let with_bytes = |at: usize, bytes: &[u8]| {
        let mut out = good.clone();
        out[at..at + bytes.len()].copy_from_slice(bytes);
        out
    };
    let nan = f16::NAN.to_le_bytes();
    let infinite = f16::INFINITY.to_le_bytes();
    let q = "layers.0.self_attn.q_proj.weight";
    // The embedding re-typed as Q8_0 over zeros (finite scales).
    let mut embedding_as_blocks = edit_entry("embed_tokens.weight", |t| {
        t["dtype"] = json!("q8_0");
        t["bytes"] = json!(40 * 8 * 34);
    });
    let embedding_data = offset("embed_tokens.weight");
    embedding_as_blocks[embedding_data..embedding_data + 40 * 8 * 34].fill(0);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "layers.0.self_attn.q_proj.weight holds 69598 bytes, its shape [256, 256] of q8_0 needs 69632",
            edit_entry(q, |t| t["bytes"] = json!(69598)),
        ),
        (
            "layers.0.self_attn.o_proj.weight is stored as q4_k, blocks of 256 values, in rows of 128 values: not a whole number of blocks",
            edit_entry("layers.0.self_attn.o_proj.weight", |t| {
                t["shape"] = json!([512, 128])
            }),
        ),
        (
            "norm.gamma is a vector stored as q8_0",
            edit_entry("norm.gamma", |t| t["dtype"] = json!("q8_0")),
        ),
        (
            "its index is not valid: layers.0.self_attn.q_proj.weight has dtype \"q9_9\", which this runtime does not read",
            edit_entry(q, |t| t["dtype"] = json!("q9_9")),
        ),
        (
            "truncated: lm_head.weight ends past the file",
            good[..good.len() - 100].to_vec(),
        ),
        (
            "layers.0.self_attn.q_proj.weight: Q8_0 block 0 of row 0 has a NaN or infinite scale",
            with_bytes(offset(q), &nan),
        ),
        (
            "layers.0.self_attn.k_proj.weight: Q4_0 block 7 of row 100 has a NaN or infinite scale",
            with_bytes(
                offset("layers.0.self_attn.k_proj.weight") + (100 * 8 + 7) * 18,
                &infinite,
            ),
        ),
        (
            "layers.0.self_attn.v_proj.weight: Q5_0 block 2 of row 127 has a NaN or infinite scale",
            with_bytes(
                offset("layers.0.self_attn.v_proj.weight") + (127 * 8 + 2) * 22,
                &nan,
            ),
        ),
        (
            "layers.0.mlp.down_proj.weight: Q4_K block 1 of row 2 has a NaN or infinite scale",
            // dmin, the second scale
            with_bytes(
                offset("layers.0.mlp.down_proj.weight") + (2 * 2 + 1) * 144 + 2,
                &nan,
            ),
        ),
        (
            "layers.0.mlp.gate_proj.weight: Q6_K block 0 of row 5 has a NaN or infinite scale",
            with_bytes(
                offset("layers.0.mlp.gate_proj.weight") + 5 * 210 + 208,
                &infinite,
            ),
        ),
    ];
    for (expected, bytes) in cases {
        let error = check(&bytes).unwrap_err();
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
    // A file with blocks is version 2; the same bytes claiming version 1 are refused.
    assert_eq!(good[8..12], 2u32.to_le_bytes());
    let mut as_version_1 = good.clone();
    as_version_1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let error = check(&as_version_1).unwrap_err();
    assert!(
        error.contains("blocks, which a version 1 file cannot hold"),
        "{error:?}"
    );
    // A matrix may be stored as blocks, the embedding too (a quantized GGUF's token_embd,
    // which a tied lm_head multiplies by): the model's check accepts it.
    assert_eq!(check(&embedding_as_blocks), Ok(()));
}

/// Writes fuzz/seeds/weights/blocks.bin: the fuzz target's block model (one layer, inputs
/// of 32: the 32-value types, Q8_0, Q4_0, Q5_0), small enough for its 64 KiB inputs. A
/// generator, not a check: run by hand when the format changes.
#[test]
#[ignore = "writes a fuzz seed; run by hand"]
fn write_the_fuzz_seed() {
    let config = LlamaConfig::plain([32, 32, 1], [2, 1, 16], 10, 16);
    let type_of = |path: &str| match path.rsplit('.').nth(1) {
        Some("k_proj" | "gate_proj") => BlockType::Q4_0,
        Some("v_proj" | "down_proj") => BlockType::Q5_0,
        _ => BlockType::Q8_0,
    };
    let dir = tempfile::tempdir().unwrap();
    let (record, blocks, record_bytes) = block_model_of(dir.path(), &config, type_of);
    let id = RecordId {
        bytes: record_bytes,
        sha256: SHA256.into(),
    };
    let declared = params(&config.init::<B>(&Default::default()));
    let mut bytes = Vec::new();
    write(&record, id, &declared, false, &stored(&blocks), &mut bytes).unwrap();
    assert!(bytes.len() <= 64 << 10, "{} bytes", bytes.len());
    let seed = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/seeds/weights/blocks.bin"
    );
    std::fs::write(seed, bytes).unwrap();
}
