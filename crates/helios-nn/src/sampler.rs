//! Batches of (inputs, targets) drawn from `Tokens`, reproducibly.
//!
//! A training batch is a pure function of (seed, step): row b of step s starts at an offset
//! drawn by a counter-based generator (SplitMix64 of seed, step and b), so there is no
//! generator state to save. `SamplerState` (seed, step, and what the batches were cut from)
//! is all a checkpoint needs, and a resumed run draws exactly the batches an uninterrupted
//! one would have. Windows are uniform over the split, as in nanoGPT; evaluation walks the
//! split in order instead (`EvalBatches`), so every validation loss sees the same tokens.

use serde::{Deserialize, Serialize};

use crate::data::Tokens;
use crate::{Error, Result};

/// One batch: B rows of T tokens, and the same rows shifted by one token as targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Token ids, row-major (B, T).
    pub inputs: Vec<u32>,
    /// The next token after each input, row-major (B, T).
    pub targets: Vec<u32>,
    /// Rows (B).
    pub batch: usize,
    /// Tokens per row (T).
    pub seq_len: usize,
}

/// Everything that decides the batches still to come; save it with the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    pub seed: u64,
    /// Batches drawn so far; the next batch is batch `step`.
    pub step: u64,
    /// B.
    pub batch: usize,
    /// T.
    pub seq_len: usize,
    /// Tokens in the split sampled from, and their fingerprint: a resume on other data fails.
    pub data_tokens: usize,
    pub data_fingerprint: u64,
}

/// Draws training batches: `next_batch` is batch `step` of the sequence fixed by `seed`.
#[derive(Clone, Debug)]
pub struct BatchSampler {
    data: Tokens,
    state: SamplerState,
    /// Data parallel: this rank's rows of every batch (see `shard`).
    shard: Shard,
}

/// Rank `rank` of `ranks` takes the `rank`-th equal slice of a batch's rows: the ranks
/// together see exactly the batch one process would, so N ranks with B rows each train the
/// model one process trains with N·B.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub ranks: usize,
}

impl Shard {
    /// The whole batch.
    pub const WHOLE: Shard = Shard { rank: 0, ranks: 1 };

    /// This rank's rows of a batch of `batch`, which the ranks must divide.
    fn rows(self, batch: usize) -> Result<std::ops::Range<usize>> {
        if self.ranks == 0 || self.rank >= self.ranks || batch % self.ranks != 0 {
            return Err(Error::Data(format!(
                "a batch of {batch} rows cannot be split evenly over {} ranks",
                self.ranks
            )));
        }
        let per = batch / self.ranks;
        Ok(self.rank * per..(self.rank + 1) * per)
    }
}

/// Tokens a batch of B×T needs: the last target is one past the last input.
fn tokens_needed(batch: usize, seq_len: usize) -> usize {
    batch.saturating_mul(seq_len).saturating_add(1)
}

fn check_size(data: &Tokens, split: &'static str, batch: usize, seq_len: usize) -> Result<()> {
    if batch == 0 || seq_len == 0 {
        return Err(Error::Data(format!(
            "batch size ({batch}) and sequence length ({seq_len}) must both be at least 1"
        )));
    }
    let need = tokens_needed(batch, seq_len);
    if data.len() < need {
        return Err(Error::TooFewTokens {
            split,
            have: data.len(),
            need,
            batch,
            seq: seq_len,
        });
    }
    Ok(())
}

impl BatchSampler {
    /// A sampler at step 0. `data` must hold at least B×T+1 tokens.
    pub fn new(data: Tokens, batch: usize, seq_len: usize, seed: u64) -> Result<BatchSampler> {
        check_size(&data, "training", batch, seq_len)?;
        let state = SamplerState {
            seed,
            step: 0,
            batch,
            seq_len,
            data_tokens: data.len(),
            data_fingerprint: data.fingerprint(),
        };
        Ok(BatchSampler {
            data,
            state,
            shard: Shard::WHOLE,
        })
    }

    /// A sampler continuing from `state`, on the same data it was saved with.
    pub fn resume(data: Tokens, state: SamplerState) -> Result<BatchSampler> {
        check_size(&data, "training", state.batch, state.seq_len)?;
        let fingerprint = data.fingerprint();
        if data.len() != state.data_tokens || fingerprint != state.data_fingerprint {
            return Err(Error::SamplerMismatch {
                saved: format!(
                    "{} training tokens (fingerprint {:016x})",
                    state.data_tokens, state.data_fingerprint
                ),
                now: format!("{} (fingerprint {fingerprint:016x})", data.len()),
            });
        }
        Ok(BatchSampler {
            data,
            state,
            shard: Shard::WHOLE,
        })
    }

    /// Like `resume`, but also insists on this run's batch size and sequence length.
    pub fn resume_checked(
        data: Tokens,
        state: SamplerState,
        batch: usize,
        seq_len: usize,
    ) -> Result<BatchSampler> {
        if (state.batch, state.seq_len) != (batch, seq_len) {
            return Err(Error::SamplerMismatch {
                saved: format!("batches of {}x{}", state.batch, state.seq_len),
                now: format!("{batch}x{seq_len}"),
            });
        }
        BatchSampler::resume(data, state)
    }

    /// This sampler drawing only `shard`'s rows of each batch (the state, and so a
    /// checkpoint, still describes the whole batch).
    pub fn shard(mut self, shard: Shard) -> Result<BatchSampler> {
        shard.rows(self.state.batch)?;
        self.shard = shard;
        Ok(self)
    }

    /// The state to save: the next `next_batch` after a resume from it is the one this
    /// sampler would draw next.
    pub fn state(&self) -> SamplerState {
        self.state
    }

    /// The next batch; advances the step.
    pub fn next_batch(&mut self) -> Batch {
        let b = self.batch_at(self.state.step);
        self.state.step += 1;
        b
    }

    /// Batch `step` of this seed's sequence, without moving.
    pub fn batch_at(&self, step: u64) -> Batch {
        let SamplerState {
            seed,
            batch,
            seq_len,
            ..
        } = self.state;
        // Start offsets in [0, len - (T+1)]: a window of T+1 tokens always fits.
        let starts = (self.data.len() - seq_len) as u64;
        let mut window = vec![0u32; seq_len + 1];
        let rows = self.shard.rows(batch).expect("checked by `shard`");
        let mut out = Batch {
            inputs: Vec::with_capacity(rows.len() * seq_len),
            targets: Vec::with_capacity(rows.len() * seq_len),
            batch: rows.len(),
            seq_len,
        };
        for row in rows {
            let r = mix(mix(mix(seed) ^ step) ^ row as u64);
            let start = ((r as u128 * starts as u128) >> 64) as usize;
            self.data.read_into(start, &mut window);
            out.inputs.extend_from_slice(&window[..seq_len]);
            out.targets.extend_from_slice(&window[1..]);
        }
        out
    }
}

/// SplitMix64's finalizer: a bijective mix of 64 bits (Steele et al., 2014).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The batches that cover a split in order, each row a fresh window (tokens [k·T, k·T+T]),
/// for validation loss. The tail that does not fill a whole batch is left out.
#[derive(Clone, Debug)]
pub struct EvalBatches {
    data: Tokens,
    batch: usize,
    seq_len: usize,
    next: usize,
    count: usize,
    shard: Shard,
}

impl EvalBatches {
    /// Every whole batch of `data`; it must hold at least one (B×T+1 tokens).
    pub fn new(data: Tokens, batch: usize, seq_len: usize) -> Result<EvalBatches> {
        check_size(&data, "validation", batch, seq_len)?;
        let count = (data.len() - 1) / (batch * seq_len);
        Ok(EvalBatches {
            data,
            batch,
            seq_len,
            next: 0,
            count,
            shard: Shard::WHOLE,
        })
    }

    /// Only `shard`'s rows of each batch.
    pub fn shard(mut self, shard: Shard) -> Result<EvalBatches> {
        shard.rows(self.batch)?;
        self.shard = shard;
        Ok(self)
    }

    /// At most `max` batches (the first ones).
    pub fn take_at_most(mut self, max: usize) -> EvalBatches {
        self.count = self.count.min(max);
        self
    }

    /// Batches in all.
    pub fn num_batches(&self) -> usize {
        self.count
    }
}

impl Iterator for EvalBatches {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        if self.next >= self.count {
            return None;
        }
        let (b, t) = (self.batch, self.seq_len);
        let mut window = vec![0u32; t + 1];
        let rows = self.shard.rows(b).expect("checked by `shard`");
        let mut out = Batch {
            inputs: Vec::with_capacity(rows.len() * t),
            targets: Vec::with_capacity(rows.len() * t),
            batch: rows.len(),
            seq_len: t,
        };
        for row in rows {
            self.data.read_into((self.next * b + row) * t, &mut window);
            out.inputs.extend_from_slice(&window[..t]);
            out.targets.extend_from_slice(&window[1..]);
        }
        self.next += 1;
        Some(out)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.count - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for EvalBatches {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_together_are_the_whole_batch() {
        let ids: Vec<u32> = (0..5000).map(|i| (i * 7919 % 50257) as u32).collect();
        let data = Tokens::from_ids(&ids, "shard-test").unwrap();
        let whole = BatchSampler::new(data.clone(), 6, 16, 42).unwrap();
        let shards: Vec<_> = (0..3)
            .map(|rank| {
                let s = BatchSampler::new(data.clone(), 6, 16, 42).unwrap();
                s.shard(Shard { rank, ranks: 3 }).unwrap()
            })
            .collect();
        for step in [0, 1, 17] {
            let all = whole.batch_at(step);
            let parts: Vec<Batch> = shards.iter().map(|s| s.batch_at(step)).collect();
            assert!(parts.iter().all(|p| p.batch == 2));
            let inputs: Vec<u32> = parts.iter().flat_map(|p| p.inputs.clone()).collect();
            let targets: Vec<u32> = parts.iter().flat_map(|p| p.targets.clone()).collect();
            assert_eq!((inputs, targets), (all.inputs, all.targets));
        }
        // The state (what a checkpoint saves) still describes the whole batch.
        assert_eq!(shards[1].state(), whole.state());
        let eval = |shard| {
            EvalBatches::new(data.clone(), 4, 8)
                .unwrap()
                .take_at_most(3)
                .shard(shard)
                .unwrap()
                .flat_map(|b| b.inputs)
                .collect::<Vec<_>>()
        };
        let halves = [
            eval(Shard { rank: 0, ranks: 2 }),
            eval(Shard { rank: 1, ranks: 2 }),
        ];
        let whole_eval = eval(Shard::WHOLE);
        // Batch by batch: rank 0's 2 rows, then rank 1's.
        let interleaved: Vec<u32> = (0..3)
            .flat_map(|b| [&halves[0], &halves[1]].map(|h| h[b * 16..(b + 1) * 16].to_vec()))
            .flatten()
            .collect();
        assert_eq!(interleaved, whole_eval);
        let e = BatchSampler::new(data, 6, 16, 1)
            .unwrap()
            .shard(Shard { rank: 0, ranks: 4 })
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be split evenly over 4 ranks"), "{e}");
    }
}
