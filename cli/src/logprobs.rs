//! Every position's log-probabilities over a text, saved to compare two runs of it, as
//! llama.cpp's `llama-perplexity --kl-divergence-base` does: the mean KL divergence of one
//! run from the other says how far a rounding (int8 products, quantized weights) moves the
//! whole distribution, where perplexity sees only the probability of the right token.
//!
//! The file, little-endian: `LOGPROBS`, the number of positions `n` and the vocabulary size
//! (u32 each), the `n` token ids (u32), then `n` rows of log-probabilities (f32, the
//! log-softmax of each position's logits). scripts/llamacpp_logprobs.py writes the same
//! from llama.cpp for the ids of a file written here.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use runtime::generate::sampling::log_partition;

const MAGIC: &[u8; 8] = b"LOGPROBS";

/// A text's ids and each position's log-probabilities, `vocab` per row.
pub struct Logprobs {
    pub ids: Vec<u32>,
    pub vocab: usize,
    pub rows: Vec<f32>,
}

impl Logprobs {
    pub fn new(ids: &[u32], vocab: usize) -> Self {
        Self {
            ids: ids.to_vec(),
            vocab,
            rows: Vec::with_capacity(ids.len() * vocab),
        }
    }

    /// Appends the next position's log-probabilities, from its logits.
    pub fn push(&mut self, logits: &[f32]) {
        let norm = log_partition(logits);
        (self.rows).extend(logits.iter().map(|&l| (l as f64 - norm) as f32));
    }

    fn row(&self, position: usize) -> &[f32] {
        &self.rows[position * self.vocab..][..self.vocab]
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let positions = self.rows.len() / self.vocab;
        let mut out = BufWriter::new(std::fs::File::create(path)?);
        out.write_all(MAGIC)?;
        for n in [positions, self.vocab] {
            out.write_all(&(n as u32).to_le_bytes())?;
        }
        for &id in &self.ids[..positions] {
            out.write_all(&id.to_le_bytes())?;
        }
        for &p in &self.rows {
            out.write_all(&p.to_le_bytes())?;
        }
        out.flush()?;
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Self> {
        let context = || format!("reading log-probabilities from {}", path.display());
        let mut file = BufReader::new(std::fs::File::open(path).with_context(context)?);
        let mut magic = [0u8; 8];
        file.read_exact(&mut magic).with_context(context)?;
        ensure!(
            &magic == MAGIC,
            "{} is not a log-probabilities file",
            path.display()
        );
        let mut word = || -> Result<u32> {
            let mut bytes = [0u8; 4];
            file.read_exact(&mut bytes).with_context(context)?;
            Ok(u32::from_le_bytes(bytes))
        };
        let (positions, vocab) = (word()? as usize, word()? as usize);
        let ids = (0..positions).map(|_| word()).collect::<Result<Vec<_>>>()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).with_context(context)?;
        ensure!(
            bytes.len() == positions * vocab * 4,
            "{} holds {} bytes of rows, not {positions} x {vocab} values",
            path.display(),
            bytes.len()
        );
        let rows = (bytes.chunks_exact(4))
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Self { ids, vocab, rows })
    }
}

/// How one run's distributions differ from a base run's over the same ids.
#[derive(Debug, serde::Serialize)]
pub struct Divergence {
    /// Mean over positions of KL(base || ours), in nats.
    pub mean_kl: f64,
    /// The largest of them.
    pub max_kl: f64,
    /// Share of positions whose most likely token is the same in both.
    pub same_top: f64,
}

pub fn divergence(base: &Logprobs, ours: &Logprobs) -> Result<Divergence> {
    let positions = ours.rows.len() / ours.vocab;
    ensure!(positions > 0, "no positions to compare");
    if base.vocab != ours.vocab || base.ids.get(..positions) != ours.ids.get(..positions) {
        bail!("the base log-probabilities are of other ids or another vocabulary");
    }
    let (mut total, mut max_kl, mut same) = (0.0f64, 0.0f64, 0usize);
    let top = |row: &[f32]| (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b]));
    for position in 0..positions {
        let (p, q) = (base.row(position), ours.row(position));
        let kl: f64 = (p.iter().zip(q))
            .map(|(&p, &q)| (p as f64).exp() * (p as f64 - q as f64))
            .sum();
        total += kl;
        max_kl = max_kl.max(kl);
        same += usize::from(top(p) == top(q));
    }
    Ok(Divergence {
        mean_kl: total / positions as f64,
        max_kl,
        same_top: same as f64 / positions as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_zero_from_itself_and_the_file_round_trips() {
        let mut ours = Logprobs::new(&[5, 6, 7], 3);
        for logits in [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [-1.0, 5.0, 2.0]] {
            ours.push(&logits);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lp.bin");
        ours.save(&path).unwrap();
        let base = Logprobs::load(&path).unwrap();
        let d = divergence(&base, &ours).unwrap();
        assert_eq!((d.mean_kl, d.same_top), (0.0, 1.0));

        let mut other = Logprobs::new(&[5, 6, 7], 3);
        for logits in [[1.0, 2.0, 3.0], [1.0, 0.0, 0.0], [-1.0, 5.0, 2.0]] {
            other.push(&logits);
        }
        let d = divergence(&base, &other).unwrap();
        // Uniform against softmax(1, 0, 0), at one position of three, whose top token moved
        // (a tie takes the last).
        let e = std::f64::consts::E;
        let q = [e / (2.0 + e), 1.0 / (2.0 + e), 1.0 / (2.0 + e)];
        let kl: f64 = q
            .iter()
            .map(|q| (1.0f64 / 3.0) * ((1.0 / 3.0) / q).ln())
            .sum();
        assert!((d.mean_kl - kl / 3.0).abs() < 1e-6, "{d:?}");
        assert!((d.same_top - 2.0 / 3.0).abs() < 1e-12);
        let mut other_ids = Logprobs::new(&[5, 9, 7], 3);
        (0..3).for_each(|_| other_ids.push(&[0.0, 0.0, 0.0]));
        assert!(divergence(&base, &other_ids).is_err());
    }
}
