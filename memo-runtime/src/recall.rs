//! The synthetic long-range task: recall a key seen far back in the sequence, and the evaluation
//! that measures, per key-to-query distance, how often the model's prediction is that key.
//!
//! A sequence of `s` tokens is a fixed 16-byte filler cycle (token `FILLER + i % 16` at position
//! `i`) with two insertions: `KEY_MARK, key` ending `d` tokens before the last position, and
//! `QUERY_MARK` at the last position, whose next-token target is the key. The key is one of
//! [`RECALL_KEYS`] tokens drawn per sequence, distinct from the filler and the marks, and nothing
//! else in the sequence depends on it: the only way to answer above chance is to attend `d`
//! tokens back. Training draws `d` uniformly from `[1, s - 2]` per sequence, so short distances
//! teach the retrieval and long ones use it; the evaluation scores fresh sequences per distance
//! bucket, and a control with the key removed, where no model can beat chance.

use memo_plan_core::generate::SplitMix64;

use crate::backend::Backend;
use crate::interpret::RuntimeError;
use crate::trainer::Trainer;

/// How many different keys the task draws from: chance accuracy is `1 / RECALL_KEYS`.
pub const RECALL_KEYS: u32 = 4;
/// The token before the key.
pub const KEY_MARK: u32 = 1;
/// The first key token; the keys are `FIRST_KEY..FIRST_KEY + RECALL_KEYS`.
pub const FIRST_KEY: u32 = 2;
/// The last token of every sequence: its target is the key.
pub const QUERY_MARK: u32 = 6;
/// The first filler token; the filler cycles through `FILLER..FILLER + FILLER_CYCLE`.
pub const FILLER: u32 = 16;
/// The filler's period.
pub const FILLER_CYCLE: u32 = 16;
/// The shortest sequence that holds a mark, a key and a query.
pub const MIN_RECALL_SEQ_LEN: usize = 3;

/// Salts the evaluation's generator so that its sequences are drawn apart from training's.
const EVALUATION_SALT: u64 = 0x5EED_0F_E7A1_0A7E;

/// One sequence of the task, with what the evaluation needs to score it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallSequence {
    /// The tokens.
    pub tokens: Vec<u32>,
    /// Next-token targets: the tokens shifted by one, and the key after the query.
    pub targets: Vec<u32>,
    /// The key token (the last target).
    pub key: u32,
    /// Positions from the key to the query, or `None` when the key was removed (the control).
    pub distance: Option<usize>,
}

impl RecallSequence {
    /// `seq_len` tokens recalling key number `key_index` (`< RECALL_KEYS`) from `distance`
    /// positions back (`1..=seq_len - 2`); `None` builds the control: the same filler and query,
    /// the mark and the key replaced by filler, the target still the key.
    pub fn new(seq_len: usize, key_index: u32, distance: Option<usize>) -> Result<Self, String> {
        if seq_len < MIN_RECALL_SEQ_LEN {
            return Err(format!(
                "a recall sequence of {seq_len} tokens: it needs at least {MIN_RECALL_SEQ_LEN} (mark, key, query)"
            ));
        }
        if key_index >= RECALL_KEYS {
            return Err(format!("key number {key_index}: the task has {RECALL_KEYS} keys"));
        }
        let query = seq_len - 1;
        if let Some(d) = distance {
            if d == 0 || d > seq_len - 2 {
                return Err(format!(
                    "a key {d} positions before the query of a {seq_len}-token sequence: use 1..={}",
                    seq_len - 2
                ));
            }
        }
        let key = FIRST_KEY + key_index;
        let key_position = distance.map(|d| query - d);
        let tokens: Vec<u32> = (0..seq_len)
            .map(|i| match key_position {
                _ if i == query => QUERY_MARK,
                Some(k) if i == k => key,
                Some(k) if i + 1 == k => KEY_MARK,
                _ => FILLER + (i as u32 % FILLER_CYCLE),
            })
            .collect();
        let targets = tokens.iter().skip(1).copied().chain([key]).collect();
        Ok(RecallSequence { tokens, targets, key, distance })
    }
}

/// The training stream: sequences with a fresh key and distance each, resumable by count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallTask {
    seed: u64,
    /// Sequences produced so far (the resumable position).
    produced: u64,
}

impl RecallTask {
    /// The task's sequences for `seed`, from the first.
    pub fn new(seed: u64) -> Self {
        RecallTask { seed, produced: 0 }
    }

    /// Sequences produced so far (saved in checkpoints).
    pub fn position(&self) -> u64 {
        self.produced
    }

    /// Resumes after `position` sequences.
    pub fn seek(&mut self, position: u64) {
        self.produced = position;
    }

    /// The next `sequences` sequences of `seq_len` tokens and their targets. Sequence `n` depends
    /// on the seed and `n` alone: its key uniform over the keys, its distance uniform over
    /// `[1, seq_len - 2]`. Below [`MIN_RECALL_SEQ_LEN`] tokens no key fits: the sequences are
    /// filler and a query (`memo train` refuses such lengths before asking).
    pub fn next_batch(&mut self, sequences: usize, seq_len: usize) -> (Vec<u32>, Vec<u32>) {
        let mut tokens = Vec::with_capacity(sequences * seq_len);
        let mut targets = Vec::with_capacity(sequences * seq_len);
        for _ in 0..sequences {
            let mut rng = SplitMix64::new(self.seed ^ self.produced.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let key_index = rng.below(u64::from(RECALL_KEYS)) as u32;
            let distance = 1 + rng.below(seq_len.saturating_sub(2) as u64) as usize;
            match RecallSequence::new(seq_len, key_index, Some(distance)) {
                Ok(sequence) => {
                    tokens.extend(sequence.tokens);
                    targets.extend(sequence.targets);
                }
                Err(_) => {
                    let filler = (0..seq_len).map(|i| if i + 1 == seq_len { QUERY_MARK } else { FILLER });
                    tokens.extend(filler.clone());
                    targets.extend(filler.skip(1).chain([FIRST_KEY + key_index]));
                }
            }
            self.produced += 1;
        }
        (tokens, targets)
    }
}

/// The distance buckets the evaluation reports for sequences of `seq_len` tokens, as inclusive
/// ranges: up to `s/16`, `s/4`, `3s/4` and `s - 2` (at `s = 256`: 1-16, 17-64, 65-192, 193-254),
/// empty ones left out.
pub fn distance_buckets(seq_len: usize) -> Vec<(usize, usize)> {
    let longest = seq_len.saturating_sub(2);
    let mut buckets = Vec::new();
    let mut low = 1;
    for edge in [seq_len / 16, seq_len / 4, seq_len * 3 / 4, longest] {
        let high = edge.min(longest);
        if high >= low {
            buckets.push((low, high));
            low = high + 1;
        }
    }
    buckets
}

/// The held-out evaluation set: `per_bucket` sequences per distance bucket (distance uniform in
/// the bucket, key uniform), then the control: `per_bucket` sequences with the key removed. Drawn
/// from `seed` through a salted generator, apart from the training stream.
pub fn evaluation_set(seed: u64, seq_len: usize, per_bucket: usize) -> Result<Vec<RecallSequence>, String> {
    let mut rng = SplitMix64::new(seed ^ EVALUATION_SALT);
    let mut set = Vec::new();
    let buckets = distance_buckets(seq_len);
    for &(low, high) in buckets.iter() {
        for _ in 0..per_bucket {
            let key_index = rng.below(u64::from(RECALL_KEYS)) as u32;
            let distance = low + rng.below((high - low + 1) as u64) as usize;
            set.push(RecallSequence::new(seq_len, key_index, Some(distance))?);
        }
    }
    for _ in 0..per_bucket {
        let key_index = rng.below(u64::from(RECALL_KEYS)) as u32;
        set.push(RecallSequence::new(seq_len, key_index, None)?);
    }
    Ok(set)
}

/// How one query was answered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueryScore {
    /// 1 when the key's logit is the largest of the [`RECALL_KEYS`] keys' logits, `1 / k` when it
    /// ties with `k - 1` others for the largest (the expected score of a random tie-break), else 0.
    pub key_credit: f64,
    /// The same over the whole vocabulary.
    pub vocab_credit: f64,
    /// The natural log of the key's probability under the softmax over the whole vocabulary.
    pub log_probability: f64,
}

/// Scores the logits of a query row (one per vocabulary token) against `key`. A NaN logit
/// never wins; a missing key scores 0 and a NaN log-probability.
pub fn score_query(logits: &[f32], key: u32) -> QueryScore {
    let credit = |candidates: &[f32]| -> f64 {
        let Some(&mine) = logits.get(key as usize) else { return 0.0 };
        let best = candidates.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if mine.is_nan() || mine < best {
            return 0.0;
        }
        1.0 / candidates.iter().filter(|&&v| v == best).count().max(1) as f64
    };
    let keys = logits.get(FIRST_KEY as usize..(FIRST_KEY + RECALL_KEYS) as usize).unwrap_or(&[]);
    let log_probability = match logits.get(key as usize) {
        Some(&mine) => {
            let best = logits.iter().map(|&v| f64::from(v)).fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = logits.iter().map(|&v| (f64::from(v) - best).exp()).sum();
            f64::from(mine) - best - sum.ln()
        }
        None => f64::NAN,
    };
    QueryScore { key_credit: credit(keys), vocab_credit: credit(logits), log_probability }
}

/// The evaluation of one group of sequences: a distance bucket, or the control.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketScore {
    /// The bucket's distances (inclusive), or `None` for the control (key removed).
    pub distances: Option<(usize, usize)>,
    /// Sequences scored.
    pub sequences: usize,
    /// Mean key credit: the accuracy of the argmax over the keys (chance `1 / RECALL_KEYS`).
    pub key_accuracy: f64,
    /// Mean vocabulary credit: the accuracy of the argmax over the whole vocabulary.
    pub vocab_accuracy: f64,
    /// Mean cross-entropy of the answer, nats (chance over the keys alone: `ln RECALL_KEYS`).
    pub answer_loss: f64,
    /// Mean probability of the key.
    pub answer_probability: f64,
}

impl BucketScore {
    fn empty(distances: Option<(usize, usize)>) -> Self {
        BucketScore {
            distances,
            sequences: 0,
            key_accuracy: 0.0,
            vocab_accuracy: 0.0,
            answer_loss: 0.0,
            answer_probability: 0.0,
        }
    }

    /// Adds a query's score (the means are finished by [`BucketScore::finish`]).
    fn add(&mut self, score: QueryScore) {
        self.sequences += 1;
        self.key_accuracy += score.key_credit;
        self.vocab_accuracy += score.vocab_credit;
        self.answer_loss -= score.log_probability;
        self.answer_probability += score.log_probability.exp();
    }

    fn finish(mut self) -> Self {
        let n = self.sequences.max(1) as f64;
        self.key_accuracy /= n;
        self.vocab_accuracy /= n;
        self.answer_loss /= n;
        self.answer_probability /= n;
        self
    }
}

/// The evaluation: per distance bucket, then the control.
#[derive(Clone, Debug, PartialEq)]
pub struct RecallEvaluation {
    /// One score per distance bucket, shortest first.
    pub buckets: Vec<BucketScore>,
    /// The control: the same queries with the key removed.
    pub key_removed: BucketScore,
}

/// Scores `set` from the logits of its query rows: `query_logits[i]` is sequence `i`'s.
pub fn score_set(set: &[RecallSequence], query_logits: &[Vec<f32>]) -> RecallEvaluation {
    let seq_len = set.first().map_or(0, |s| s.tokens.len());
    let mut buckets: Vec<BucketScore> =
        distance_buckets(seq_len).into_iter().map(|b| BucketScore::empty(Some(b))).collect();
    let mut key_removed = BucketScore::empty(None);
    for (sequence, logits) in set.iter().zip(query_logits) {
        let score = score_query(logits, sequence.key);
        match sequence.distance {
            None => key_removed.add(score),
            Some(d) => {
                if let Some(bucket) =
                    buckets.iter_mut().find(|b| b.distances.is_some_and(|(low, high)| (low..=high).contains(&d)))
                {
                    bucket.add(score);
                }
            }
        }
    }
    RecallEvaluation {
        buckets: buckets.into_iter().filter(|b| b.sequences > 0).map(BucketScore::finish).collect(),
        key_removed: key_removed.finish(),
    }
}

/// Evaluates `trainer` on the held-out set of `per_bucket` sequences per bucket (see
/// [`evaluation_set`]): the logits of each query row, read by a forward-only replay
/// ([`Trainer::logits`]), so the model is left as it was. Sequences go `micro_batch` at a time;
/// the last batch is padded with repeats that are not scored.
pub fn evaluate<B: Backend>(
    trainer: &mut Trainer<B>,
    seed: u64,
    per_bucket: usize,
) -> Result<RecallEvaluation, RuntimeError> {
    let model = &trainer.report().plan.provenance.model;
    let (seq_len, micro_batch) = (model.seq_len as usize, model.micro_batch.max(1) as usize);
    let vocab = model.vocab as usize;
    let set = evaluation_set(seed, seq_len, per_bucket).map_err(RuntimeError::Trainer)?;
    let mut query_logits = Vec::with_capacity(set.len());
    for batch in set.chunks(micro_batch) {
        let mut tokens = Vec::with_capacity(micro_batch * seq_len);
        for i in 0..micro_batch {
            tokens.extend_from_slice(&batch[i.min(batch.len() - 1)].tokens);
        }
        let logits = trainer.logits(&tokens)?;
        for i in 0..batch.len() {
            let row = i * seq_len + seq_len - 1;
            let row_logits = logits.get(row * vocab..(row + 1) * vocab).ok_or_else(|| {
                RuntimeError::Trainer(format!("the logits hold {} values, fewer than row {row} needs", logits.len()))
            })?;
            query_logits.push(row_logits.to_vec());
        }
    }
    Ok(score_set(&set, &query_logits))
}
