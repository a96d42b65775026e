//! What a manifest records of files: sha256 digests, and the tokenizer probe.

use std::io::{BufWriter, Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use runtime::text::tokenizer::{Tokenizer, TokenizerError};
use runtime::util::files::open_regular;
use runtime::weights::manifest::{FileDigest, Probe};
use sha2::{Digest, Sha256};

/// The text of the manifest's tokenizer probe: it touches the tricky parts (digits split
/// one by one, CJK, emoji, code, a special token).
pub const PROBE_TEXT: &str =
    "Hello, world! 12345 日本語 🦀 fn main() { println!(\"hi\"); } <|im_start|>user";

/// Tokenizes `text` exactly as the runtime encodes a prompt.
pub fn probe(tokenizer: &Tokenizer, text: &str) -> Result<Probe, TokenizerError> {
    Ok(Probe {
        text: text.to_string(),
        token_ids: tokenizer.encode(text)?,
    })
}

/// sha256 (lower-case hex) and size of a file, read in 1 MiB chunks.
pub fn digest_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut file = open_regular(path).map_err(std::io::Error::other)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((hex(&hasher.finalize()), bytes))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 and size of each named file in `dir`, sorted by name.
pub fn digests(dir: &Path, names: impl Iterator<Item = String>) -> Result<Vec<FileDigest>> {
    let mut names: Vec<String> = names.collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let path = dir.join(&name);
            let (sha256, bytes) =
                digest_file(&path).with_context(|| format!("cannot read {}", path.display()))?;
            Ok(FileDigest {
                name,
                sha256,
                bytes,
            })
        })
        .collect()
}

/// sha256 and size of the bytes `write` writes, as [`digest_file`] gives them for a file
/// holding them: a file's digest without the file (a GGUF's checkpoint, converted in one
/// step, is never written).
pub fn digest_written(
    name: &str,
    write: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<FileDigest> {
    let mut out = Hashing {
        hasher: Sha256::new(),
        bytes: 0,
    };
    // Buffered as a file's writes are: sha256 takes large slices fastest.
    let mut buffered = BufWriter::with_capacity(1 << 20, &mut out);
    write(&mut buffered)?;
    buffered.flush()?;
    drop(buffered);
    Ok(FileDigest {
        name: name.to_string(),
        sha256: hex(&out.hasher.finalize()),
        bytes: out.bytes,
    })
}

/// A writer that only hashes and counts.
struct Hashing {
    hasher: Sha256,
    bytes: u64,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.hasher.update(buf);
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
